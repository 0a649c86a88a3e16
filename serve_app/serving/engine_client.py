"""``EngineClient``: a model's engine as the generating services (FIM, next-edit, apply, chat)
use it: the contract's limits checked, requests shaped, streams timed and metered."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any, Protocol, TypeVar

from serve_app.config import ModelConfig
from serve_app.engine.engine import LLMEngine
from serve_app.engine.protocol import GenerationChunk, GenerationRequest, SamplingParams
from serve_app.errors import (
    ContextLengthExceededError,
    InvalidRequestError,
    UpstreamUnavailableError,
)
from serve_app.grammar.token_bytes import TokenTexts
from serve_app.models.loader import LoadedModel
from serve_app.serving.billing import BilledCall
from serve_app.serving.envelope import usage_of

T = TypeVar("T")


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
        route: str = "",
        answer_prefix: str = "",
        adapter: str = "",
    ) -> GenerationRequest:
        """Check the limits of the contract, then shape an engine request in the prefix-cache
        partition of the account ``call`` serves; ``route`` (fim, edit, chat, apply) picks per-route
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
            uuid.uuid4().hex, prompt_ids, params, call.cache_salt, route, answer_prefix, adapter
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
