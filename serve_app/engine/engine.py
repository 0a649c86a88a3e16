"""``LLMEngine``: continuous batching, chunked prefill and a prefix cache over an HF model.

One background thread runs the step loop; callers on any asyncio loop talk to it through a
locked waiting queue (in) and their own ``asyncio.Queue`` (out, filled with
``loop.call_soon_threadsafe``). torch releases the GIL inside its kernels, so the replica's
event loop stays responsive while the loop computes.

One step (``_step``):

1. admit waiting requests while fewer than ``max_batch_size`` hold a slot (FCFS);
2. prefill: spend a budget of ``prefill_chunk_tokens`` prompt tokens on the prefilling
   requests, oldest first, one forward per request (a request's first chunk starts after its
   longest prefix-cache hit). A long prompt is thus read over several steps while the decode
   batch keeps streaming (chunked prefill), and several short prompts share one step. When a
   prompt is fully read, its KV goes into the prefix cache, its first token is sampled from
   the last position's logits, and it joins the decode batch;
3. decode: one batched forward for every decoding request, then per row: sample, detokenize,
   match stop sequences, and stream the new text. With speculation on for the request's role,
   a row also feeds a prompt-lookup draft and keeps the verified prefix
   (``runner/speculation.py``);
4. drop finished and aborted requests, freeing their slots for the next step.

Prompts are prefilled one request per forward, not padded together: chunks already keep the
CPU busy, and padding prompts of different lengths would waste the very compute prefill is
bound by.

The forward passes run in a *backend*: ``RunnerBackend`` (``runner/``: the engine's own Qwen2
forward over a static slot KV cache, int4 decode weights) when the model is supported and
``runner`` is ``auto``, else ``HFBackend`` (the HF model with a left-padded ``DecodeBatch``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import torch

from serve_app.engine.constraints import (
    TokenTexts,
)
from serve_app.engine.engine_config import EngineConfig, EngineStats
from serve_app.engine.loader import LoadedModel
from serve_app.engine.prefix_cache import PrefixCache
from serve_app.engine.protocol import Engine, GenerationChunk, GenerationRequest
from serve_app.engine.requests import (
    STREAM_END,
    RequestState,
    RequestStatus,
    StreamEnd,
    new_request_state,
)
from serve_app.engine.runner.backend import make_backend
from serve_app.engine.runner.speculation import propose_draft
from serve_app.errors import (
    ServerError,
    ServiceError,
    UpstreamUnavailableError,
)

logger = logging.getLogger(__name__)

# Whole steps failing in a row before the loop gives up and ``check_health`` reports it.
MAX_CONSECUTIVE_STEP_FAILURES = 10


class LLMEngine(Engine):
    """Serves many generation requests at once on one model (see the module docstring)."""

    def __init__(self, loaded: LoadedModel, config: EngineConfig | None = None) -> None:
        self.loaded = loaded
        self.config = config or EngineConfig()
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.device = torch.device(loaded.device)
        self.context_length = self.config.context_length or loaded.max_position_embeddings
        self.eos_token_ids = frozenset(loaded.eos_token_ids)
        # Byte strings of the whole vocabulary, for JSON-constrained decoding (~0.3 s once).
        self.token_texts = TokenTexts.for_tokenizer(self.tokenizer)
        self.prefix_cache = PrefixCache(
            self.config.prefix_cache_bytes, min_match_tokens=self.config.prefix_cache_min_tokens
        )

        self._lock = threading.Lock()  # guards _waiting and _active
        self._wakeup = threading.Event()
        self._waiting: deque[RequestState] = deque()
        self._active: set[RequestState] = set()
        self._prefilling: list[RequestState] = []
        self._joining: list[RequestState] = []
        self._backend = make_backend(loaded, self.config, self.context_length)
        self._stopping = False
        self._fatal: BaseException | None = None

        self.steps = 0
        self.decode_steps = 0
        self.prefill_tokens = 0
        self.peak_decode_batch = 0
        self.requests_finished = 0
        self.requests_aborted = 0
        self.requests_failed = 0
        self.draft_tokens = 0
        self.accepted_draft_tokens = 0

        self._thread = threading.Thread(target=self._run, name="llm-engine-loop", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ caller side (any thread)

    async def generate(
        self, request: GenerationRequest, *, context_param: str = "messages"
    ) -> AsyncIterator[GenerationChunk]:
        """Stream chunks for one request until one carries a ``finish_reason``.

        ``context_param`` names the request field blamed when prompt + max_tokens exceeds the
        context length (``"messages"`` for chat, ``"prompt"`` for completions/FIM).
        Raises ``InvalidRequestError``/``ContextLengthExceededError`` before anything runs,
        ``UpstreamUnavailableError`` when the waiting queue is full or the engine is down, and
        ``ServerError`` when the request failed inside the loop. Closing or cancelling the
        generator aborts the request. When the request is aborted by someone else
        (``abort(request_id)``), the stream just ends, without a finishing chunk.
        """
        state = self._new_state(request, context_param, asyncio.get_running_loop())
        self._enqueue(state)
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
                    raise ServerError(f"generation failed: {item!r}") from item
                if item.finish_reason is not None:
                    ended = True
                yield item
                if ended:
                    return
        finally:
            if not ended:
                self._request_abort(state)

    def abort(self, request_id: str) -> None:
        with self._lock:
            states = [s for s in self._active if s.request_id == request_id]
        for state in states:
            self._request_abort(state)

    def check_health(self) -> None:
        if self._fatal is not None:
            raise ServerError(f"engine step loop died: {self._fatal!r}") from self._fatal
        if self._stopping:
            raise UpstreamUnavailableError("The engine is shut down.")
        if not self._thread.is_alive():
            raise ServerError("engine step loop is not running")

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop the loop (in-flight requests get ``UpstreamUnavailableError``), free the model."""
        self._stopping = True
        self._wakeup.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        self.prefix_cache.clear()
        self.model = None

    @property
    def num_running(self) -> int:
        """Requests holding a slot. Safe from any thread: it counts admitted requests that are
        not finished (``_active`` less the waiting ones, under the lock), so it never dips
        while the loop moves a request from prefill to the decode batch."""
        with self._lock:
            return len(self._active) - len(self._waiting)

    def _slots_in_use(self) -> int:
        """The loop thread's own count (it owns the lists, so no lock is needed)."""
        return len(self._prefilling) + len(self._joining) + len(self._backend)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def stats(self) -> EngineStats:
        cache = self.prefix_cache
        return EngineStats(
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            num_prefilling=len(self._prefilling),
            num_decoding=len(self._backend),
            steps=self.steps,
            decode_steps=self.decode_steps,
            prefill_tokens=self.prefill_tokens,
            peak_decode_batch=self.peak_decode_batch,
            requests_finished=self.requests_finished,
            requests_aborted=self.requests_aborted,
            requests_failed=self.requests_failed,
            prefix_cache_queries=cache.queries,
            prefix_cache_hits=cache.hits,
            prefix_cache_hit_tokens=cache.hit_tokens,
            prefix_cache_bytes=cache.bytes_used,
            backend=type(self._backend).__name__,
            draft_tokens=self.draft_tokens,
            accepted_draft_tokens=self.accepted_draft_tokens,
        )

    def _new_state(
        self, request: GenerationRequest, context_param: str, loop: asyncio.AbstractEventLoop
    ) -> RequestState:
        """Validate a request and build its state (on the caller's thread, so errors are 4xx)."""
        self._raise_if_down()
        return new_request_state(
            request,
            context_param,
            loop,
            context_length=self.context_length,
            tokenizer=self.tokenizer,
            token_texts=self.token_texts,
            eos_token_ids=self.eos_token_ids,
            skip_special_tokens=self.config.skip_special_tokens,
            default_seed=self.config.seed,
        )

    def _enqueue(self, state: RequestState) -> None:
        with self._lock:
            self._raise_if_down()
            if len(self._waiting) >= self.config.max_waiting:
                raise UpstreamUnavailableError(
                    "The model is overloaded: too many requests are waiting. Please retry."
                )
            self._waiting.append(state)
            self._active.add(state)
        self._wakeup.set()

    def _raise_if_down(self) -> None:
        if self._stopping or self._fatal is not None or not self._thread.is_alive():
            raise UpstreamUnavailableError("The engine is not running.")

    def _request_abort(self, state: RequestState) -> None:
        state.abort_requested = True
        self._wakeup.set()

    # ------------------------------------------------------------------ the step loop (its thread)

    def _run(self) -> None:
        failures = 0
        try:
            with torch.inference_mode():
                while not self._stopping:
                    if not self._has_work():
                        self._wakeup.wait(timeout=1.0)
                        self._wakeup.clear()
                        continue
                    try:
                        self._step()
                        failures = 0
                    except Exception as e:  # bookkeeping bug: fail what is in flight, go on
                        failures += 1
                        logger.exception("engine step failed (%d in a row)", failures)
                        self._fail_running(e)
                        if failures >= MAX_CONSECUTIVE_STEP_FAILURES:
                            raise
        except BaseException as e:
            self._fatal = e
            logger.critical("engine step loop died", exc_info=True)
        finally:
            self._fail_everything()

    def _has_work(self) -> bool:
        return bool(self._waiting or self._prefilling or self._joining or self._backend.rows)

    def _step(self) -> None:
        self._reap_aborted()
        self._admit()
        self._prefill_step()
        self._decode_step()
        self._drop_done()
        self.steps += 1

    def _admit(self) -> None:
        with self._lock:
            while self._waiting and self._slots_in_use() < self.config.max_batch_size:
                state = self._waiting.popleft()
                state.status = RequestStatus.PREFILLING
                self._prefilling.append(state)

    def _prefill_step(self) -> None:
        budget = self.config.prefill_chunk_tokens
        for state in list(self._prefilling):
            if budget <= 0:
                break
            try:
                budget -= self._prefill_chunk(state, budget)
            except Exception as e:
                logger.exception("prefill failed for request %s", state.request_id)
                self._fail(state, e)

    def _prefill_chunk(self, state: RequestState, budget: int) -> int:
        """Read up to ``budget`` more prompt tokens of one request; returns how many."""
        prompt = state.prompt_ids
        if state.kv is None:
            cached, kv = self._cache_lookup(state)
            self._backend.begin(state, kv)
            state.num_computed = state.cached_tokens = cached
        start = state.num_computed
        end = min(len(prompt), start + budget)
        logits = self._backend.prefill(state, start, end)
        state.num_computed = end
        self.prefill_tokens += end - start
        if end == len(prompt):
            self._finish_prefill(state, logits)
        return end - start

    # The prefix cache's key is the account's salt and the prompt's token ids (one account's
    # prompt is never a hit for another: see prefix_cache); these two are the only callers.
    def _cache_lookup(self, state: RequestState) -> tuple[int, Any]:
        return self.prefix_cache.lookup(state.prompt_ids, state.request.cache_salt)

    def _cache_insert(self, state: RequestState) -> None:
        kv = self._backend.prompt_kv(state)
        self.prefix_cache.insert(state.prompt_ids, kv, state.request.cache_salt)

    def _finish_prefill(self, state: RequestState, logits: torch.Tensor) -> None:
        """Cache the prompt's KV, sample the first token, and queue the request to join."""
        self._cache_insert(state)
        self._on_token(state, state.sampler(logits, state.history))
        # Join before leaving the prefill list, so ``num_running`` never dips meanwhile.
        if not state.is_done:
            state.status = RequestStatus.DECODING
            self._joining.append(state)
        else:  # ended at its first token: its KV slot is free now
            self._backend.release([state])
        self._prefilling.remove(state)

    def _decode_step(self) -> None:
        joining = [s for s in self._joining if not s.is_done]
        self._backend.release([s for s in self._joining if s.is_done])
        self._joining = []
        if joining:
            self._backend.join(joining)
        rows = list(self._backend.rows)
        if not rows:
            return
        self.peak_decode_batch = max(self.peak_decode_batch, len(rows))
        limit = self.config.draft_max_batch
        drafting = limit is None or len(rows) <= limit
        drafts = [self._draft(state) if drafting else [] for state in rows]
        try:
            logits = self._backend.decode(drafts)
        except Exception as e:  # cannot tell whose fault: fail the rows, rebuild from empty
            logger.exception("decode forward failed for %d requests", len(rows))
            for state in rows:
                self._fail(state, e)
            self._backend.reset()
            return
        self.decode_steps += 1
        for state, draft, row_logits in zip(rows, drafts, logits, strict=True):
            try:
                self._verify(state, draft, row_logits)
            except Exception as e:
                logger.exception("sampling failed for request %s", state.request_id)
                self._fail(state, e)

    def _draft(self, state: RequestState) -> list[int]:
        """A prompt-lookup draft when the request's role speculates (see speculation.py)."""
        k = self.config.draft_tokens.get(state.request.role, 0)
        if not k or not self._backend.supports_speculation:
            return []
        params = state.request.params
        # Never past max_tokens (one token comes from the last position) or the context.
        k = min(
            k,
            params.max_tokens - state.num_output_tokens - 1,
            self.context_length - state.num_computed - 1,
        )
        history = state.history
        return propose_draft(history.prompt_ids + history.output_ids, k) if k > 0 else []

    def _verify(self, state: RequestState, draft: list[int], logits: torch.Tensor) -> None:
        """Sample position by position, as plain decoding would; stop at the first token that
        differs from the draft (it is the step's last token) or when the request ends."""
        start = state.num_computed
        self.draft_tokens += len(draft)
        for position, row in enumerate(logits):
            token = state.sampler(row, state.history)
            state.num_computed = start + position + 1
            self._on_token(state, token)
            if position == len(draft) or state.is_done or token != draft[position]:
                break
            self.accepted_draft_tokens += 1

    def _on_token(self, state: RequestState, token_id: int) -> None:
        """Record a sampled token, stream its text, and finish the request when it is done.

        ``completion_tokens`` counts every sampled token, the eos token included (as vLLM and
        OpenAI do); the eos token's own text is never emitted.
        """
        state.history.append(token_id)
        finish: str | None = None
        if token_id in self.eos_token_ids:
            text, _ = self._flush_text(state)
            finish = "stop"
        else:
            text, stopped = state.stop_matcher.feed(state.detokenizer.add(token_id))
            if stopped:
                finish = "stop"
            elif state.num_output_tokens >= state.request.params.max_tokens:
                tail, stopped = self._flush_text(state)
                text += tail
                finish = "stop" if stopped else "length"
        if finish is not None:
            self._finish(state, text, finish)
        elif text:
            self._push(state, state.chunk(text))

    @staticmethod
    def _flush_text(state: RequestState) -> tuple[str, bool]:
        """Release held text at the end: the detokenizer's tail, then the stop matcher's."""
        text, stopped = state.stop_matcher.feed(state.detokenizer.flush())
        if not stopped:
            text += state.stop_matcher.flush()
        return text, stopped

    def _finish(self, state: RequestState, text: str, reason: str) -> None:
        state.status = RequestStatus.FINISHED
        state.finish_reason = reason
        self.requests_finished += 1
        self._push(state, state.chunk(text, reason))
        self._forget(state)

    def _fail(self, state: RequestState, error: BaseException) -> None:
        if state.is_done:
            return
        state.status = RequestStatus.FINISHED
        self.requests_failed += 1
        state.push(error)
        self._forget(state)

    def _push(self, state: RequestState, chunk: GenerationChunk) -> None:
        if not state.push(chunk):  # the caller's event loop is gone
            state.abort_requested = True

    def _forget(self, state: RequestState) -> None:
        """Out of the active set; its KV is released by ``_drop_done`` (same step)."""
        with self._lock:
            self._active.discard(state)

    def _reap_aborted(self) -> None:
        """End aborted requests wherever they are; their slots free up in this step."""
        with self._lock:
            aborted = [s for s in self._waiting if s.abort_requested]
            for state in aborted:
                self._waiting.remove(state)
        aborted += [s for s in self._prefilling + self._joining if s.abort_requested]
        aborted += [s for s in self._backend.rows if s.abort_requested and not s.is_done]
        aborted = [s for s in aborted if not s.is_done]
        for state in aborted:
            state.status = RequestStatus.ABORTED
            self.requests_aborted += 1
            self._forget(state)
        if aborted:
            self._drop_done()
        for state in aborted:  # after the slots are free, so callers see them free
            state.push(STREAM_END)

    def _drop_done(self) -> None:
        done = [s for s in self._prefilling + self._joining + self._backend.rows if s.is_done]
        self._prefilling = [s for s in self._prefilling if not s.is_done]
        self._joining = [s for s in self._joining if not s.is_done]
        self._backend.release(done)

    def _fail_running(self, error: BaseException) -> None:
        for state in self._prefilling + self._joining + self._backend.rows:
            self._fail(state, error)
        self._prefilling, self._joining = [], []
        self._backend.reset()

    def _fail_everything(self) -> None:
        error = UpstreamUnavailableError("The engine stopped before the request finished.")
        with self._lock:
            waiting = list(self._waiting)
            self._waiting.clear()
        for state in waiting + self._prefilling + self._joining + self._backend.rows:
            self._fail(state, error)
        self._prefilling, self._joining = [], []
        self._backend.reset()
