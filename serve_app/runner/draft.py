"""Draft-model speculation: a smaller model of the same tokenizer proposes the next tokens.

``DraftModel.propose`` gives each drafting row up to k greedy draft tokens, checked in one target
forward of k + 1 positions as prompt-lookup drafts are (``LLMEngine._verify``; a greedy draft is
a deterministic function of the tokens so far, so ``speculation``'s exactness argument holds).
The draft's KV follows the target's tokens, not its slots: a step first catches each row's draft
slot up from the longest common prefix of what it read and the row's tokens now (rejected drafts
are simply overwritten), then runs one batched forward per drafted position. A slot belongs to
one request until its end; then its KV may serve the next request of the same account
(prefix-cache salt) sharing a prefix with it, as a keystroke's request follows the last one's,
never another account's. k adapts per request as in transformers' assisted generation: one more
after a step whose drafts were all accepted, one fewer after a step that rejected one.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from serve_app.runner.kv import MIN_CAPACITY
from serve_app.runner.qwen2 import Qwen2Runner
from serve_app.sequences import common_prefix_len

# A request's draft length never grows past this: past ~8 a draft model's tokens are rarely
# all right, and each costs one draft step whether accepted or not.
MAX_DRAFT_TOKENS = 8


@dataclass(eq=False)
class DraftRow:
    """A slot's draft state: the tokens its KV holds, whose they are, and the adaptive k."""

    key: int | None  # id() of the engine's request state; None: that request has ended
    salt: str  # the request's prefix-cache partition (its account)
    k: int
    read: list[int] = field(default_factory=list)


class DraftModel:
    """The draft model's runner and its own slot cache: ``max_batch`` rows plus a spare slot
    for swaps. ``initial_k``: a new request's draft length, before it adapts."""

    def __init__(
        self, runner: Qwen2Runner, max_batch: int, max_columns: int, initial_k: int
    ) -> None:
        self.runner = runner
        self.initial_k = max(1, min(initial_k, MAX_DRAFT_TOKENS))
        self.spare = max_batch
        self.cache = runner.new_cache(max_batch + 1, MIN_CAPACITY, max_columns)
        self.slots: list[DraftRow | None] = [None] * max_batch
        self.tokens_read = 0  # tokens caught up on (prompts, accepted and sampled tokens)

    @property
    def max_rows(self) -> int:
        return len(self.slots)

    def reads(self, tokens: list[int]) -> bool:
        """Whether every token is in the draft's vocabulary: a target may have more rows (padding
        the draft never saw; random weights sample them), and a row drafts nothing rather than
        index past the draft's embedding."""
        return max(tokens) < self.runner.vocab_size

    def propose(
        self, requests: Sequence[tuple[int, str, list[int], int]], live: Collection[int]
    ) -> list[list[int]]:
        """Greedy drafts for ``requests``: (key, cache salt, every token so far, most tokens
        to draft), at most ``max_rows`` of them. ``live``: the keys of every running request;
        the others' slots become reusable by a later request of the same salt."""
        self._forget(live)
        rows = [
            self._place(index, key, salt, tokens)
            for index, (key, salt, tokens, _) in enumerate(requests)
        ]
        lengths = [min(row.k, limit) for row, (*_, limit) in zip(rows, requests, strict=True)]
        drafts: list[list[int]] = [[] for _ in rows]
        # Every row takes every step, so none may write past the cache's last column.
        room = min(self.cache.max_capacity - len(tokens) + 1 for _, _, tokens, _ in requests)
        steps = min(max(lengths, default=0), room)
        if steps <= 0:
            return drafts
        feed = [
            self._catch_up(index, row, tokens)
            for index, (row, (_, _, tokens, _)) in enumerate(zip(rows, requests, strict=True))
        ]
        for _ in range(steps):
            starts = [len(row.read) for row in rows]
            logits = self.runner.forward(self.cache, 0, [[t] for t in feed], starts, decode=True)
            for row, token in zip(rows, feed, strict=True):
                row.read.append(token)
            feed = logits.argmax(dim=-1).tolist()
            for draft, token in zip(drafts, feed, strict=True):
                draft.append(token)
        # Each row's last drafted token was never fed: its KV is not in the slot, nor in read.
        return [draft[:length] for draft, length in zip(drafts, lengths, strict=True)]

    def verified(self, key: int, drafted: int, accepted: int) -> None:
        """The target kept ``accepted`` of the ``drafted`` tokens proposed for ``key``."""
        row = self._row(key)
        if row is None or not drafted:
            return
        if accepted >= drafted:
            row.k = min(row.k + 1, MAX_DRAFT_TOKENS)
        else:
            row.k = max(row.k - 1, 1)

    def release(self) -> None:
        """Free every slot (after a failed step, or when the engine resets)."""
        self.slots = [None] * len(self.slots)

    # ------------------------------------------------------------------ slots

    def _catch_up(self, slot: int, row: DraftRow, tokens: list[int]) -> int:
        """Write the KV of ``tokens[:-1]`` the slot does not hold yet (it keeps the longest
        common prefix of what it read); the last token, to feed next."""
        common = min(common_prefix_len(row.read, tokens), len(tokens) - 1)
        missing = tokens[common:-1]
        if missing:
            self.runner.forward(self.cache, slot, [missing], [common], decode=False)
            self.tokens_read += len(missing)
        row.read = tokens[:-1]
        return tokens[-1]

    def _forget(self, live: Collection[int]) -> None:
        """Rows of ended requests keep their KV for the next request of their salt."""
        for row in self.slots:
            if row is not None and row.key not in live:
                row.key = None

    def _row(self, key: int) -> DraftRow | None:
        return next((row for row in self.slots if row is not None and row.key == key), None)

    def _place(self, index: int, key: int, salt: str, tokens: list[int]) -> DraftRow:
        """``key``'s row, moved into slot ``index`` (batched forwards read slots 0..B-1); a new
        request claims its salt's ended row sharing the longest prefix with its tokens, else a
        free or ended slot, emptied: a row's KV is only ever read by requests of its salt."""
        row = self._row(key)
        if row is not None and row.salt != salt:  # an ended request's id() given to another
            row.key, row = None, None
        row = row or self._claim(key, salt, tokens)
        where = self.slots.index(row)
        if where != index:
            self._swap(where, index)
        return row

    def _claim(self, key: int, salt: str, tokens: list[int]) -> DraftRow:
        ended = [row for row in self.slots if row is not None and row.key is None]
        shared, best = max(
            ((common_prefix_len(row.read, tokens), row) for row in ended if row.salt == salt),
            key=lambda pair: pair[0],
            default=(0, None),
        )
        if best is not None and shared > 0:
            best.key, best.k = key, self.initial_k
            return best
        # Live rows hold at most max_rows - 1 slots (this request is live too): one is free.
        slot = self.slots.index(None) if None in self.slots else self.slots.index(ended[0])
        row = self.slots[slot] = DraftRow(key, salt, self.initial_k)
        return row

    def _swap(self, a: int, b: int) -> None:
        """Exchange two slots' KV and rows, through the spare slot."""
        first, second = self.slots[a], self.slots[b]
        if first is not None:
            self.cache.move(a, self.spare, len(first.read))
        if second is not None:
            self.cache.move(b, a, len(second.read))
        if first is not None:
            self.cache.move(self.spare, b, len(first.read))
        self.slots[a], self.slots[b] = second, first
