"""The application's typed configuration: the ``args:`` of a Serve config file.

``configs/local.yaml`` and ``configs/prod.yaml`` carry an ``args:`` block that validates into
``AppConfig``; everything has a default, so ``AppConfig()`` is the embedded-model laptop setup.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from serve_app.api.apply import ApplyCompletionRequest
from serve_app.api.chat import ChatCompletionRequest
from serve_app.api.common import MAX_QUESTIONS, RequestModel
from serve_app.api.edit import EditCompletionRequest
from serve_app.api.fim import FimCompletionRequest
from serve_app.api.models import (
    Datacenter,
    Endpoint,
    EndpointModelCard,
    ModelCard,
    OpenRouterRef,
    Pricing,
)
from serve_app.auth.store import default_data_dir, resolve_auth_db
from serve_app.engine.embedded import EMBEDDED_MODELS, embedded_name

DEFAULT_MODEL_ID = "qwen2.5-coder-0.5b"

# The sampling parameters a listing may name, and the request model of each endpoint: an
# endpoint honours exactly the ones its request model has as fields (each is passed on to
# SamplingParams), so a listing never names a parameter that the endpoint would not take.
SAMPLING_PARAMETERS = (
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
)
ENDPOINT_REQUESTS: dict[Endpoint, type[RequestModel]] = {
    "chat.completions": ChatCompletionRequest,
    "edit.completions": EditCompletionRequest,
    "apply.completions": ApplyCompletionRequest,
    "fim.completions": FimCompletionRequest,
}
# What chat answers can be asked for (response_format), named as the listings name features.
CHAT_FEATURES = ("json_mode", "structured_outputs")


def honoured_parameters(endpoint: Endpoint) -> set[str]:
    fields = ENDPOINT_REQUESTS[endpoint].model_fields
    return {name for name in SAMPLING_PARAMETERS if name in fields}


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
    aliases: list[str] = Field(
        default_factory=list,
        description=(
            "Other ids a request may name this model by, for clients that hard-code one (Zed "
            "sends mercury-coder); answers and listings carry ``id``."
        ),
    )

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

    def card(
        self, endpoints: list[Endpoint] | None = None, listing: Endpoint | None = None
    ) -> ModelCard | EndpointModelCard:
        """The model's card in ``GET /v1/models`` (``listing`` None: what any of its
        ``endpoints`` honours) or in one endpoint's listing (what that endpoint honours)."""
        endpoints = endpoints or []
        shown = endpoints if listing is None else [listing]
        honoured = set().union(*(honoured_parameters(endpoint) for endpoint in shown))
        features = list(self.supported_features)
        if "chat.completions" in shown:
            features += [name for name in CHAT_FEATURES if name not in features]
        fields = {
            "id": self.id,
            "name": self.name,
            "created": self.created,
            "description": self.description,
            "context_length": self.context_length,
            "max_output_length": self.max_output_length,
            "pricing": self.pricing,
            "supported_sampling_parameters": [
                name for name in self.supported_sampling_parameters if name in honoured
            ],
            "supported_features": features,
            "openrouter": OpenRouterRef(slug=self.openrouter_slug or self.id),
            "datacenters": [Datacenter(country_code=code) for code in self.datacenters],
        }
        if listing is None:
            return ModelCard(**fields)
        return EndpointModelCard(**fields, supported_endpoints=endpoints)


class SpeculationOptions(StrictConfig):
    """Prompt-lookup draft tokens per request role (0 = off; needs ``runner: auto``). Output is
    unchanged either way; it pays where answers copy their prompt (next-edit rewrites a region
    it was given; a completion reuses the names around it) and while few requests decode."""

    edit: int = Field(default=6, ge=0, le=16)
    fim: int = Field(default=2, ge=0, le=16)
    chat: int = Field(default=0, ge=0, le=16)
    apply: int = Field(default=16, ge=0, le=16)
    max_batch: int = Field(
        default=2,
        ge=0,
        description="Draft only while the decode batch has at most this many requests: with "
        "few rows a step of k + 1 rows per request costs little more than a plain step, with "
        "more it costs more than the accepted drafts save (README, Engine v2).",
    )

    def draft_tokens(self) -> dict[str, int]:
        """Draft length per request role (every field but ``max_batch``)."""
        return self.model_dump(exclude={"max_batch"})


class EngineOptions(StrictConfig):
    """Engine knobs shared by the generating deployments (see serve_app.engine.engine)."""

    runner: Literal["auto", "hf"] = Field(
        default="auto",
        description="auto: the engine's own runner for Qwen2 models on CPU (the HF model for "
        "others, and on GPUs); hf: always the HF model.",
    )
    weights: Literal["auto", "int4", "int8", "dense"] = Field(
        default="auto",
        description="The runner's decode weights: auto (int4 where the CPU computes bf16 "
        "natively, else int8), int4 (groupwise, ~1.5x faster decode than "
        "fp32 on AVX2 CPUs, packed once next to the model and shared by replicas), int8 (fbgemm "
        "per channel, ~2.5x faster decode on AVX2, quantized once, packed per replica) or dense "
        "(the model's own numbers).",
    )
    prefill_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto", description="auto: bf16 where the CPU computes it natively, else fp32."
    )
    prompt_weights: Literal["auto", "dense", "decode"] = Field(
        default="auto",
        description="The runner's weights for reading prompts (prefill chunks and decision "
        "scoring): decode (the decode weights; the prompt's first token on dense weights, "
        "once per token id), dense, or auto (decode where the decode weights are int8: one "
        "scale per row reads prompts ~1.5x faster than fp32 on AVX2 at the same measured "
        "quality; dense elsewhere).",
    )
    small_prefill_tokens: int = Field(
        default=32,
        ge=0,
        le=256,
        description="A prompt chunk of at most this many tokens after the prompt's first "
        "position (the tail after a prefix-cache hit) runs on the decode weights: it reads "
        "every weight for a few rows, like a decode step, where int8/int4 cost 2-3x less than "
        "dense. 0: always dense.",
    )
    speculation: SpeculationOptions = Field(default_factory=SpeculationOptions)

    max_batch_size: int = Field(default=8, ge=1)
    prefill_chunk_tokens: int = Field(default=256, ge=16)
    prefix_cache_mb: int = Field(default=512, ge=0)
    max_waiting: int = Field(default=64, ge=1)
    shared_prefix_cache: bool = Field(
        default=False,
        description="One prefix cache for every account. Only for one-tenant deployments: "
        "shared, an account can read another's prompts back through cached_input_tokens.",
    )
    torch_threads: int | None = Field(
        default=None, ge=1, description="Intra-op threads per replica; default: the CPU allotment."
    )
    seed: int | None = Field(
        default=None,
        description="Sampling seed of requests that send none (each request's sampler starts "
        "from it, so a repeated request repeats its text, as llama-server's --seed); null: a "
        "fresh random seed per request.",
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
        default=False,
        description="Create a local account (every model, no limits) and key on an empty "
        "store. Only for a laptop: configs/local.yaml turns it on.",
    )
    docs: Literal["key", "open", "off"] = Field(
        default="key",
        description="/docs and /openapi.json: behind the API key, open to anyone, or off.",
    )
    max_concurrent_requests: int | None = Field(
        default=64,
        ge=1,
        description="Requests one account may have in flight at once (429 past it); null: no cap.",
    )


class HttpLimits(StrictConfig):
    """What one HTTP request may be: body size and time, questions, deadlines (not an
    account's limits: those are ``serve_app.auth.AccountLimits``)."""

    # A body is parsed and validated on the router's event loop, ~0.1 s per MiB of small JSON
    # values: 8 MiB is ~50x what a 32k-token prompt spells, and bounds that stall to ~1 s.
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    body_timeout_s: float = Field(
        default=30.0, gt=0, description="Longest a client may take to send its body (408)."
    )
    max_questions: int = Field(default=64, ge=1, le=MAX_QUESTIONS)
    request_timeout_s: float = Field(default=300.0, gt=0)
    decision_timeout_s: float = Field(default=120.0, gt=0)
    # The scorer's own defaults (scoring.budget.DecisionBudget; a test keeps them equal),
    # written out here so that reading the config does not import the engine.
    decision_max_scored_tokens: int = Field(
        default=65_536,
        ge=1,
        description="Tokens one decision request may run through the model (state, questions, "
        "option tries); beyond it a 422 naming the limit.",
    )
    decision_max_input_bytes: int | None = Field(
        default=None,
        ge=1,
        description="UTF-8 bytes of state plus question text per decision request, checked "
        "before tokenisation; null: 8 per context token, at least 64 KiB.",
    )


class AppConfig(StrictConfig):
    models: list[ModelConfig] = Field(default_factory=lambda: [ModelConfig()], min_length=1)
    roles: Roles = Field(default_factory=Roles)
    engine: EngineOptions = Field(default_factory=EngineOptions)
    auth: AuthOptions = Field(default_factory=AuthOptions)
    limits: HttpLimits = Field(default_factory=HttpLimits)
    cache_dir: str | None = Field(
        default=None, description="Where converted models live; default ~/.cache/serve-app/models."
    )
    data_dir: str = Field(
        default_factory=lambda: str(default_data_dir()),
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

    @model_validator(mode="after")
    def _ids_and_aliases_are_unique(self) -> AppConfig:
        names = [model.id for model in self.models]
        names += [alias for model in self.models for alias in model.aliases]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"model ids and aliases must be unique: {repeated} repeat")
        return self

    def resolve_model_id(self, name: str) -> str:
        """The id of the model ``name`` names (itself, or the model it is an alias of)."""
        return next((model.id for model in self.models if name in model.aliases), name)

    def model(self, model_id: str) -> ModelConfig:
        return next(model for model in self.models if model.id == model_id)

    def card(self, model_id: str, listing: Endpoint | None = None) -> ModelCard | EndpointModelCard:
        return self.model(model_id).card(self.endpoints_of(model_id), listing)

    def endpoints_of(self, model_id: str) -> list[Endpoint]:
        endpoints: list[Endpoint] = []
        if self.roles.chat and model_id == self.roles.edit:
            endpoints.append("chat.completions")
        if model_id == self.roles.edit:
            endpoints += ["edit.completions", "apply.completions"]
        if model_id == self.roles.fim:
            endpoints.append("fim.completions")
        return endpoints

    @property
    def auth_db(self) -> str:
        return resolve_auth_db(self.auth.db, self.data_dir)
