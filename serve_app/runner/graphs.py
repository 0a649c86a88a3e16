"""Decode steps on a CUDA GPU replayed from captured CUDA graphs.

Why: on a GPU the eager decode step is bound by kernel launches: one stream decodes about as
fast on the 0.5B, 1.5B and 7B, a fixed cost per layer whatever its size (``bench.gpu``). A graph
launches a whole step's kernels at once (as vLLM and SGLang do). It replays fixed shapes at fixed
addresses, so a captured step is static:

- every row feeds ``span`` tokens (1, or 1 + k verifying k drafts); a shorter row is padded with
  token 0, writing its slot's columns past its end, which no query reads before a later step
  overwrites them (as a rejected draft's);
- rows are padded up to a bucket (``BUCKETS``): one graph per (bucket, span). A padding row feeds
  token 0 from position 0 into the cache's last slot, the spare both slot caches
  (``RunnerBackend``, ``DraftModel``) keep free between steps. Padding's logits are dropped;
- attention reads every column of the allocation (``SlotCache.capacity``), masked past each
  row's position: masked columns weigh exactly 0, and the reads cost less than the launches;
- inputs are copied in before a replay and logits out after it (the next replay overwrites them).

A graph holds the cache's tensors by address, so the cache keeps its graphs and their pool
(``SlotCache.graphs``, ``graph_pool``) and drops them when it grows or shrinks; they are
captured again on first use, into a new pool. A step of more than ``MAX_TOKENS`` padded tokens
runs eagerly: its logits would hold graph memory, and its kernels, not their launches, take the
time. Off a GPU (``capture=False``) the static step runs eagerly: tests check it on CPU.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from serve_app.runner.kv import SlotCache

logger = logging.getLogger(__name__)


class StaticDecoder(Protocol):
    """What a graph captures: a runner's decode step on tensors of fixed shape
    (``Qwen2Runner.static_decode``), on the runner's device."""

    device: torch.device

    def static_decode(
        self,
        cache: SlotCache,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        span: int,
    ) -> torch.Tensor: ...


# Batch sizes a graph is captured for; a step's rows are padded up to the next one.
BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
# The most tokens (rows x span, padded) a captured step feeds.
MAX_TOKENS = 256
# Eager runs before a capture: the first allocates (cuBLAS workspaces, allocator blocks), which
# a capture must not.
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
    """How one runner captures and replays its decode steps (kept in the caches: see the module
    doc); one pool per allocation, since steps replay one at a time and can share it."""

    def __init__(self, capture: bool = True) -> None:
        self.capture = capture
        self.captured = 0  # graphs captured so far
        self.steps: Counter[tuple[int, int]] = Counter()  # steps run, by (rows, span) padded

    @staticmethod
    def bucket(rows: int, span: int, slots: int) -> int | None:
        """The padded row count for ``rows`` of ``span`` tokens in a cache of ``slots`` (the
        last one spare), or None where no bucket fits: the step then runs eagerly."""
        return next((b for b in BUCKETS if rows <= b < slots and b * span <= MAX_TOKENS), None)

    def decode(
        self,
        runner: StaticDecoder,
        cache: SlotCache,
        tokens: Sequence[Sequence[int]],
        starts: Sequence[int],
    ) -> torch.Tensor | None:
        """``Qwen2Runner.forward``'s decode logits for ``tokens[b]`` at ``starts[b]..`` of slot
        ``b``, or None when the step fits no graph (the caller runs it eagerly)."""
        rows, span = len(tokens), max(len(t) for t in tokens)
        size = self.bucket(rows, span, cache.slots)
        if size is None or max(starts) + span > cache.max_capacity:
            return None
        cache.ensure(max(starts) + span)  # before the lookup: growing makes a new allocation
        entry = self._entry(runner, cache, size, span)
        self.steps[size, span] += 1
        flat, positions, slots, kept = [], [], [], []
        spare = cache.slots - 1
        for b in range(size):
            row = tokens[b] if b < rows else []
            start = starts[b] if b < rows else 0
            flat += [*row, *[0] * (span - len(row))]
            positions += range(start, start + span)
            slots += [b if b < rows else spare] * span
            kept += range(b * span, b * span + len(row))
        device = entry.tokens.device
        entry.tokens.copy_(torch.tensor(flat, device=device))
        entry.positions.copy_(torch.tensor(positions, device=device))
        entry.slots.copy_(torch.tensor(slots, device=device))
        logits = entry.step() if entry.graph is None else self._replay(entry)
        return logits[torch.tensor(kept, device=device)]  # a copy: the next replay overwrites

    @staticmethod
    def _replay(entry: _Graph) -> torch.Tensor:
        assert entry.graph is not None
        entry.graph.replay()
        return entry.logits

    def _entry(self, runner: StaticDecoder, cache: SlotCache, size: int, span: int) -> _Graph:
        entry = cache.graphs.get((size, span))
        if entry is not None:
            return entry
        device = runner.device
        n = size * span
        tokens = torch.zeros(n, dtype=torch.long, device=device)
        positions = torch.arange(span, device=device).repeat(size)
        slots = torch.full((n,), cache.slots - 1, dtype=torch.long, device=device)

        def step() -> torch.Tensor:
            return runner.static_decode(cache, tokens, positions, slots, span)

        entry = _Graph(None, step, tokens, positions, slots, torch.empty(0))
        if self.capture:
            if cache.graph_pool is None:
                cache.graph_pool = torch.cuda.graph_pool_handle()
            entry.graph, entry.logits = self._capture(step, cache.graph_pool)
            self.captured += 1
            logger.info(
                "runner: decode graph captured: %d rows x %d tokens, %d columns",
                size,
                span,
                cache.capacity,
            )
        cache.graphs[(size, span)] = entry
        return entry

    @staticmethod
    def _capture(
        step: Callable[[], torch.Tensor], pool: tuple[int, int]
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        """Warm ``step`` up on a side stream, then capture it (torch's recipe). The warm-up runs
        write only padding (token 0 at position 0 into the spare): inputs are set at replay."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: only this thread's CUDA calls matter (the engine steps in its own thread).
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            logits = step()
        return graph, logits
