"""What every generating service shares: limits, engine start-up and usage."""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any, Protocol, TypeVar

from serve_app.api.common import CompletionUsage, new_id, now
from serve_app.config import AppConfig, EngineRole, ModelConfig
from serve_app.engine.engine import LLMEngine
from serve_app.engine.protocol import GenerationChunk, GenerationRequest, SamplingParams
from serve_app.engine.runner.lora import AdapterError
from serve_app.errors import (
    ContextLengthExceededError,
    InvalidRequestError,
    UpstreamUnavailableError,
)
from serve_app.grammar.token_bytes import TokenTexts
from serve_app.models.loader import (
    TRAINING_RECORD,
    LoadedModel,
    adapter_path,
    load_model,
    training_record,
)
from serve_app.serving.billing import BilledCall

T = TypeVar("T")


def load_configured_model(
    config: AppConfig, model: ModelConfig, role: EngineRole, cpus: float | None = None
) -> LoadedModel:
    """Load ``model`` as configured for ``role``'s deployment: the one way a deployment gets
    weights.

    torch's thread pool is sized from the replica's CPU allotment unless the config says
    otherwise, so replicas sharing a machine don't oversubscribe its cores.
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


def start_engine(
    config: AppConfig, model: ModelConfig, role: EngineRole, cpus: float | None = None
) -> LLMEngine:
    """Load ``model`` (and its draft model, where one is configured and a role uses it) and
    start the engine of ``role``'s deployment, with the role's settings
    (``AppConfig.engine_for``: the decisions role's engine only scores). The one way a
    deployment gets an engine."""
    engine = config.engine_for(role)
    loaded = load_configured_model(config, model, role, cpus)
    draft = None
    drafting = engine.task == "generate" and engine.speculation.draft_model_roles
    if model.draft_model is not None and drafting:
        draft = load_configured_model(config, config.model(model.draft_model), role, cpus)
    return LLMEngine(
        loaded, engine, model.context_length, draft=draft, adapters=role_adapters(model, role)
    )


# The engine's name for a model's ``edit_adapter``, which next-edit requests run with.
EDIT_ADAPTER = "next-edit"


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


class GenerationObserver(Protocol):
    """Told about streaming latency; deployments report it as metrics."""

    def first_token(self, seconds: float) -> None: ...

    def token_gap(self, seconds: float) -> None: ...


class _Unobserved:
    def first_token(self, seconds: float) -> None:
        pass

    def token_gap(self, seconds: float) -> None:
        pass


class EngineClient:
    """A model's engine plus the checks every generation request gets."""

    def __init__(
        self, engine: LLMEngine, model: ModelConfig, observer: GenerationObserver | None = None
    ) -> None:
        self.engine = engine
        self.model = model
        self.observer = observer or _Unobserved()

    @property
    def loaded(self) -> LoadedModel:
        return self.engine.loaded

    @property
    def tokenizer(self):
        return self.engine.loaded.tokenizer

    def check_input_size(self, chars: int, param: str) -> None:
        """Refuse, before tokenising it, text that cannot fit the context: a character is at
        least one byte and no token spells more than ``max_token_bytes`` bytes."""
        max_token_bytes = TokenTexts.for_tokenizer(self.tokenizer).max_token_bytes
        if chars > self.model.context_length * max_token_bytes:
            raise ContextLengthExceededError.for_limit(self.model.context_length, param)

    async def off_loop(self, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run CPU work (tokenising a prompt, compiling a schema) on a worker thread, so one
        large request cannot stall the other streams this replica's event loop serves."""
        return await asyncio.to_thread(work, *args, **kwargs)

    def default_max_tokens(self, prompt_ids: list[int], cap: int) -> int:
        """A request's output limit when it names none (chat, apply): ``cap`` or the model's
        limit, and never more than the context leaves after the prompt, as OpenAI's API does
        (a long conversation gets a shorter answer, not a context-length error)."""
        room = self.model.context_length - len(prompt_ids)
        return max(1, min(cap, self.model.max_output_length, room))

    def request(
        self,
        call: BilledCall,
        prompt_ids: list[int],
        params: SamplingParams,
        prompt_param: str,
        role: str = "",
        answer_prefix: str = "",
        adapter: str = "",
    ) -> GenerationRequest:
        """Check the limits of the contract, then shape an engine request in the prefix-cache
        partition of the account ``call`` serves; ``role`` (fim, edit, chat) picks per-role
        engine settings such as speculation; ``adapter``: the engine's LoRA adapter to run
        with ("": none)."""
        if params.max_tokens > self.model.max_output_length:
            raise InvalidRequestError(
                f"max_tokens is {params.max_tokens}; this model produces at most "
                f"{self.model.max_output_length} tokens.",
                param="max_tokens",
            )
        if len(prompt_ids) + params.max_tokens > self.model.context_length:
            raise ContextLengthExceededError.for_limit(self.model.context_length, prompt_param)
        return GenerationRequest(
            uuid.uuid4().hex, prompt_ids, params, call.cache_salt, role, answer_prefix, adapter
        )

    async def stream(
        self, call: BilledCall, request: GenerationRequest
    ) -> AsyncIterator[GenerationChunk]:
        """The engine's chunks, timed (time to first text and the gaps between pieces) and
        metered on ``call``: from the moment it is queued, the request is billed its whole
        prompt."""
        meter = call.meter
        meter.update(len(request.prompt_token_ids), 0)
        start = last = time.perf_counter()
        first = True
        # aclosing: closing this stream closes the engine's at once, which aborts the request
        # and frees its slot at the loop's next step; left to the garbage collector, the
        # inner generator would close only when the event loop got round to finalizing it.
        async with aclosing(self.engine.generate(request)) as chunks:
            async for chunk in chunks:
                meter.update(chunk.prompt_tokens, chunk.completion_tokens)
                if chunk.text:
                    now = time.perf_counter()
                    if first:
                        self.observer.first_token(now - start)
                    else:
                        self.observer.token_gap(now - last)
                    first, last = False, now
                yield chunk

    async def stream_chunks(
        self,
        call: BilledCall,
        request: GenerationRequest,
        chunk: Callable[..., T],
        choice_of: Callable[[GenerationChunk], Any],
    ) -> AsyncIterator[T]:
        """The stream every streaming endpoint sends: ``chunk([choice_of(piece)], usage)`` for
        each piece worth sending (new text or a finish), then ``chunk([], usage)`` once. A
        content chunk's usage is the running count (the router bills it if the replica dies
        mid-stream, and leaves it off the wire)."""
        last = None
        async with aclosing(self.stream(call, request)) as pieces:
            async for piece in pieces:
                last = piece
                if piece.text or piece.finish_reason:
                    yield chunk([choice_of(piece)], usage_of(piece))
        if last is not None:
            yield chunk([], usage_of(last))

    async def complete(
        self, call: BilledCall, request: GenerationRequest
    ) -> tuple[str, GenerationChunk]:
        """All of a request's text and its last chunk (finish reason and usage)."""
        parts: list[str] = []
        last: GenerationChunk | None = None
        async with aclosing(self.stream(call, request)) as chunks:
            async for chunk in chunks:
                parts.append(chunk.text)
                last = chunk
        if last is None or last.finish_reason is None:
            raise UpstreamUnavailableError("The request was aborted before it finished.")
        return "".join(parts), last


def chunk_maker(chunk_type: Callable[..., T], id_prefix: str, model: str) -> Callable[..., T]:
    """``chunk(choices, usage=None)`` for one stream: every chunk of a stream carries the
    same id, creation time and model."""
    completion_id, created = new_id(id_prefix), now()

    def chunk(choices: list[Any], usage: CompletionUsage | None = None) -> T:
        return chunk_type(
            id=completion_id, created=created, model=model, choices=choices, usage=usage
        )

    return chunk


def completion(
    response_type: Callable[..., T], id_prefix: str, model: str, choice: Any, usage: CompletionUsage
) -> T:
    """A whole (non-streamed) answer of one choice, with a new id and creation time: the
    envelope every endpoint's completion shares, as ``chunk_maker`` is for its chunks."""
    return response_type(
        id=new_id(id_prefix), created=now(), model=model, choices=[choice], usage=usage
    )


def usage_of(chunk: GenerationChunk) -> CompletionUsage:
    return CompletionUsage.from_counts(
        chunk.prompt_tokens, chunk.completion_tokens, chunk.cached_tokens
    )
