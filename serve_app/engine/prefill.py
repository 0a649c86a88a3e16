"""Step 2 of the engine's loop (``engine`` module docstring): reading prompts, in chunks after
each request's longest prefix-cache hit, or replaying a stored answer whole (``reuse``)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from serve_app.engine.model_backend import ModelBackend, PromptChunk
from serve_app.engine.output import OutputProcessor
from serve_app.engine.requests import RequestAborted, RequestState, State
from serve_app.engine.reuse import PromptReuse
from serve_app.engine.scheduler import Scheduler
from serve_app.engine.stats import EngineCounters

logger = logging.getLogger("serve_app.engine.engine")  # the engine's log, as before the split


class PromptPhase:
    """Reads prompts for the engine loop; ``abort_check(*states)`` gives the check a forward
    runs between layers (all its requests aborted, or the engine stopping: it raises)."""

    def __init__(
        self,
        chunk_tokens: int,
        scheduler: Scheduler,
        backend: ModelBackend,
        reuse: PromptReuse,
        output: OutputProcessor,
        counters: EngineCounters,
        abort_check: Callable[..., Callable[[], None]],
    ) -> None:
        self.chunk_tokens = chunk_tokens
        self.scheduler = scheduler
        self.backend = backend
        self.reuse = reuse
        self.output = output
        self.counters = counters
        self.abort_check = abort_check

    def step(self) -> None:
        """Spend the chunk budget on the prefilling requests, oldest first, ``prompt_batch``
        chunks per forward. A request is planned (its prefix-cache lookup) after every earlier
        forward of the step ran, so with one chunk per forward it finds the requests before it
        cached; one that starts like a chunk of the batch being gathered waits a step for it."""
        budget = self.chunk_tokens
        batch: list[PromptChunk] = []
        for state in list(self.scheduler.prefilling):
            if budget <= 0:
                break
            if batch and _reads_the_same(state, batch):
                continue
            try:
                chunk = self._next_chunk(state, budget)
            except Exception as e:
                logger.exception("prefill failed for request %s", state.request_id)
                self.output.fail(state, e)
                continue
            if chunk is None:
                continue
            batch.append(chunk)
            budget -= chunk.end - chunk.start
            if len(batch) == self.backend.prompt_batch:
                self._read_chunks(batch)
                batch = []
        if batch:
            self._read_chunks(batch)

    def _next_chunk(self, state: State, budget: int) -> PromptChunk | None:
        """A request's next up to ``budget`` prompt tokens to read; None where it needs none
        (its answer replayed, or its prompt held whole by the prefix cache)."""
        prompt = state.prompt_ids
        if state.kv is None:
            answer = self.reuse.answer(state)
            if answer is not None:
                self._replay(state, answer)
                return None
            cached, kv, logits = self.reuse.lookup(state)
            self.backend.begin(state, kv)
            state.num_computed = state.cached_tokens = cached
            if cached == len(prompt):  # read before, whole (a scoring prefix: no logits)
                self._finish_prefill(state, logits)
                return None
        start = state.num_computed
        return PromptChunk(state, start, min(len(prompt), start + budget))

    def _read_chunks(self, chunks: list[PromptChunk]) -> None:
        """One prefill forward over ``chunks``; a request now read whole gets its first token.
        A failed forward fails all its requests (whose fault it was cannot be told apart); one
        stopped because all of them were aborted ends them at the next step's reap."""
        states = [chunk.state for chunk in chunks]
        try:
            logits = self.backend.prefill(chunks, self.abort_check(*states))
        except RequestAborted:
            return
        except Exception as e:
            logger.exception("prefill failed for requests %s", [s.request_id for s in states])
            for state in states:
                self.output.fail(state, e)
            return
        for chunk, row in zip(chunks, logits, strict=True):
            state = chunk.state
            state.num_computed = chunk.end
            self.counters.prefill_tokens += chunk.end - chunk.start
            if chunk.end < len(state.prompt_ids):
                continue
            try:
                self._finish_prefill(state, row)
            except Exception as e:
                logger.exception("prefill failed for request %s", state.request_id)
                self.output.fail(state, e)

    def _replay(self, state: RequestState, answer: list[int]) -> None:
        """The same greedy request again: its stored answer, through the output processor as
        if sampled, with the whole prompt counted as cached (see ``reuse``)."""
        state.num_computed = state.cached_tokens = len(state.prompt_ids)
        self.counters.answers_replayed += 1
        for token in answer:
            self.output.on_token(state, token)
            if state.is_done:
                break
        if not state.is_done:  # equal parameters end where they ended: never expected
            raise RuntimeError("a replayed answer did not end its request")
        self.scheduler.prefilled(state)

    def _finish_prefill(self, state: State, logits: torch.Tensor | None) -> None:
        """Cache the prompt's KV, sample a generation's first token, and move the request on."""
        self.reuse.insert(state, logits)
        if isinstance(state, RequestState):
            self.output.on_token(state, state.sampler(logits, state.history))
        self.scheduler.prefilled(state)


# Prompt tokens two requests must start alike for the later one to wait for the earlier one's
# chunk (``PromptPhase.step``): a decision's shared state, a long common system prompt.
SHARED_PREFIX_TOKENS = 256


def _reads_the_same(state: State, batch: list[PromptChunk]) -> bool:
    """Whether ``state``'s unbegun prompt starts as one a ``batch`` chunk reads from its start."""
    head = state.prompt_ids[:SHARED_PREFIX_TOKENS]
    if state.kv is not None or len(head) < SHARED_PREFIX_TOKENS:
        return False
    return any(
        chunk.start < SHARED_PREFIX_TOKENS and chunk.state.prompt_ids[:SHARED_PREFIX_TOKENS] == head
        for chunk in batch
    )
