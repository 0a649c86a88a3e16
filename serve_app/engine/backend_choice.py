"""Which ``model_backend.ModelBackend`` runs a model, and the draft model's runner. Above both
implementations, which import only ``model_backend``'s types."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from serve_app.engine.model_backend import ModelBackend
from serve_app.engine.runner_backend import RunnerBackend
from serve_app.engine_config import EngineConfig
from serve_app.runner.builder import configured_runner
from serve_app.runner.draft import DraftModel

logger = logging.getLogger(__name__)


def make_backend(
    loaded: Any,
    config: EngineConfig,
    max_columns: int,
    adapters: Mapping[str, Path] | None = None,
) -> ModelBackend:
    """The runner when ``config.runner`` allows it and it supports the model, else HF.
    ``max_columns``: the most KV positions one request holds. ``adapters``: LoRA adapters (peft
    folders) by the name requests use; only the runner applies them (on HF, start fails)."""
    purpose = "scoring backend" if config.task == "score" else "engine backend"
    runner = configured_runner(loaded, config, purpose, adapters=adapters)
    if runner is None:
        from serve_app.engine.hf_backend import HFBackend  # transformers' cache code: only here

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
    """The draft model's runner for draft-model speculation, or None: no draft model, no route
    drafting with it, or a backend that cannot check drafts. The draft must share the target's
    tokenizer (its ids are read as the target's); its vocabulary may be smaller (Qwen2.5's 7B
    pads its embedding to 152,064 rows, the 0.5B to 151,936), never larger: start fails here."""
    speculation = config.speculation
    if draft is None or not speculation.draft_model_routes or not backend.supports_speculation:
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
