"""The seam between the engine and a model: ``ModelBackend`` (``backend_choice`` picks one).

The step loop drives a backend through these calls, never through a model directly:

- ``begin(state, kv)``: give a request its KV (a slot, or a cache) and load its prefix hit;
- ``prefill(chunks)``: read each ``PromptChunk`` (a request's prompt positions
  ``start..end``), at most ``prompt_batch`` of them in one forward; the last position's
  logits ``[V]`` of each;
- ``computed_kv(state)``: the KV of a request's first ``num_computed`` tokens, for the prefix
  cache (after its prompt is read, and when it ends), or None where the backend cannot hand
  it out (the HF backend's decode rows live in one batched cache);
- ``join(states)``: move prefilled requests into the decode batch (``rows``);
- ``decode(drafts)``: one forward for every row, its last token then its draft tokens;
  logits ``[sum(1 + len(draft)), V]``, rows one after another (drafts stay empty unless
  ``supports_speculation``);
- ``score(state, row, check)``: a tree row (``engine.tree``) on top of a prefilled request's
  KV, in one forward; the log-probabilities of the row's reads (a scoring request's pass);
- ``release(states)`` frees ended requests' KV; ``idle()`` gives memory back once the engine
  has had nothing to do for ``IDLE_TRIM_S``; ``reset()`` frees everything after a failure.

A backend reads of a request state its ``prompt_ids``, ``kv``, ``num_computed``,
``last_token_id`` and ``adapter`` (the LoRA adapter it runs with, "" for none; only the
runner applies one).

``check`` (prefill and score) runs between decoder layers where the backend can, and raises
``RequestAborted`` for an aborted request: a long chunk stops within one layer's work.

Two implementations: ``runner.backend.RunnerBackend`` (the engine's own Qwen2 forward over a
static slot KV cache, on CPU with quantized decode weights, on a CUDA GPU with the model's dense
ones) and ``hf_backend.HFBackend`` (the HF model, the reference). Both import this module's
types; ``backend_choice.make_backend``, above both, chooses between them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from serve_app.engine.prefix_cache import KV
from serve_app.engine.tree import Row


@dataclass(frozen=True)
class PromptChunk:
    """Prompt positions ``start..end`` of one request, read in one prefill."""

    state: Any
    start: int
    end: int


class ModelBackend(Protocol):
    supports_speculation: bool
    prompt_batch: int  # how many requests' chunks one prefill forward reads

    @property
    def rows(self) -> list[Any]: ...

    def __len__(self) -> int: ...

    def begin(self, state: Any, kv: KV | None) -> None: ...

    def prefill(
        self, chunks: Sequence[PromptChunk], check: Callable[[], None] | None = None
    ) -> list[torch.Tensor]: ...

    def computed_kv(self, state: Any) -> KV | None: ...

    def join(self, states: Sequence[Any]) -> None: ...

    def decode(self, drafts: Sequence[Sequence[int]]) -> torch.Tensor: ...

    def score(self, state: Any, row: Row, check: Callable[[], None]) -> list[float]: ...

    def release(self, states: Sequence[Any]) -> None: ...

    def idle(self) -> None: ...

    def reset(self) -> None: ...
