"""What ``LLMEngine.from_config`` builds an engine from: the application's config read for one
model deployment (its role): the role's model loaded with the replica's threads, its draft
model where speculation uses one, and the LoRA adapters its requests may name."""

from __future__ import annotations

import math
from pathlib import Path

from serve_app.config import AppConfig, EngineRole, ModelConfig
from serve_app.models.loader import (
    TRAINING_RECORD,
    AdapterError,
    LoadedModel,
    adapter_path,
    load_model,
    training_record,
)

# The engine's name for a model's ``edit_adapter``, which next-edit requests run with.
EDIT_ADAPTER = "next-edit"


def load_role_model(
    config: AppConfig, model: ModelConfig, role: EngineRole, cpus: float | None = None
) -> LoadedModel:
    """Load ``model`` as configured for ``role``'s deployment: the one way a deployment gets
    weights.

    torch's thread pool is sized from the replica's CPU allotment (``cpus``) unless the config
    says otherwise, so replicas sharing a machine don't oversubscribe its cores.
    """
    configured = config.engine_for(role).torch_threads
    threads = configured or (max(1, math.ceil(cpus)) if cpus else None)
    return load_model(
        model.source,
        dtype=model.dtype,
        device=model.device,
        cache_dir=config.cache_dir,
        threads=threads,
    )


def load_draft_model(
    config: AppConfig, model: ModelConfig, role: EngineRole, cpus: float | None = None
) -> LoadedModel | None:
    """``model``'s draft model, where one is configured and a route of this engine drafts
    with it; None otherwise."""
    engine = config.engine_for(role)
    drafting = engine.task == "generate" and engine.speculation.draft_model_routes
    if model.draft_model is None or not drafting:
        return None
    return load_role_model(config, config.model(model.draft_model), role, cpus)


def role_adapters(model: ModelConfig, role: EngineRole) -> dict[str, Path]:
    """The LoRA adapters the engine of ``role``'s deployment loads for ``model``: the
    next-edit adapter in the edit role's (next-edit, apply and chat share that engine, and
    only next-edit requests name it)."""
    if role != "edit" or model.edit_adapter is None:
        return {}
    path = adapter_path(model.edit_adapter)
    _check_trained_layout(path, model.edit_prompt)
    return {EDIT_ADAPTER: path}


def _check_trained_layout(path: Path, style: str) -> None:
    """An adapter asked in another layout than it learned answers in the wrong shape (a
    chat_span adapter writes spans, which a rewrite's reader cannot use): where its record
    (``training.json``, written by the trainer) names its layout, it must be ``style``."""
    try:
        trained = training_record(path).get("style")
    except (OSError, ValueError) as error:
        raise AdapterError(path, f"unreadable {TRAINING_RECORD}: {error}") from None
    if trained is not None and trained != style:
        raise AdapterError(
            path,
            f"trained on the {trained} prompt layout ({TRAINING_RECORD}), but the model's "
            f"edit_prompt is {style}: set edit_prompt: {trained}",
        )
