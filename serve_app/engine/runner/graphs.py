"""Decode steps on a CUDA GPU replayed from captured CUDA graphs.

Why: on a GPU the eager decode step is bound by kernel launches, not by the GPU. Measured on
an H200 (``bench.gpu``, random weights of the published shapes): one stream decoded at 57-65
tok/s for the 0.5B, 1.5B and 7B alike, ~0.6 ms per layer whatever its size. A graph launches
a whole step's kernels at once (vLLM and SGLang capture theirs the same way).

A graph replays fixed shapes at fixed addresses, so a captured step is static:

- rows are padded up to a bucket (``BUCKETS``): one graph per bucket, not per batch size.
  A padding row feeds token 0 at position 0; it writes its keys/values into the cache's last
  slot, the spare that both slot caches (``RunnerBackend``, ``DraftModel``) keep free between
  steps, and its logits are dropped;
- attention reads every column of the cache's current allocation (``SlotCache.capacity``),
  masked past each row's position, instead of the widest row's columns: the masked columns
  weigh exactly 0, and on a GPU the extra reads cost less than the launches saved;
- the inputs (token ids, positions, write slots) are copied into the graph's own tensors
  before a replay, and the logits copied out after it (a later replay overwrites them).

A graph holds the cache's tensors by address, so graphs are kept per cache allocation: when
the cache grows or shrinks (``SlotCache.allocation`` changes) its graphs are dropped and
captured again on first use, a few eager steps each. Only steps whose rows feed one token
each run here; a step that verifies drafts (several tokens in some rows) runs eagerly.

Off a GPU (``capture=False``) the same static step runs eagerly: the tests check it against
the eager forward on CPU, where a graph cannot be captured.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from serve_app.engine.runner.kv import SlotCache

if TYPE_CHECKING:
    from serve_app.engine.runner.qwen2 import Qwen2Runner

logger = logging.getLogger(__name__)

# Batch sizes a graph is captured for; a step's rows are padded up to the next one.
BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
# Eager runs of a step before its capture: the first run allocates (cuBLAS workspaces, the
# caching allocator's blocks), which a capture must not.
WARMUP_RUNS = 2


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph | None
    step: Callable[[], torch.Tensor]
    tokens: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    logits: torch.Tensor


class DecodeGraphs:
    """Captured decode steps of one runner, per (cache, allocation, bucket)."""

    def __init__(self, capture: bool = True) -> None:
        self.capture = capture
        self.graphs: dict[tuple[int, int, int], _Graph] = {}
        self.pool = torch.cuda.graph_pool_handle() if capture else None
        self.captured = 0  # graphs captured so far (the bench reports it)

    @staticmethod
    def bucket(rows: int, slots: int) -> int | None:
        """The padded row count for ``rows`` in a cache of ``slots`` (the last one spare), or
        None where no bucket fits: the step then runs eagerly."""
        return next((b for b in BUCKETS if rows <= b < slots), None)

    def decode(
        self, runner: Qwen2Runner, cache: SlotCache, tokens: Sequence[int], starts: Sequence[int]
    ) -> torch.Tensor | None:
        """Logits ``[rows, V]`` of feeding ``tokens[b]`` at ``starts[b]`` of slot ``b``, or None
        when the step does not fit a bucket (the caller runs it eagerly)."""
        rows = len(tokens)
        size = self.bucket(rows, cache.slots)
        if size is None:
            return None
        cache.ensure(max(starts) + 1)  # before the lookup: growing makes a new allocation
        entry = self._entry(runner, cache, size)
        pad = size - rows
        device = entry.tokens.device
        entry.tokens.copy_(torch.tensor([*tokens, *[0] * pad], device=device))
        entry.positions.copy_(torch.tensor([*starts, *[0] * pad], device=device))
        spare = cache.slots - 1
        entry.slots.copy_(torch.tensor([*range(rows), *[spare] * pad], device=device))
        if entry.graph is None:
            return entry.step()[:rows]
        entry.graph.replay()
        return entry.logits[:rows].clone()

    def _entry(self, runner: Qwen2Runner, cache: SlotCache, size: int) -> _Graph:
        key = (id(cache), cache.allocation, size)
        entry = self.graphs.get(key)
        if entry is not None:
            return entry
        # Graphs of this cache's earlier allocations hold freed tensors: never replay them.
        stale = [k for k in self.graphs if k[0] == id(cache) and k[1] != cache.allocation]
        for k in stale:
            del self.graphs[k]
        device = runner.device
        tokens = torch.zeros(size, dtype=torch.long, device=device)
        positions = torch.zeros(size, dtype=torch.long, device=device)
        slots = torch.full((size,), cache.slots - 1, dtype=torch.long, device=device)

        def step() -> torch.Tensor:
            return runner.static_decode(cache, tokens, positions, slots)

        entry = _Graph(None, step, tokens, positions, slots, torch.empty(0))
        if self.capture:
            entry.graph, entry.logits = self._capture(step)
            self.captured += 1
            logger.info(
                "runner: decode graph captured for %d rows x %d columns", size, cache.capacity
            )
        self.graphs[key] = entry
        return entry

    def _capture(
        self, step: Callable[[], torch.Tensor]
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Warm ``step`` up on a side stream, then capture it (torch's recipe). The warm-up
        runs write the same keys/values the replay will (the inputs are all padding here:
        token 0 at position 0 into the spare slot)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: only this thread's CUDA calls matter to the capture (the engine steps
        # in its own thread).
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            logits = step()
        return graph, logits
