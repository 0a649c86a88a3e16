"""The engine's scheduling knobs (``EngineConfig``) and its metrics snapshot (``EngineStats``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from serve_app.engine.prefix_cache import DEFAULT_PREFIX_CACHE_BYTES


@dataclass
class EngineConfig:
    """Scheduling knobs.

    - ``max_batch_size``: requests holding a slot (prefilling + decoding) at once.
    - ``prefill_chunk_tokens``: prompt tokens read per step, which bounds how long one step
      (and so every running stream's inter-token gap) can take while a long prompt is read.
    - ``context_length``: prompt + max_tokens limit; ``None`` means the model's
      ``max_position_embeddings``.
    - ``prefix_cache_bytes``: prefix cache size (0 disables it);
      ``prefix_cache_min_tokens``: shorter matches count as misses.
    - ``max_waiting``: requests queued without a slot; beyond it ``generate`` raises
      ``UpstreamUnavailableError`` (503) so load balancers back off instead of queueing forever.
    - ``skip_special_tokens``: leave special tokens out of the text (eos never appears).
    - ``runner``: ``auto`` runs supported models (Qwen2) on the engine's own runner, ``hf``
      always on the HF model; ``weights``: the runner's decode weights, ``int4``, ``int8`` or
      ``dense`` (dense = exactly the HF model's numbers); ``prefill_dtype``: ``auto`` (bf16
      where the CPU computes it natively, else fp32), ``float32`` or ``bfloat16``;
      ``small_prefill_tokens``: prompt chunks up to this long that do not start the prompt
      (the tail after a prefix-cache hit) run on the decode weights (``Qwen2Runner.forward``);
      ``prompt_weights``: ``dense``, ``decode`` (every prompt chunk on the decode weights) or
      ``auto`` (decode where those are int8).
    - ``draft_tokens``: prompt-lookup draft length per request role (``GenerationRequest.role``;
      0 or absent = no speculation); needs the runner. ``draft_max_batch``: drafts only while
      the decode batch has at most this many rows (``None``: any batch).
    - ``seed``: the sampling seed of requests that send none, so a repeated request repeats its
      text (as llama-server's ``--seed``); ``None``: a fresh random seed per request.
    """

    max_batch_size: int = 8
    prefill_chunk_tokens: int = 256
    context_length: int | None = None
    prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES
    prefix_cache_min_tokens: int = 1
    max_waiting: int = 64
    skip_special_tokens: bool = True
    runner: str = "auto"
    weights: str = "dense"
    prefill_dtype: str = "auto"
    small_prefill_tokens: int = 0
    prompt_weights: str = "dense"
    draft_tokens: Mapping[str, int] = field(default_factory=dict)
    draft_max_batch: int | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.prefill_chunk_tokens < 1 or self.max_waiting < 0:
            raise ValueError(f"invalid engine config: {self}")
        if self.runner not in ("auto", "hf") or any(k < 0 for k in self.draft_tokens.values()):
            raise ValueError(f"invalid engine config: {self}")


@dataclass
class EngineStats:
    """A snapshot for metrics; counters are totals since start."""

    num_running: int
    num_waiting: int
    num_prefilling: int
    num_decoding: int
    steps: int
    decode_steps: int
    prefill_tokens: int
    peak_decode_batch: int
    requests_finished: int
    requests_aborted: int
    requests_failed: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    prefix_cache_hit_tokens: int
    prefix_cache_bytes: int
    backend: str = "hf"
    draft_tokens: int = 0  # speculative tokens proposed, and of those accepted
    accepted_draft_tokens: int = 0

    @property
    def draft_acceptance(self) -> float:
        return self.accepted_draft_tokens / self.draft_tokens if self.draft_tokens else 0.0
