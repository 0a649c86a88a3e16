"""What the engine takes and gives: plain dataclasses, no HTTP and no Ray.

``serve_app.api`` request models convert themselves to ``SamplingParams``; deployments hand
those to an ``Engine`` and turn its ``GenerationChunk`` stream into wire objects."""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from serve_app.errors import UpstreamUnavailableError

FinishReason = Literal["stop", "length"]

# The prefix-cache partition of a deployment that shares one cache across accounts.
SHARED_CACHE = "shared"
# Where a request's public head is kept (``ScoringRequest.public_prefix``): text no client
# wrote, so every account may read its KV; no account's salt is this.
PUBLIC_CACHE = "public"


# Temperatures this small pick the top token anyway; vLLM's _SAMPLING_EPS.
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. Defaults are the neutral values (greedy, no penalty, no cutoff).

    - ``temperature`` divides the logits; 0, or below ``GREEDY_BELOW`` (dividing by 1e-300
      overflows them), means greedy (argmax). ``top_p``: nucleus cutoff in (0, 1]; ``top_k``:
      -1 means no cutoff.
    - ``frequency_penalty`` / ``presence_penalty``: OpenAI semantics over the *generated* tokens:
      ``logit -= count * frequency_penalty + (count > 0) * presence_penalty``.
    - ``repetition_penalty``: the CTRL/HF multiplicative rule over prompt *and* generated tokens:
      a seen token's logit is divided by the penalty when positive, multiplied when negative.
    - ``stop``: strings that end generation, never in the returned text. ``seed``: when given,
      makes sampling reproducible per request.
    - ``response_format``: OpenAI's ``{"type": "json_object" | "json_schema", ...}``, output
      constrained to JSON valid against the schema (``engine.constraints``); ``tool_calls``:
      functions the answer may call, their blocks constrained likewise
      (``engine.tool_call_grammar``).
    """

    max_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    response_format: Mapping[str, Any] | None = None
    tool_calls: ToolCallFormat | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


@dataclass(frozen=True)
class ToolCallFormat:
    """A chat request's functions (name, JSON schema of its arguments or None), whether its
    answer must be calls only (``required``: tool_choice required or a named function) and may
    hold several (``parallel``). ``engine.tool_call_grammar`` decodes them."""

    functions: tuple[tuple[str, Mapping[str, Any] | None], ...]
    required: bool = False
    parallel: bool = True


@dataclass
class GenerationChunk:
    """One step's worth of output for one request. ``text``: new since the previous chunk,
    whole UTF-8 characters only, never any part of a stop sequence. ``token_ids``: the tokens
    sampled since the previous chunk (text held back by the detokenizer or a partial stop match
    comes later, its tokens now). The last chunk has ``finish_reason`` set; token counts are
    running totals, so it carries the request's usage."""

    text: str
    finish_reason: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    token_ids: tuple[int, ...] = ()


@dataclass
class GenerationRequest:
    """``cache_salt``: the prefix-cache partition it may read and write (the account's;
    ``SHARED_CACHE`` only where the deployment opted into one shared cache); no default, so a
    request naming none is a type error, never a shared cache. ``route``: the endpoint the
    request came in on (``fim``, ``edit``, ``chat``, ``apply``), which per-route settings
    (speculation) key on.
    ``answer_prefix``: text the answer must begin with, not returned (token healing: the
    prompt's last tokens, a partial word or blanks at the cursor, were taken off for the model
    to spell its own way). ``adapter``: the LoRA adapter's engine name ("": base model)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    cache_salt: str
    route: str = ""
    answer_prefix: str = ""
    adapter: str = ""

    @property
    def cache_partition(self) -> str:
        return cache_partition(self.cache_salt, self.adapter)


@dataclass
class ScoringRequest:
    """A prefill-only request: ``prompt_token_ids``, the prefix all passes share, read once like any
    prompt (through ``cache_salt``'s prefix cache), then each of ``passes`` (``engine.tree.Row``: a
    token tree on the prefix) run in one forward and read at its ``reads``; nothing is sampled."""

    request_id: str
    prompt_token_ids: list[int]
    passes: list[Any]
    cache_salt: str
    # The prefix's first tokens that the service wrote itself, the same for every account (the
    # decisions prompt's fixed head): their KV is kept apart (``PUBLIC_CACHE``) for every
    # account to read, so an account's first request reads only its own state.
    public_prefix: int = 0

    adapter = ""  # scoring runs on the base model's weights

    @property
    def cache_partition(self) -> str:
        return cache_partition(self.cache_salt, self.adapter)


def cache_partition(salt: str, adapter: str) -> str:
    """Where a request's prompts are kept in the prefix cache: its account's ``salt``, apart
    per LoRA adapter, since an adapter's keys and values are not the base model's."""
    return f"{salt}\x00lora:{adapter}" if adapter else salt


@dataclass
class ScoringChunk:
    """One pass of a scoring request done: its reads' log-probabilities (float64, in the row's
    ``reads`` order). Running totals: ``prompt_tokens`` the prefix (``cached_tokens`` of it from
    the cache) plus every pass's tokens so far. The last chunk has ``done`` set."""

    pass_index: int
    log_probs: list[float]
    prompt_tokens: int
    cached_tokens: int
    done: bool


class Engine(abc.ABC):
    """A text generator that serves many requests at once (continuous batching)."""

    @abc.abstractmethod
    def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        """Stream chunks for one request; the caller's cancellation aborts it."""

    @abc.abstractmethod
    def abort(self, request_id: str) -> None:
        """Stop a request and free its slot at the next step (no-op when unknown/finished)."""

    @abc.abstractmethod
    def check_health(self) -> None:
        """Raise when the engine can no longer serve (its step loop died)."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """Stop the step loop and release the model."""


async def generate_text(
    engine: Engine, request: GenerationRequest, **kwargs: Any
) -> tuple[str, GenerationChunk]:
    """Run a request to the end; returns all its text and its last chunk (usage, finish)."""
    parts: list[str] = []
    last: GenerationChunk | None = None
    async for chunk in engine.generate(request, **kwargs):
        parts.append(chunk.text)
        last = chunk
    if last is None or last.finish_reason is None:
        raise UpstreamUnavailableError("The request was aborted before it finished.")
    return "".join(parts), last
