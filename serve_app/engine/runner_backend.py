"""The engine's model backend over ``Qwen2Runner``: slot assignment and the batched forward.

One of the two ``model_backend.ModelBackend`` implementations (with ``hf_backend.HFBackend``);
a request's ``kv`` field holds its slot here. Decoding requests sit in slots
``0 .. len(rows) - 1`` in ``rows`` order, so a decode step reads them in place; prefilling
requests take free slots from the top. Joining moves a request down to the next decode slot (a
copy of its prompt's KV, as cheap as the prefix-cache insert); a leaving row is replaced by the
last decode row. A spare slot past ``max_batch`` makes every move a plain copy, even into a
prefilling request's slot.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

from serve_app.engine.model_backend import PromptChunk
from serve_app.engine.tree import Row, read_log_probs, tree_mask
from serve_app.runner.kv import KV, MIN_CAPACITY
from serve_app.runner.qwen2 import Qwen2Runner

logger = logging.getLogger(__name__)


class RunnerBackend:
    supports_speculation = True

    def __init__(self, runner: Qwen2Runner, max_batch: int, max_columns: int) -> None:
        self.runner = runner
        # On CPU one request's chunk per forward, for ``attention.aligned_prefill_attention``;
        # on a GPU a forward per request is launch-bound: every prefilling chunk goes in one.
        self.prompt_batch = 1 if runner.device.type == "cpu" else max_batch
        self.spare = max_batch
        self.cache = runner.new_cache(max_batch + 1, MIN_CAPACITY, max_columns)
        self.owner: list[Any] = [None] * (max_batch + 1)
        self.rows: list[Any] = []

    def __len__(self) -> int:
        return len(self.rows)

    # ------------------------------------------------------------------ prefill

    def begin(self, state: Any, kv: KV | None) -> None:
        """Give a request a slot (the highest free one) and load its prefix-cache hit."""
        free = [i for i in range(self.spare) if self.owner[i] is None]
        if not free:  # never expected: the engine releases every ended request's slot
            raise RuntimeError("no free KV slot")
        slot = free[-1]
        self.owner[slot] = state
        state.kv = slot
        if kv is not None:
            self.cache.load(slot, kv)

    def prefill(
        self, chunks: Sequence[PromptChunk], check: Callable[[], None] | None = None
    ) -> list[torch.Tensor]:
        """Each chunk read into its request's slot, all in one forward."""
        tokens = [c.state.prompt_ids[c.start : c.end] for c in chunks]
        starts = [c.start for c in chunks]
        slots = [c.state.kv for c in chunks]
        adapters = [c.state.adapter for c in chunks]
        logits = self.runner.forward(
            self.cache,
            slots[0],
            tokens,
            starts,
            decode=False,
            check=check,
            slots=slots,
            adapters=adapters,
        )
        return list(logits)

    def score(self, state: Any, row: Row, check: Callable[[], None]) -> list[float]:
        """The row written after the prefix in the request's own slot (each pass overwrites
        the last one's columns; the prefix's stay)."""
        offset = state.num_computed
        self.cache.ensure(offset + len(row))
        mask = tree_mask([row], offset, len(row))[0, 0]
        positions = torch.tensor(row.depths, device=self.runner.device) + offset
        runner = self.runner
        hidden = runner.forward_tree(
            self.cache, state.kv, offset, row.tokens, positions, mask, check
        )
        return read_log_probs(
            hidden, row.reads, lambda h: runner.lm_head(h, runner.quantized_prompts)
        )

    def computed_kv(self, state: Any) -> KV | None:
        if not isinstance(state.kv, int):
            return None
        return self.cache.read(state.kv, state.num_computed)

    # ------------------------------------------------------------------ decode

    def join(self, states: Sequence[Any]) -> None:
        for state in states:
            self._move(state, len(self.rows))
            self.rows.append(state)

    def decode(self, drafts: Sequence[Sequence[int]]) -> torch.Tensor:
        """Logits ``[sum(1 + len(draft)), V]``: each row's last token, then its drafts."""
        tokens = [[s.last_token_id, *d] for s, d in zip(self.rows, drafts, strict=True)]
        starts = [s.num_computed for s in self.rows]
        adapters = [s.adapter for s in self.rows]
        return self.runner.forward(self.cache, 0, tokens, starts, decode=True, adapters=adapters)

    def release(self, states: Sequence[Any]) -> None:
        """Free the slots of finished/aborted requests, keeping decode rows compact."""
        for state in states:
            slot = state.kv
            if not isinstance(slot, int) or self.owner[slot] is not state:
                continue
            self.owner[slot] = None
            state.kv = None
            if slot < len(self.rows) and self.rows[slot] is state:
                last = self.rows.pop()
                if last is not state:  # the last decode row fills the hole
                    self.rows[slot] = last
                    self._move(last, slot)

    def idle(self) -> None:
        """The engine has been idle a while: the cache goes back to its initial size."""
        if not any(self.owner):
            self.cache.shrink()

    def reset(self) -> None:
        for state in self.owner:
            if state is not None:
                state.kv = None
        self.owner = [None] * len(self.owner)
        self.rows = []
        self.cache.shrink()

    def _move(self, state: Any, dest: int) -> None:
        """Put ``state``'s KV in slot ``dest``, moving a prefilling occupant elsewhere."""
        source = state.kv
        if source == dest:
            return
        occupant = self.owner[dest]
        if occupant is not None:  # a prefilling request: park it in the spare, then swap
            self.cache.move(dest, self.spare, occupant.num_computed)
        self.cache.move(source, dest, state.num_computed)
        self.owner[dest], state.kv = state, dest
        self.owner[source] = None
        if occupant is not None:
            self.cache.move(self.spare, source, occupant.num_computed)
            self.owner[source], occupant.kv = occupant, source
