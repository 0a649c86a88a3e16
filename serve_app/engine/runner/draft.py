"""Draft-model speculation: a smaller model of the same tokenizer proposes the next tokens.

``DraftModel.propose`` gives each drafting row up to k greedy tokens of the draft model; the
engine checks them in the target's one forward of k + 1 positions and keeps the verified
prefix (``LLMEngine._verify``, the same rule as prompt-lookup drafts). A greedy draft is a
deterministic function of the tokens so far, so the rule keeps the output exact: greedy
requests decode token for token as the target alone would, sampled ones keep the target's
distribution (``speculation.py`` has the argument).

The draft's KV follows the target's tokens, not its slots: each row has a draft slot holding
the KV of the tokens it has read. A step first catches a row up on what is new since then
(the whole prompt on its first step, the tokens the target accepted and sampled after), from
the longest common prefix of what it read and the row's tokens now, so rejected drafts are
simply overwritten; then one batched forward per drafted position. A slot belongs to one
request from its first draft to its end: nothing is shared between requests, so nothing
crosses accounts, and an aborted request's slot is freed with it.

k adapts per request, as transformers' assisted generation does: one more after a step whose
drafts were all accepted, one fewer after a step that rejected one.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from serve_app.engine.runner.kv import MIN_CAPACITY
from serve_app.engine.runner.qwen2 import Qwen2Runner

# A request's draft length never grows past this: past ~8 a draft model's tokens are rarely
# all right, and each costs one draft step whether accepted or not.
MAX_DRAFT_TOKENS = 8


@dataclass(eq=False)
class DraftRow:
    """One request's draft state: the tokens its slot's KV holds, and its adaptive k."""

    key: int  # id() of the engine's request state
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

    @property
    def max_rows(self) -> int:
        return len(self.slots)

    def reads(self, tokens: list[int]) -> bool:
        """Whether every token is in the draft's vocabulary: a target may have more rows
        (padding the draft never saw; random weights even sample them), and such a row
        drafts nothing rather than index past the draft's embedding."""
        return max(tokens) < self.runner.vocab_size

    def propose(
        self, requests: Sequence[tuple[int, list[int], int]], live: Collection[int]
    ) -> list[list[int]]:
        """Greedy drafts for ``requests``: (key, every token so far, most tokens to draft),
        at most ``max_rows`` of them. ``live``: the keys of every running request; the
        others' slots are freed."""
        self._forget(live)
        rows = [self._place(index, key) for index, (key, _, _) in enumerate(requests)]
        lengths = [min(row.k, limit) for row, (_, _, limit) in zip(rows, requests, strict=True)]
        drafts: list[list[int]] = [[] for _ in rows]
        # Every row takes every step (one batched forward per position), so none may write
        # past the cache's last column, whatever its own length.
        room = min(self.cache.max_capacity - len(tokens) + 1 for _, tokens, _ in requests)
        steps = min(max(lengths, default=0), room)
        if steps <= 0:
            return drafts
        feed = [
            self._catch_up(index, row, tokens)
            for index, (row, (_, tokens, _)) in enumerate(zip(rows, requests, strict=True))
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
        common = _common_prefix(row.read, tokens, len(tokens) - 1)
        missing = tokens[common:-1]
        if missing:
            self.runner.forward(self.cache, slot, [missing], [common], decode=False)
        row.read = tokens[:-1]
        return tokens[-1]

    def _forget(self, live: Collection[int]) -> None:
        for index, row in enumerate(self.slots):
            if row is not None and row.key not in live:
                self.slots[index] = None

    def _row(self, key: int) -> DraftRow | None:
        return next((row for row in self.slots if row is not None and row.key == key), None)

    def _place(self, index: int, key: int) -> DraftRow:
        """``key``'s row, moved into slot ``index`` (batched forwards read slots 0..B-1)."""
        here = self.slots[index]
        if here is not None and here.key == key:
            return here
        row = self._row(key)
        if row is None:
            row = DraftRow(key, self.initial_k)
            if here is not None:  # a live row not drafting this step: it moves to a free slot
                free = self.slots.index(None)
                self._copy(index, free)
        else:
            elsewhere = self.slots.index(row)
            if here is not None:  # swap through the spare slot
                self.cache.move(index, self.spare, len(here.read))
            self.cache.move(elsewhere, index, len(row.read))
            if here is not None:
                self.cache.move(self.spare, elsewhere, len(here.read))
            self.slots[elsewhere] = here
        self.slots[index] = row
        return row

    def _copy(self, source: int, dest: int) -> None:
        row = self.slots[source]
        assert row is not None
        self.cache.move(source, dest, len(row.read))
        self.slots[dest] = row


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """How many leading tokens ``a`` and ``b`` share, at most ``limit``."""
    n = min(len(a), len(b), limit)
    if a[:n] == b[:n]:  # the usual case: only the last step's rejected drafts differ
        return n
    low, high = 0, n  # a[:low] == b[:low], a[:high] != b[:high]
    while high - low > 1:
        middle = (low + high) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle
    return low
