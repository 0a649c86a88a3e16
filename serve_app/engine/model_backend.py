"""The seam between the engine and a model: ``ModelBackend`` (``backend_choice`` picks one).

The step loop drives a backend through these calls, never a model directly:

- ``begin(state, kv)``: give a request its KV (a slot, or a cache) and load its prefix hit;
- ``prefill(chunks)``: up to ``prompt_batch`` ``PromptChunk``s in one forward; each's last logits;
- ``computed_kv(state)``: a request's first ``num_computed`` tokens' KV for the prefix cache
  (after its prompt, and when it ends), or None where not separable (HF's batched decode KV);
- ``join(states)``: move prefilled requests into the decode batch (``rows``);
- ``decode(drafts)``: one forward for every row, its last token then its draft (empty unless
  ``supports_speculation``); logits ``[sum(1 + len(draft)), V]``, rows one after another;
- ``score(state, row, check)``: a tree row (``engine.tree``) on top of a prefilled request's
  KV in one forward; the log-probabilities of the row's reads (a scoring request's pass);
- ``release(states)`` frees ended requests' KV; ``idle()`` gives memory back after
  ``IDLE_TRIM_S`` with nothing to do; ``reset()`` frees everything after a failure.

A backend reads of a request state ``prompt_ids``, ``kv``, ``num_computed``, ``last_token_id``
and ``adapter`` (its LoRA adapter, "" for none; only the runner applies one). ``check``
(prefill, score) runs between decoder layers where the backend can and raises
``RequestAborted`` for an aborted request, so a long chunk stops within one layer's work.

Implementations: ``runner.backend.RunnerBackend`` (the engine's own Qwen2 forward over a static
slot KV cache; on CPU with quantized decode weights, on a CUDA GPU with dense ones) and
``hf_backend.HFBackend`` (the HF model, the reference). Both import this module's types;
``backend_choice.make_backend``, above both, picks one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from serve_app.engine.tree import Row
from serve_app.runner.kv import KV


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
