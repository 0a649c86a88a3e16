"""The application's typed configuration: the ``args:`` of a Serve config file.

``configs/local.yaml`` and ``configs/prod.yaml`` carry an ``args:`` block that validates into
``AppConfig``; everything has a default, so ``AppConfig()`` is the embedded-model laptop setup.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from serve_app.api.models import (
    Datacenter,
    Endpoint,
    EndpointModelCard,
    ModelCard,
    OpenRouterRef,
    Pricing,
)
from serve_app.engine.embedded import EMBEDDED_MODELS, embedded_name

DEFAULT_MODEL_ID = "qwen2.5-coder-0.5b"


def default_data_dir() -> str:
    """An absolute path: replicas do not run in the directory ``serve run`` was started from."""
    configured = os.environ.get("SERVE_APP_DATA_DIR")
    base = Path(configured) if configured else Path.home() / ".local" / "share" / "serve-app"
    return str(base.expanduser().resolve())


class StrictConfig(BaseModel):
    """Config blocks reject unknown keys: a typo in YAML fails at start, not silently."""

    model_config = ConfigDict(extra="forbid")


class ModelConfig(StrictConfig):
    """One hosted model: where its weights come from and how the listings describe it."""

    id: str = DEFAULT_MODEL_ID
    source: str = Field(
        default="embedded:qwen2.5-coder-0.5b",
        description="embedded:<name>, tiny, a Hugging Face model id, or a local folder.",
    )
    name: str | None = Field(default=None, description="Default: the embedded model's, else id.")
    description: str | None = Field(default=None, description="Default: from the source.")
    created: int = 1730419200
    context_length: int = Field(default=32768, ge=16)
    max_output_length: int = Field(default=8192, ge=1)
    dtype: str = "auto"
    device: str = "auto"
    default_temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    pricing: Pricing = Field(default_factory=Pricing)
    supported_sampling_parameters: list[str] = Field(
        default_factory=lambda: (
            ["temperature", "top_p", "top_k", "stop", "seed"]
            + ["frequency_penalty", "presence_penalty", "repetition_penalty"]
        )
    )
    supported_features: list[str] = Field(default_factory=list)
    openrouter_slug: str | None = None
    datacenters: list[str] = Field(default_factory=lambda: ["US"])

    @model_validator(mode="after")
    def _describe_from_source(self) -> ModelConfig:
        """Listings name what is really served: an embedded source brings its own metadata."""
        embedded = EMBEDDED_MODELS.get(embedded_name(self.source) or "")
        if embedded is not None:
            self.name = self.name or embedded.display_name
            self.description = self.description or embedded.description
        self.name = self.name or self.id
        self.description = self.description or f"{self.id}, served from {self.source}."
        return self

    def card(self, endpoints: list[Endpoint] | None = None) -> ModelCard | EndpointModelCard:
        fields = {
            "id": self.id,
            "name": self.name,
            "created": self.created,
            "description": self.description,
            "context_length": self.context_length,
            "max_output_length": self.max_output_length,
            "pricing": self.pricing,
            "supported_sampling_parameters": self.supported_sampling_parameters,
            "supported_features": self.supported_features,
            "openrouter": OpenRouterRef(slug=self.openrouter_slug or self.id),
            "datacenters": [Datacenter(country_code=code) for code in self.datacenters],
        }
        if endpoints is None:
            return ModelCard(**fields)
        return EndpointModelCard(**fields, supported_endpoints=endpoints)


class SpeculationOptions(StrictConfig):
    """Prompt-lookup draft tokens per request role (0 = off; needs ``runner: auto``). Output is
    unchanged either way; it pays where answers copy their prompt (next-edit rewrites a region
    it was given)."""

    edit: int = Field(default=6, ge=0, le=16)
    fim: int = Field(default=0, ge=0, le=16)
    chat: int = Field(default=0, ge=0, le=16)


class EngineOptions(StrictConfig):
    """Engine knobs shared by the generating deployments (see serve_app.engine.engine)."""

    runner: Literal["auto", "hf"] = Field(
        default="hf",
        description="auto: the engine's own runner for Qwen2 models (HF for others), as "
        "configs/local.yaml sets it; hf: always the HF model (the default until the runner's "
        "int4 output has passed the embedded behaviour tests).",
    )
    weights: Literal["int4", "dense"] = Field(
        default="int4",
        description="The runner's decode weights: int4 (groupwise, ~1.5x faster decode on AVX2 "
        "CPUs, packed once next to the model) or dense (the model's own numbers).",
    )
    prefill_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto", description="auto: bf16 where the CPU computes it natively, else fp32."
    )
    speculation: SpeculationOptions = Field(default_factory=SpeculationOptions)

    max_batch_size: int = Field(default=8, ge=1)
    prefill_chunk_tokens: int = Field(default=256, ge=16)
    prefix_cache_mb: int = Field(default=512, ge=0)
    max_waiting: int = Field(default=64, ge=1)
    torch_threads: int | None = Field(
        default=None, ge=1, description="Intra-op threads per replica; default: the CPU allotment."
    )


class Roles(StrictConfig):
    """Which model each model deployment serves. Chat is served by the edit deployment."""

    fim: str = DEFAULT_MODEL_ID
    edit: str = DEFAULT_MODEL_ID
    decisions: str = DEFAULT_MODEL_ID
    chat: bool = Field(default=True, description="Serve chat completions on the edit model.")


class AuthOptions(StrictConfig):
    db: str | None = Field(
        default=None,
        description="SQLite path or postgresql:// DSN; default $SERVE_APP_AUTH_DB, else "
        "<data_dir>/auth.sqlite3.",
    )
    cache_ttl_s: float = Field(default=0.5, ge=0.0, le=1.0)
    bootstrap_local_key: bool = Field(
        default=True, description="Create a local account and key on an empty store."
    )


class Limits(StrictConfig):
    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    max_questions: int = Field(default=64, ge=1)
    request_timeout_s: float = Field(default=300.0, gt=0)
    decision_timeout_s: float = Field(default=120.0, gt=0)


class AppConfig(StrictConfig):
    models: list[ModelConfig] = Field(default_factory=lambda: [ModelConfig()], min_length=1)
    roles: Roles = Field(default_factory=Roles)
    engine: EngineOptions = Field(default_factory=EngineOptions)
    auth: AuthOptions = Field(default_factory=AuthOptions)
    limits: Limits = Field(default_factory=Limits)
    cache_dir: str | None = Field(
        default=None, description="Where converted models live; default ~/.cache/serve-app/models."
    )
    data_dir: str = Field(
        default_factory=lambda: default_data_dir(),
        description="Where the auth store lives (SQLite); default $SERVE_APP_DATA_DIR.",
    )

    @model_validator(mode="after")
    def _roles_name_known_models(self) -> AppConfig:
        known = {model.id for model in self.models}
        for role in ("fim", "edit", "decisions"):
            if getattr(self.roles, role) not in known:
                raise ValueError(
                    f"roles.{role} names an unknown model {getattr(self.roles, role)!r}"
                )
        return self

    def model(self, model_id: str) -> ModelConfig:
        return next(model for model in self.models if model.id == model_id)

    def endpoints_of(self, model_id: str) -> list[Endpoint]:
        endpoints: list[Endpoint] = []
        if self.roles.chat and model_id == self.roles.edit:
            endpoints.append("chat.completions")
        if model_id == self.roles.edit:
            endpoints.append("edit.completions")
        if model_id == self.roles.fim:
            endpoints.append("fim.completions")
        return endpoints

    @property
    def auth_db(self) -> str:
        configured = self.auth.db or os.environ.get("SERVE_APP_AUTH_DB")
        return configured or str(Path(self.data_dir) / "auth.sqlite3")
