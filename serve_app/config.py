"""The application's typed configuration: the ``args:`` of a Serve config file.

``configs/local.yaml`` and ``configs/prod.yaml`` carry an ``args:`` block that validates into
``AppConfig``; everything has a default, so ``AppConfig()`` is the embedded-model laptop setup.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from serve_app.engine_config import EngineConfig

DEFAULT_MODEL_ID = "qwen2.5-coder-0.5b"
# The model deployments' jobs, each running its own engine (chat and apply run on the edit one).
EngineRole = Literal["fim", "edit", "decisions"]
ENGINE_ROLES: tuple[EngineRole, ...] = get_args(EngineRole)
# The API's endpoints as listings, billing and metrics name them.
Endpoint = Literal[
    "chat.completions", "edit.completions", "apply.completions", "fim.completions", "decisions"
]
# How next-edit requests are put to a model (serve_app.prompts.next_edit.messages lays each out).
EditPromptStyle = Literal[
    "chat", "chat_split", "tagged", "few_shot", "fim", "chat_span", "sweep", "zeta"
]
# How FIM prompts are laid out (serve_app.prompts.fim).
FimLayout = Literal["psm", "spm"]
# The decisions schema's bound on questions per request; limits.max_questions is the service's.
MAX_QUESTIONS = 4096
AUTH_DB_FILENAME = "auth.sqlite3"


def default_data_dir() -> Path:
    """``$SERVE_APP_DATA_DIR``, else ``~/.local/share/serve-app``; absolute, because replicas
    do not run in the directory ``serve run`` was started from."""
    configured = os.environ.get("SERVE_APP_DATA_DIR")
    base = Path(configured) if configured else Path.home() / ".local" / "share" / "serve-app"
    return base.expanduser().resolve()


def resolve_auth_db(db: str | Path | None = None, data_dir: str | Path | None = None) -> str:
    """The one answer to "which auth store": ``db``, else ``$SERVE_APP_AUTH_DB``, else
    ``<data_dir>/auth.sqlite3`` (``data_dir`` defaults to ``default_data_dir()``)."""
    configured = db or os.environ.get("SERVE_APP_AUTH_DB")
    return str(configured or Path(data_dir or default_data_dir()) / AUTH_DB_FILENAME)


class StrictConfig(BaseModel):
    """Config blocks reject unknown keys: a typo in YAML fails at start, not silently."""

    model_config = ConfigDict(extra="forbid")


class Pricing(StrictConfig):
    """Prices per token as decimal strings, so no float rounding reaches a bill; listings
    publish them as they are configured."""

    prompt: str = "0"
    completion: str = "0"
    input_cache_reads: str = "0"
    input_cache_writes: str = "0"


class ModelConfig(StrictConfig):
    """One hosted model: where its weights come from and how the listings describe it."""

    id: str = DEFAULT_MODEL_ID
    source: str = Field(
        default="embedded:qwen2.5-coder-0.5b",
        description="embedded:<name>, tiny, a Hugging Face model id, or a local folder.",
    )
    name: str | None = Field(
        default=None, description="Default: the embedded model's, else id (listings)."
    )
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
    tool_calls: bool = Field(
        default=True,
        description="The model's chat template calls tools in Qwen2.5's <tool_call> blocks "
        "(the embedded models do): chat lists the tools feature and takes tools. A model "
        "without those markers answers a request with tools with a 400 naming tools.",
    )
    openrouter_slug: str | None = None
    datacenters: list[str] = Field(default_factory=lambda: ["US"])
    aliases: list[str] = Field(
        default_factory=list,
        description=(
            "Other ids a request may name this model by, for clients that hard-code one (Zed "
            "sends mercury-coder); answers and listings carry ``id``."
        ),
    )
    edit_prompt: EditPromptStyle = Field(
        default="chat",
        description="How next-edit requests are put to this model (docs/next_edit.md has "
        "each style's figures from bench/next_edit.py).",
    )
    edit_adapter: str | None = Field(
        default=None,
        description="A LoRA adapter (a peft folder) the next-edit role answers with, applied "
        "per request on this model's weights; apply and chat keep the model's own answers. "
        "builtin:<name> names one shipped in the repository's adapters/ folder, there where "
        "the project is installed from its clone with pip install -e . (docs/next_edit.md). "
        "It must have been trained on edit_prompt's layout. Null: the model alone.",
    )

    fim_layout: FimLayout = Field(
        default="spm",
        description="How FIM prompts are laid out: spm (suffix first, the prefix right before "
        "the answer: a keystroke re-reads only the prompt's last tokens) or psm (prefix, "
        "suffix, middle). docs/fim.md has both layouts' figures from bench/fim_quality.py.",
    )
    fim_token_healing: bool = Field(
        default=True,
        description="With fim_layout spm: a prompt that ends inside a word gives its last "
        "token back for the model to choose again, constrained to spell it (docs/fim.md has "
        "the figures from bench/keystroke.py).",
    )

    draft_model: str | None = Field(
        default=None,
        description="Another configured model's id, of the same tokenizer and smaller, whose "
        "greedy tokens this model checks k at a time for the roles in engine.speculation."
        "draft_model_routes (docs/architecture.md). Null: no draft model.",
    )


class Roles(StrictConfig):
    """Which model each model deployment serves. Chat is served by the edit deployment."""

    fim: str = DEFAULT_MODEL_ID
    edit: str = DEFAULT_MODEL_ID
    decisions: str = DEFAULT_MODEL_ID
    chat: bool = Field(default=True, description="Serve chat completions on the edit model.")

    def model_for(self, role: EngineRole) -> str:
        """The id of the model ``role``'s deployment serves."""
        return {"fim": self.fim, "edit": self.edit, "decisions": self.decisions}[role]


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
    playground: bool = Field(
        default=True,
        description="The browser playground at / (a static page open to anyone; it calls the "
        "API with a key pasted into it).",
    )
    max_concurrent_requests: int | None = Field(
        default=64,
        ge=1,
        description="Requests one account may have in flight at once (429 past it); null: no cap.",
    )


class HttpLimits(StrictConfig):
    """What one HTTP request may be: body size and time, questions, deadlines (not an
    account's limits: those are ``serve_app.auth.AccountLimits``)."""

    # A body is parsed and validated on the router's event loop, in time that grows with its
    # size: 8 MiB is ~50x what a 32k-token prompt spells, and bounds that stall (security.md).
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


# EngineConfig's fields that follow from the role (``AppConfig.engine_for``).
ROLE_SET_FIELDS = frozenset({"task", "score_columns"})


class AppConfig(StrictConfig):
    models: list[ModelConfig] = Field(default_factory=lambda: [ModelConfig()], min_length=1)
    roles: Roles = Field(default_factory=Roles)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    role_engines: dict[EngineRole, dict[str, Any]] = Field(
        default_factory=dict,
        description="Engine settings one model deployment runs with instead of engine's, by "
        "role, e.g. {fim: {prompt_weights: dense}}; a field named replaces engine's whole "
        "(a block such as speculation too).",
    )
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
        for role in ENGINE_ROLES:
            if self.roles.model_for(role) not in known:
                raise ValueError(
                    f"roles.{role} names an unknown model {self.roles.model_for(role)!r}"
                )
        return self

    @model_validator(mode="after")
    def _draft_models_are_other_known_models(self) -> AppConfig:
        known = {model.id for model in self.models}
        for model in self.models:
            if model.draft_model is not None and (
                model.draft_model not in known or model.draft_model == model.id
            ):
                raise ValueError(
                    f"models[{model.id!r}].draft_model must name another configured model, "
                    f"not {model.draft_model!r}"
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

    @model_validator(mode="after")
    def _role_engines_are_engine_settings(self) -> AppConfig:
        for role in self.role_engines:
            try:
                self.engine_for(role)
            except ValidationError as e:
                raise ValueError(f"role_engines.{role}: {e}") from None
        return self

    @model_validator(mode="after")
    def _roles_set_the_engine_task(self) -> AppConfig:
        settings = [set(self.engine.model_fields_set), *map(set, self.role_engines.values())]
        if any(ROLE_SET_FIELDS & fields for fields in settings):
            raise ValueError(
                f"{' and '.join(sorted(ROLE_SET_FIELDS))} are set by each role, not in engine "
                "or role_engines"
            )
        return self

    def engine_for(self, role: EngineRole) -> EngineConfig:
        """The engine settings of ``role``'s deployment: ``engine``, with ``role_engines``'
        fields for it; the decisions role's engine only scores (``EngineConfig.for_scoring``),
        its passes within the decision budget's scored tokens."""
        changes = self.role_engines.get(role)
        engine = self.engine
        if changes:
            engine = EngineConfig.model_validate({**self.engine.model_dump(), **changes})
        if role == "decisions":
            return engine.for_scoring(self.limits.decision_max_scored_tokens)
        return engine

    def served_models(self) -> list[ModelConfig]:
        """The models the model deployments load: each role's, and their draft models."""
        ids = {self.roles.model_for(role) for role in ENGINE_ROLES}
        ids |= {self.model(i).draft_model for i in ids} - {None}
        return [model for model in self.models if model.id in ids]

    def resolve_model_id(self, name: str) -> str:
        """The id of the model ``name`` names (itself, or the model it is an alias of)."""
        return next((model.id for model in self.models if name in model.aliases), name)

    def model(self, model_id: str) -> ModelConfig:
        return next(model for model in self.models if model.id == model_id)

    def role_model(self, role: EngineRole) -> ModelConfig:
        """The model ``role``'s deployment serves."""
        return self.model(self.roles.model_for(role))

    def endpoints_of(self, model_id: str) -> list[Endpoint]:
        endpoints: list[Endpoint] = []
        if self.roles.chat and model_id == self.roles.edit:
            endpoints.append("chat.completions")
        if model_id == self.roles.edit:
            endpoints += ["edit.completions", "apply.completions"]
        if model_id == self.roles.fim:
            endpoints.append("fim.completions")
        if model_id == self.roles.decisions:
            endpoints.append("decisions")
        return endpoints

    @property
    def auth_db(self) -> str:
        return resolve_auth_db(self.auth.db, self.data_dir)

    @property
    def ledger_spool(self) -> Path:
        """Where replicas keep ledger rows the auth store could not take (serving/spool.py)."""
        return Path(self.data_dir) / "ledger-spool"


def serve_file_configs(path: str | Path) -> list[AppConfig]:
    """The ``AppConfig`` of each application of a Serve config file (its ``args:``)."""
    import yaml

    document = yaml.safe_load(Path(path).read_text())
    return [AppConfig.model_validate(app.get("args") or {}) for app in document["applications"]]
