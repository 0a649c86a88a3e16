"""Streaming text out of a token stream: whole characters only, and never a stop sequence.

``IncrementalDetokenizer`` turns token ids into text as they arrive, only whole characters (a
byte-level BPE token can hold half of one); ``StopMatcher`` cuts it at the first stop sequence,
holding back any tail that might become one, so a stop split across chunks never reaches a client.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Decode a growing list of token ids into text, emitting only completed characters.

    vLLM's and TGI's prefix-offset/read-offset window: ``ids[prefix_offset:read_offset]`` was
    emitted and is decoded again only as context (so tokenizers that render a token differently
    after another stay right), ``ids[read_offset:]`` not yet. Decoding just that window keeps the
    cost per token flat; while its text ends in U+FFFD a character is incomplete, so it waits.

    ``prompt_ids``: its last ``context_tokens`` ids seed the context (never emitted);
    ``max_pending`` bounds how long invalid bytes are held back; ``hidden``: leading characters
    not emitted (``GenerationRequest.answer_prefix``, which the client already has)."""

    def __init__(
        self,
        tokenizer: Any,
        *,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = False,
        context_tokens: int = 5,
        max_pending: int = 8,
        hidden: int = 0,
    ) -> None:
        self.tokenizer = tokenizer
        self.hidden = hidden
        self.max_pending = max_pending
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = list(prompt_ids[-context_tokens:]) if context_tokens else []
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self._prefix_text = self._decode(self.ids)

    def _decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        return self.tokenizer.decode(
            list(ids),
            skip_special_tokens=self.skip_special_tokens,
            clean_up_tokenization_spaces=False,
        )

    def add(self, token_id: int) -> str:
        """Add one token; return the text it completes (often "", e.g. mid-character)."""
        self.ids.append(int(token_id))
        text = self._decode(self.ids[self.prefix_offset :])
        if len(text) <= len(self._prefix_text):
            return ""
        if not text.endswith(REPLACEMENT_CHAR):
            return self._advance(text, len(self.ids))
        if len(self.ids) - self.read_offset > self.max_pending:
            return self._release_invalid_bytes()
        return ""

    def flush(self) -> str:
        """Emit whatever is pending at the end, incomplete bytes included (as U+FFFD)."""
        if self.read_offset == len(self.ids):
            return ""
        text = self._decode(self.ids[self.prefix_offset :])
        return self._advance(text, len(self.ids)) if len(text) > len(self._prefix_text) else ""

    def _release_invalid_bytes(self) -> str:
        """Emit up to the last token boundary that no later byte can change: text that keeps
        ending in U+FFFD over many tokens is a run of invalid bytes (a character needs at most
        four) that would grow the window without bound. A boundary is final when both sides
        decoded apart give the text decoded together: its next byte continues no character."""
        whole = self._decode(self.ids[self.prefix_offset :])
        for split in range(len(self.ids) - 1, self.read_offset, -1):
            head = self._decode(self.ids[self.prefix_offset : split])
            if head + self._decode(self.ids[split:]) == whole and len(head) > len(
                self._prefix_text
            ):
                return self._advance(head, split)
        return ""

    def _advance(self, text: str, read_to: int) -> str:
        """Emit ``text`` (the decode of ``ids[prefix_offset:read_to]``) past what was emitted,
        less what is still hidden."""
        delta = text[len(self._prefix_text) :]
        self.prefix_offset, self.read_offset = self.read_offset, read_to
        self._prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        cut = min(self.hidden, len(delta))
        self.hidden -= cut
        return delta[cut:]


class StopMatcher:
    """Cut streamed text at the first stop sequence, across chunk boundaries. "First": the
    occurrence completed earliest (ties: the earliest start), the only rule a stream can apply
    without seeing the future; the output is then independent of chunking."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(dict.fromkeys(s for s in stops if s))
        # Every proper prefix of a stop: a tail equal to one of these must be held back.
        self._prefixes = {s[:i] for s in self.stops for i in range(1, len(s))}
        self._longest_prefix = max((len(s) - 1 for s in self.stops), default=0)
        self._pending = ""
        self.stopped = False

    def feed(self, text: str) -> tuple[str, bool]:
        """Add text; return (text safe to emit now, whether a stop sequence was hit). After a
        hit, the text from the stop on is dropped and every later call returns ``("", True)``."""
        if self.stopped:
            return "", True
        pending = self._pending + text
        cut = self._first_stop(pending)
        if cut is not None:
            self._pending, self.stopped = "", True
            return pending[:cut], True
        hold = self._held_tail(pending)
        self._pending = pending[len(pending) - hold :] if hold else ""
        return pending[: len(pending) - hold], False

    def flush(self) -> str:
        """Release held-back text when generation ends for another reason."""
        pending, self._pending = self._pending, ""
        return "" if self.stopped else pending

    def _first_stop(self, text: str) -> int | None:
        best: tuple[int, int] | None = None  # (end, start) of the earliest-completed stop
        for stop in self.stops:
            start = text.find(stop)
            if start != -1 and (best is None or (start + len(stop), start) < best):
                best = (start + len(stop), start)
        return None if best is None else best[1]

    def _held_tail(self, text: str) -> int:
        for size in range(min(len(text), self._longest_prefix), 0, -1):
            if text[-size:] in self._prefixes:
                return size
        return 0
