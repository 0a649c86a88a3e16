"""The last next-edit prediction per account and file, for the keystrokes that type it."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from serve_app.engine.prompts.edit import EditPrompt, region_without_cursor
from serve_app.engine.prompts.edit.following import typed_toward

# Files remembered per replica: a prediction is a few kB, and only the newest per file counts.
PREDICTIONS_KEPT = 1024


@dataclass(frozen=True)
class Prediction:
    """A region the model predicted, for the file around it as it was then."""

    file_before: str
    region: str
    file_after: str
    predicted: str
    completion_tokens: int


class Predictions:
    """The newest prediction per (account, file path), least recently used dropped first.

    ``account`` is the caller's key for whose requests may see a prediction: one account's
    prediction is never an answer to another's request (``EditService`` passes the prefix-cache
    partition and the account id, so a cache shared by operator choice still keeps these apart).
    """

    def __init__(self, capacity: int = PREDICTIONS_KEPT) -> None:
        self.capacity = capacity
        self._kept: OrderedDict[tuple[str, str], Prediction] = OrderedDict()

    def remember(
        self, account: str, prompt: EditPrompt, predicted: str, completion_tokens: int
    ) -> None:
        """Keep ``predicted`` as the answer for ``prompt``; a "no change" answer forgets the
        file's prediction (there is nothing to type toward)."""
        key = (account, prompt.file_path)
        region = region_without_cursor(prompt)
        self._kept.pop(key, None)
        if predicted == region:
            return
        self._kept[key] = Prediction(
            prompt.file_before, region, prompt.file_after, predicted, completion_tokens
        )
        while len(self._kept) > self.capacity:
            self._kept.popitem(last=False)

    def followed(self, account: str, prompt: EditPrompt) -> Prediction | None:
        """The file's prediction, if ``prompt`` is its request with part of the predicted edit
        typed (``typed_toward``) and the file outside the region as it was."""
        key = (account, prompt.file_path)
        kept = self._kept.get(key)
        if kept is None or (prompt.file_before, prompt.file_after) != (
            kept.file_before,
            kept.file_after,
        ):
            return None
        if not typed_toward(kept.region, kept.predicted, region_without_cursor(prompt)):
            return None
        self._kept.move_to_end(key)
        return kept
