"""The last next-edit prediction per account and file, for the keystrokes that type it."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from serve_app.prompts.next_edit import EditPrompt, region_without_cursor
from serve_app.prompts.next_edit.following import typed_toward

# Files remembered per replica, and the longest region and answer remembered (characters): an
# editor's region is a few lines, and a stranger's megabyte regions must not pile up here.
PREDICTIONS_KEPT = 1024
MAX_REMEMBERED_CHARS = 16_384


@dataclass(frozen=True)
class Prediction:
    """A region the model predicted, for the file around it as it was then (a digest)."""

    around: bytes
    region: str
    predicted: str
    completion_tokens: int


class Predictions:
    """The newest prediction per (account, file path), least recently used dropped first.

    ``account`` is the caller's key for whose requests may see a prediction: one account's
    prediction is never an answer to another's request (``NextEditService`` passes the prefix-cache
    partition and the account id, so a cache shared by operator choice still keeps these apart).
    """

    def __init__(self, capacity: int = PREDICTIONS_KEPT) -> None:
        self.capacity = capacity
        self._kept: OrderedDict[tuple[str, str], Prediction] = OrderedDict()

    def remember(
        self, account: str, prompt: EditPrompt, predicted: str, completion_tokens: int
    ) -> None:
        """Keep ``predicted`` as the answer for ``prompt``; a "no change" answer, or one too
        long to keep, forgets the file's prediction."""
        key = (account, prompt.file_path)
        region = region_without_cursor(prompt)
        self._kept.pop(key, None)
        if predicted == region or len(region) + len(predicted) > MAX_REMEMBERED_CHARS:
            return
        self._kept[key] = Prediction(_around(prompt), region, predicted, completion_tokens)
        while len(self._kept) > self.capacity:
            self._kept.popitem(last=False)

    def followed(self, account: str, prompt: EditPrompt) -> Prediction | None:
        """The file's prediction, if ``prompt`` is its request with part of the predicted edit
        typed (``typed_toward``) and the file outside the region as it was."""
        key = (account, prompt.file_path)
        kept = self._kept.get(key)
        if kept is None or kept.around != _around(prompt):
            return None
        if not typed_toward(kept.region, kept.predicted, region_without_cursor(prompt)):
            return None
        self._kept.move_to_end(key)
        return kept


def _around(prompt: EditPrompt) -> bytes:
    """A digest of the file outside the region: what must not have changed."""
    digest = hashlib.blake2b(digest_size=16)
    for part in (prompt.file_before, prompt.file_after):
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part.encode("utf-8", "surrogatepass"))
    return digest.digest()
