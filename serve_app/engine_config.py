"""The engine's configuration: one pydantic model, the ``engine:`` block of a Serve config.

``EngineConfig`` is read from the deployment's config (``AppConfig.engine``) and passed down
as is, to the engine, the runner and the decision scorer: one set of defaults, documented
here once. The only per-model value the engine needs beside it, the context length, comes
from the model's own config (``ModelConfig.context_length``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Requests from a route the speculation block does not name draft nothing.
SPECULATING_ROUTES = ("edit", "fim", "chat", "apply")


class _Strict(BaseModel):
    """A typo in YAML fails at start, not silently."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class SpeculationConfig(_Strict):
    """Prompt-lookup draft tokens per route, the endpoint a request came in on (0 = off; needs
    ``runner: auto``), and the routes that fall back to a draft model's tokens. Output is
    unchanged either way; lookup pays where answers copy their prompt (next-edit rewrites a
    region it was given; a completion reuses the names around it), both only while few
    requests decode."""

    edit: int = Field(default=6, ge=0, le=16)
    fim: int = Field(default=2, ge=0, le=16)
    chat: int = Field(default=0, ge=0, le=16)
    apply: int = Field(
        default=16,
        ge=0,
        le=16,
        description="Apply rewrites the original file: drafts from it are mostly accepted "
        "(docs/apply.md).",
    )
    max_batch: int = Field(
        default=2,
        ge=0,
        description="Draft only while the decode batch has at most this many requests: with "
        "few rows a step of k + 1 rows per request costs little more than a plain step, with "
        "more it costs more than the accepted drafts save (docs/benchmarks.md).",
    )

    draft_model_routes: list[Literal["edit", "fim", "chat", "apply"]] = Field(
        default_factory=list,
        description="Routes whose requests, when prompt lookup finds no draft, take the draft "
        "model's (the model's draft_model; docs/architecture.md). Empty, the default: off. On "
        "one CPU thread checking k tokens costs several plain steps and a draft model loses "
        "(python -m bench.draft_model); on a GPU checking k costs about one.",
    )
    draft_model_tokens: int = Field(
        default=4,
        ge=1,
        le=8,
        description="A request's first draft-model draft length; it then grows by one after "
        "a step whose drafts were all kept and shrinks by one after a rejection (1..8).",
    )

    def draft_tokens(self, route: str) -> int:
        """Draft length for a request from ``route`` (0: no speculation)."""
        return getattr(self, route) if route in SPECULATING_ROUTES else 0


NO_SPECULATION = SpeculationConfig(edit=0, fim=0, chat=0, apply=0)


# A scoring engine's requests at once: the runner's slots all grow to the longest one's length,
# and a decision's state may fill the context, so more slots would multiply the KV memory of
# one long state; a decision holds its slot for all its passes, and others wait.
SCORING_SLOTS = 1


class EngineConfig(_Strict):
    """Engine knobs shared by the model deployments (the generating engine and the scorer)."""

    task: Literal["generate", "score"] = Field(
        default="generate",
        description="Set by the role, never in YAML (AppConfig.engine_for): score for the "
        "decisions role's engine, which only scores (prompts read as scoring needs, "
        "``for_scoring``).",
    )
    score_columns: int = Field(
        default=0,
        ge=0,
        description="A scoring engine's KV positions past the context, for its passes "
        "(the decision budget's scored tokens). Set by the role, never in YAML.",
    )

    runner: Literal["auto", "hf"] = Field(
        default="auto",
        description="auto: the engine's own runner for Qwen2 models on CPU and CUDA GPUs "
        "(the HF model for others); hf: always the HF model (the reference).",
    )
    weights: Literal["auto", "q4", "int4", "int8", "dense"] = Field(
        default="auto",
        description="The runner's decode weights: auto (q4 wherever torch has its "
        "fbgemm/x86 int8 engine and the runner's C kernels build, int8 where only the first "
        "holds, else int4; on a GPU dense), q4 (the runner's own 4-bit kernel, 5 bits a "
        "weight, decoding faster than int8; prompts as prompt_weights says, its LM head on "
        "8 bits, int8_kernel's; needs a C "
        "compiler, else int8), int4 (torch's groupwise kernel, packed once next to the model "
        "and shared by replicas), int8 (8 bits, int8_kernel's: faster decode than fp32 on "
        "AVX2) or dense (the model's own numbers). q4, int4 and "
        "int8 run on CPU only: asked for on a GPU, the replica fails at start.",
    )
    prefill_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto",
        description="auto: bf16 where the CPU computes it natively and prompts are read on "
        "the dense weights, else fp32 (the model's own tensors, no copy); on a GPU the "
        "model's dtype.",
    )
    prompt_weights: Literal["auto", "dense", "decode", "q4"] = Field(
        default="auto",
        description="The runner's weights for reading prompts (prefill chunks and decision "
        "scoring): q4 (q4's 4-bit layers themselves, the LM head on 8 bits: one copy of the "
        "layers in memory for decode steps, prompts and the scorer), decode (the decode "
        "weights, on q4 its 8-bit copy), in both the prompt's first token on dense weights, "
        "once per token id; dense; or auto (q4 where the decode weights are q4, decode where "
        "int8, dense elsewhere; docs/benchmarks.md).",
    )
    int8_kernel: Literal["auto", "q8", "fbgemm"] = Field(
        default="auto",
        description="The kernel of the runner's 8-bit weights (prompts and scores on the "
        "decode weights, the LM head beside q4, decode steps on int8): q8 (the runner's own, "
        "one scale per 32 inputs on weights and activations, rounded once; one file mapped "
        "and shared by every replica), fbgemm (torch's, one scale per row; a second rounding "
        "pass where precision matters; a private pack per replica), or auto (q8 wherever the "
        "runner's C kernels run on AVX2 or AVX512-VNNI, else fbgemm).",
    )
    cuda_graphs: bool = Field(
        default=True,
        description="On a CUDA GPU, decode steps whose rows feed one token each replay a "
        "captured CUDA graph (one per batch-size bucket), not one kernel launch at a time. "
        "false: every step eager (to compare). No effect on CPU.",
    )
    small_prefill_tokens: int = Field(
        default=0,
        ge=0,
        le=256,
        description="With dense prompts, a prompt chunk of at most this many tokens after the "
        "prompt's first position (the tail after a prefix-cache hit) runs on the decode "
        "weights: faster, but a cached prompt's tail is then read on other weights than "
        "a cold one's, and the same request may answer differently cached and cold. 0 (the "
        "default): always the prompt weights, so cached and cold answer alike.",
    )
    speculation: SpeculationConfig = Field(default_factory=SpeculationConfig)

    max_batch_size: int = Field(
        default=8, ge=1, description="Requests holding a slot (prefilling + decoding) at once."
    )
    prefill_chunk_tokens: int = Field(
        default=256,
        ge=1,
        description="Prompt tokens read per step: bounds how long one step (and so every "
        "running stream's inter-token gap) can take while a long prompt is read.",
    )
    prefix_cache_mb: int = Field(default=512, ge=0, description="Prefix cache size; 0: off.")
    max_waiting: int = Field(
        default=64,
        ge=0,
        description="Requests queued without a slot; past it a 503, so load balancers back "
        "off instead of queueing forever.",
    )
    shared_prefix_cache: bool = Field(
        default=False,
        description="One prefix cache for every account. Only for one-tenant deployments: "
        "shared, an account can read another's prompts back through cached_input_tokens.",
    )
    torch_threads: int | None = Field(
        default=None, ge=1, description="Intra-op threads per replica; default: the CPU allotment."
    )
    prompt_threads: int | None = Field(
        default=None,
        ge=1,
        description="Intra-op threads while the engine reads prompts (prefill chunks, "
        "scoring passes); decode steps keep torch_threads. Reading a prompt is bound by "
        "compute and scales with threads, a decode step by reading weights, where a second "
        "thread's wake-ups cost more than it saves (engine/threads.py); null: torch_threads.",
    )
    seed: int | None = Field(
        default=None,
        description="Sampling seed of requests that send none (each request's sampler starts "
        "from it, so a repeated request repeats its text, as llama-server's --seed); null: a "
        "fresh random seed per request.",
    )

    def for_scoring(self, score_columns: int) -> EngineConfig:
        """These settings for an engine that only scores: ``SCORING_SLOTS`` requests at once,
        passes up to ``score_columns`` positions past the context."""
        return self.model_copy(
            update={
                "task": "score",
                "score_columns": score_columns,
                "max_batch_size": SCORING_SLOTS,
            }
        )

    @property
    def prefix_cache_bytes(self) -> int:
        return self.prefix_cache_mb * 1024 * 1024
