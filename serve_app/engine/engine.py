"""``LLMEngine``: continuous batching, chunked prefill and a prefix cache over an HF model.

One background thread runs the step loop; callers on any asyncio loop feed it a locked waiting
queue and read their own ``asyncio.Queue`` (filled via an ``Outbox``: one
``call_soon_threadsafe`` per step phase, not per token). torch releases the GIL in its kernels,
so the replica's event loop stays responsive. One step (``_step``):

1. admit waiting requests (FCFS) while fewer than ``max_batch_size`` hold a slot;
2. prefill: spend ``prefill_chunk_tokens`` prompt tokens on prefilling requests, oldest first,
   up to ``prompt_batch`` per forward, each from its longest prefix-cache hit: a long prompt
   takes several steps while decode keeps streaming, short ones share a step. A read prompt's
   KV goes into the prefix cache; it joins decoding with a first token sampled from its logits;
3. decode: one batched forward for every decoding request (a replayed CUDA graph on a GPU,
   ``runner/graphs.py``), then per row: sample (plain greedy rows: one argmax), detokenize, match
   stops, stream; a row whose role speculates also verifies a draft (``speculator``);
4. drop finished and aborted requests, freeing their slots.

Scoring requests (``score``: decisions) read their prefix in step 2 like any prompt (chunked,
through their account's prefix cache), then run one pass per step (a tree row on the prefix,
``engine.tree``) and stream its log-probabilities; nothing is sampled. Aborts are checked
between decoder layers (``RequestAborted``), so a long chunk or pass stops within one layer.

On CPU each request's prompt chunk is a forward of its own: chunks already keep the CPU busy,
padding would waste the compute prefill is bound by, and a lone chunk keeps its aligned
attention (same bits however a prompt is cut). On a GPU, where a forward per request is
launch-bound, all prefilling chunks share one (``RunnerBackend.prompt_batch``).

Parts, one module each, set up by one ``EngineConfig``: ``scheduler``, ``model_backend`` (own
runner or HF reference, picked once), ``output``, ``speculator``, ``reuse``, ``stats``; this
loop drives them.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import aclosing
from pathlib import Path
from typing import Any

import torch

from serve_app.config import AppConfig, EngineRole, ModelConfig
from serve_app.engine.backend_choice import make_backend, make_drafter
from serve_app.engine.constraints import TokenTexts
from serve_app.engine.outbox import Outbox
from serve_app.engine.output import OutputProcessor
from serve_app.engine.prefill import PromptPhase
from serve_app.engine.prefix_cache import PrefixCache
from serve_app.engine.protocol import (
    Engine,
    GenerationChunk,
    GenerationRequest,
    ScoringChunk,
    ScoringRequest,
)
from serve_app.engine.requests import (
    STREAM_END,
    RequestAborted,
    RequestState,
    ScoringState,
    State,
    StreamEnd,
    new_request_state,
)
from serve_app.engine.reuse import PromptReuse
from serve_app.engine.scheduler import Scheduler
from serve_app.engine.speculator import Speculator
from serve_app.engine.startup import load_draft_model, load_role_model, role_adapters
from serve_app.engine.stats import EngineCounters, EngineStats
from serve_app.engine.threads import PhaseThreads
from serve_app.engine_config import EngineConfig
from serve_app.errors import (
    ContextLengthExceededError,
    InvalidRequestError,
    ServerError,
    ServiceError,
    UpstreamUnavailableError,
)
from serve_app.models.loader import LoadedModel

logger = logging.getLogger(__name__)

# Idle seconds before the backend gives memory back (``ModelBackend.idle``). Freed at once, the
# KV cache would regrow first for a typist's next keystroke (most of a repeated FIM prompt's time).
IDLE_TRIM_S = 10.0

# How often ``wait_until_idle`` polls (an event would cost every step; only benches/tests ask).
IDLE_POLL_S = 0.002

# Whole steps failing in a row before the loop gives up and ``check_health`` reports it.
MAX_CONSECUTIVE_STEP_FAILURES = 10


class LLMEngine(Engine):
    """Serves many generation requests at once on one model (module docstring). ``context_length``:
    prompt + max_tokens limit (``ModelConfig.context_length``; None: the model's
    ``max_position_embeddings``). With ``config.task`` ``score`` it only scores
    (``EngineConfig.for_scoring``, ``builder.configured_runner``). ``adapters``: LoRA adapters (peft
    folders) by the name a request gives in ``GenerationRequest.adapter``."""

    def __init__(
        self,
        loaded: LoadedModel,
        config: EngineConfig | None = None,
        context_length: int | None = None,
        *,
        draft: LoadedModel | None = None,
        adapters: Mapping[str, Path] | None = None,
    ) -> None:
        self.loaded = loaded
        self.config = config or EngineConfig()
        self.tokenizer = loaded.tokenizer
        self.context_length = context_length or loaded.max_position_embeddings
        self.eos_token_ids = frozenset(loaded.eos_token_ids)
        # Byte strings of the whole vocabulary, for JSON-constrained decoding (built once).
        self.token_texts = TokenTexts.for_tokenizer(self.tokenizer)
        self.prefix_cache = PrefixCache(self.config.prefix_cache_bytes)
        self.counters = EngineCounters()
        self.max_columns = self.context_length + self.config.score_columns
        self.backend = make_backend(loaded, self.config, self.max_columns, adapters)
        self.adapters = frozenset(adapters or {})
        self.drafter = make_drafter(draft, self.config, self.backend, loaded, self.max_columns)
        self.speculator = Speculator(
            self.config.speculation,
            self.backend.supports_speculation,
            self.drafter,
            self.context_length,
            self.counters,
        )
        self.reuse = PromptReuse(
            self.prefix_cache, self.backend, self.token_texts, self.speculator.draft_tokens
        )
        self.scheduler = Scheduler(
            self.backend, self.config.max_batch_size, self.config.max_waiting, self.reuse.keep
        )
        self.output = OutputProcessor(self.eos_token_ids, self.counters, self.scheduler.forget)
        self.prompts = PromptPhase(
            self.config.prefill_chunk_tokens,
            self.scheduler,
            self.backend,
            self.reuse,
            self.output,
            self.counters,
            self._abort_check,
        )
        self.outbox = Outbox()  # what requests push goes out after each phase of a step
        self._wakeup = threading.Event()
        self._stopping = False
        self._fatal: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="llm-engine-loop", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(
        cls,
        config: AppConfig,
        role: EngineRole,
        *,
        model: ModelConfig | None = None,
        cpus: float | None = None,
    ) -> LLMEngine:
        """The engine of ``role``'s deployment, as vLLM's ``from_engine_args``: config in, a
        running engine out. ``model`` defaults to the one ``config.roles`` names for ``role``;
        its weights, draft model and adapters load with the role's settings
        (``AppConfig.engine_for``: the decisions role's engine only scores); ``cpus``: the
        replica's CPU allotment, which sizes torch's thread pool."""
        model = model or config.role_model(role)
        return cls(
            load_role_model(config, model, role, cpus),
            config.engine_for(role),
            model.context_length,
            draft=load_draft_model(config, model, role, cpus),
            adapters=role_adapters(model, role),
        )

    # ------------------------------------------------------------------ caller side (any thread)

    async def generate(
        self, request: GenerationRequest, *, context_param: str = "messages"
    ) -> AsyncIterator[GenerationChunk]:
        """Stream chunks for one request until one carries a ``finish_reason``. ``context_param``:
        the request field blamed when prompt + max_tokens exceeds the context length (``"messages"``
        for chat, ``"prompt"`` for completions/FIM). Raises
        ``InvalidRequestError``/``ContextLengthExceededError`` before anything runs,
        ``UpstreamUnavailableError`` when the waiting queue is full or the engine is down, and
        ``ServerError`` when the request failed in the loop. Closing or cancelling the generator
        aborts the request; aborted by ``abort(request_id)``, the stream just ends, unfinished."""
        state = self._new_state(request, context_param, asyncio.get_running_loop())
        # aclosing: closing this generator aborts the request at once (``_stream``'s finally),
        # not when the event loop gets round to finalizing the inner generator.
        async with aclosing(self._stream(state, lambda c: c.finish_reason is not None)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def score(self, request: ScoringRequest) -> AsyncIterator[ScoringChunk]:
        """Stream one chunk per pass of a scoring request (the last has ``done`` set). Raises,
        before anything runs, ``InvalidRequestError`` for an empty prefix or pass list and
        ``ContextLengthExceededError`` (param ``state``) when the prefix and its widest pass do
        not fit; otherwise as ``generate``."""
        self._raise_if_down()
        if not request.prompt_token_ids or not request.passes:
            raise InvalidRequestError("A scoring request needs a prefix and passes.")
        widest = max(len(row) for row in request.passes)
        if len(request.prompt_token_ids) + widest > self.max_columns:
            raise ContextLengthExceededError.for_limit(self.context_length, "state")
        state = ScoringState(
            request=request,
            queue=asyncio.Queue(),
            loop=asyncio.get_running_loop(),
            outbox=self.outbox,
        )
        async with aclosing(self._stream(state, lambda chunk: chunk.done)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def _stream(self, state: State, is_last: Callable[[Any], bool]) -> AsyncIterator[Any]:
        """Queue ``state``; yield what the loop hands back until ``is_last(item)``."""
        self.scheduler.enqueue(state, self._raise_if_down)
        self._wakeup.set()
        ended = False
        try:
            while True:
                item = await state.queue.get()
                if isinstance(item, StreamEnd):
                    ended = True
                    return
                if isinstance(item, BaseException):
                    ended = True
                    if isinstance(item, ServiceError):
                        raise item
                    raise ServerError(f"the request failed: {item!r}") from item
                ended = is_last(item)
                yield item
                if ended:
                    return
        finally:
            if not ended:
                self._request_abort(state)

    def abort(self, request_id: str) -> None:
        for state in self.scheduler.find(request_id):
            self._request_abort(state)

    def check_health(self) -> None:
        if self._fatal is not None:
            raise ServerError(f"engine step loop died: {self._fatal!r}") from self._fatal
        if self._stopping:
            raise UpstreamUnavailableError("The engine is shut down.")
        if not self._thread.is_alive():
            raise ServerError("engine step loop is not running")

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the loop (in-flight requests get ``UpstreamUnavailableError``), free the cache."""
        self._stopping = True
        self._wakeup.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        self.prefix_cache.clear()

    @property
    def num_running(self) -> int:
        return self.scheduler.num_running

    @property
    def num_waiting(self) -> int:
        return self.scheduler.num_waiting

    async def wait_until_idle(self, timeout: float) -> bool:
        """True once the loop holds no request (running or waiting), False after ``timeout`` s.
        A closed stream's abort, and the slot of a request done at its first token, land at the
        next step: to see what stayed behind, read ``stats()`` after this, not as streams end."""
        deadline = time.monotonic() + timeout
        while self.num_running or self.num_waiting:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(IDLE_POLL_S)
        return True

    def stats(self) -> EngineStats:
        cache = self.prefix_cache
        return EngineStats(
            **vars(self.counters),
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            num_prefilling=len(self.scheduler.prefilling),
            num_decoding=len(self.backend),
            prefix_cache_queries=cache.queries,
            prefix_cache_hits=cache.hits,
            prefix_cache_hit_tokens=cache.hit_tokens,
            prefix_cache_bytes=cache.bytes_used,
            draft_model_read_tokens=self.drafter.tokens_read if self.drafter else 0,
            backend=type(self.backend).__name__,
        )

    def _new_state(
        self, request: GenerationRequest, context_param: str, loop: asyncio.AbstractEventLoop
    ) -> RequestState:
        """Validate a request and build its state (on the caller's thread, so errors are 4xx)."""
        self._raise_if_down()
        if request.adapter and request.adapter not in self.adapters:
            raise InvalidRequestError(f"This model has no adapter {request.adapter!r}.")
        return new_request_state(
            request,
            context_param,
            loop,
            self.outbox,
            context_length=self.context_length,
            tokenizer=self.tokenizer,
            token_texts=self.token_texts,
            eos_token_ids=self.eos_token_ids,
            default_seed=self.config.seed,
        )

    def _raise_if_down(self) -> None:
        if self._stopping or self._fatal is not None or not self._thread.is_alive():
            raise UpstreamUnavailableError("The engine is not running.")

    def _request_abort(self, state: RequestState) -> None:
        state.abort_requested = True
        self._wakeup.set()

    # ------------------------------------------------------------------ the step loop (its thread)

    def _run(self) -> None:
        failures = 0
        threads = PhaseThreads(self.config.prompt_threads)
        try:
            with torch.inference_mode():
                trimmed = True
                while not self._stopping:
                    if not self.scheduler.has_work():
                        if trimmed:
                            self._wakeup.wait(timeout=1.0)
                        elif not self._wakeup.wait(timeout=IDLE_TRIM_S):
                            self.backend.idle()
                            trimmed = True
                        self._wakeup.clear()
                        continue
                    trimmed = False
                    try:
                        self._step(threads)
                        failures = 0
                    except Exception as e:  # bookkeeping bug: fail what is in flight, go on
                        failures += 1
                        logger.exception("engine step failed (%d in a row)", failures)
                        self._fail_all(e, include_waiting=False)
                        if failures >= MAX_CONSECUTIVE_STEP_FAILURES:
                            raise
                    finally:
                        self.outbox.flush()
        except BaseException as e:
            self._fatal = e
            logger.critical("engine step loop died", exc_info=True)
        finally:
            error = UpstreamUnavailableError("The engine stopped before the request finished.")
            self._fail_all(error, include_waiting=True)
            self.outbox.flush()

    def _step(self, threads: PhaseThreads) -> None:
        aborted = self.scheduler.reap_aborted()
        self.counters.requests_aborted += len(aborted)
        for state in aborted:  # counted, then forgotten: the slot reads free after the count
            self.scheduler.forget(state)
        for state in aborted:  # after the slots are free, so callers see them free
            state.push(STREAM_END)
        self.scheduler.admit()
        with threads.reading_prompts():
            self.prompts.step()
            self.outbox.flush()  # first tokens go out before the decode step, not after it
            self._score_step()
            self.outbox.flush()
        self._decode_step()
        self.scheduler.drop_done()
        self.counters.steps += 1

    def _score_step(self) -> None:
        """One pass of every scoring request whose prefix is read."""
        for state in list(self.scheduler.scoring):
            row = state.request.passes[state.next_pass]
            try:
                log_probs = self.backend.score(state, row, self._abort_check(state))
            except RequestAborted:  # ended at the next step's reap
                continue
            except Exception as e:
                logger.exception("scoring failed for request %s", state.request_id)
                self.output.fail(state, e)
                continue
            state.next_pass += 1
            state.pass_tokens += len(row)
            self.counters.scored_tokens += len(row)
            chunk = state.chunk(log_probs)
            if chunk.done:
                self.output.complete(state, chunk)
            else:
                state.push(chunk)

    def _abort_check(self, *states: State) -> Callable[[], None]:
        """Between decoder layers: end a forward once all its requests abort or the engine stops."""

        def check() -> None:
            if self._stopping or all(state.abort_requested for state in states):
                raise RequestAborted(states[0].request_id)

        return check

    def _decode_step(self) -> None:
        joining = self.scheduler.take_joining()
        if joining:
            self.backend.join(joining)
        rows = list(self.backend.rows)
        if not rows:
            return
        drafts = self.speculator.drafts(rows)
        try:
            logits = self.backend.decode(drafts)
        except Exception as e:  # cannot tell whose fault: fail the rows, rebuild from empty
            logger.exception("decode forward failed for %d requests", len(rows))
            for state in rows:
                self.output.fail(state, e)
            self._reset_backend()
            return
        self.counters.decode_batch(len(rows))
        self.speculator.verify(rows, drafts, logits, self.output)

    def _fail_all(self, error: BaseException, include_waiting: bool) -> None:
        for state in self.scheduler.clear(include_waiting):
            self.output.fail(state, error)
        self._reset_backend()

    def _reset_backend(self) -> None:
        self.backend.reset()
        self.speculator.release()
