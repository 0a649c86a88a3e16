"""The seam between the engine and a model: ``ModelBackend``, and the one place that picks it.

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
ones) and ``hf_backend.HFBackend`` (the HF model, the reference). ``make_backend`` chooses
from the config and the model; transformers' cache code is imported only when the HF backend
is chosen.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from serve_app.engine.engine_config import EngineConfig
from serve_app.engine.prefix_cache import KV
from serve_app.engine.tree import Row

if TYPE_CHECKING:
    from serve_app.engine.runner.draft import DraftModel

logger = logging.getLogger(__name__)


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


def make_backend(
    loaded: Any,
    config: EngineConfig,
    max_columns: int,
    scoring: bool = False,
    adapters: Mapping[str, Path] | None = None,
) -> ModelBackend:
    """The runner when ``config.runner`` allows it and it supports the model, else HF.
    ``max_columns``: the most KV positions one request holds. ``scoring``: for an engine that
    only scores (``configured_runner``: prompts' weights, activations rounded twice).
    ``adapters``: LoRA adapters (peft folders) requests may name, by name; only the runner
    applies them, so a model on HF with adapters fails to start."""
    from serve_app.engine.runner.backend import RunnerBackend, configured_runner

    purpose = "scoring backend" if scoring else "engine backend"
    runner = configured_runner(loaded, config, purpose, scoring=scoring, adapters=adapters)
    if runner is None:
        from serve_app.engine.hf_backend import HFBackend

        if adapters:
            raise ValueError(
                f"LoRA adapters ({', '.join(map(str, adapters.values()))}) need the engine's "
                "runner, and this model runs on HF (see the log line above)"
            )

        return HFBackend(loaded.model, loaded.device)
    logger.info(
        "%s: runner (%s decode weights, prompts on %s weights)",
        purpose,
        runner.decode_weights,
        "decode" if runner.quantized_prompts else "dense",
    )
    return RunnerBackend(runner, config.max_batch_size, max_columns)


def make_drafter(
    draft: Any, config: EngineConfig, backend: ModelBackend, target: Any, max_columns: int
) -> DraftModel | None:
    """The draft model's runner for draft-model speculation, or None: no draft model, no role
    drafting with it, or a backend that cannot check drafts. The draft must share the
    target's tokenizer: its token ids are read as the target's. Its vocabulary may be
    smaller (Qwen2.5's 7B pads its embedding to 152,064 rows, the 0.5B to 151,936), never
    larger; otherwise start fails here."""
    from serve_app.engine.runner.backend import configured_runner
    from serve_app.engine.runner.draft import DraftModel

    speculation = config.speculation
    if draft is None or not speculation.draft_model_roles or not backend.supports_speculation:
        return None
    runner = configured_runner(draft, config, "draft model")
    if runner is None:
        logger.warning("draft model: not on the runner; draft-model speculation is off")
        return None
    target_vocab = target.model.config.vocab_size
    if runner.vocab_size > target_vocab:
        raise ValueError(
            f"the draft model's vocabulary ({runner.vocab_size}) is larger than the target's "
            f"({target_vocab})"
        )
    return DraftModel(runner, config.max_batch_size, max_columns, speculation.draft_model_tokens)
