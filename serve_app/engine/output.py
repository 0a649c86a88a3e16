"""From sampled tokens to what a caller reads: text, stop strings, finish reasons, errors.

``OutputProcessor.on_token`` is the one place a sampled token becomes output: it extends the
history, detokenizes incrementally (whole characters only), holds back text that may start a
stop string, and decides whether the request is finished (eos, a stop string, ``max_tokens``).
Finishing or failing hands it to the scheduler's ``forget``: its slot counts free that step.
"""

from __future__ import annotations

from collections.abc import Callable

from serve_app.engine.protocol import GenerationChunk, ScoringChunk
from serve_app.engine.requests import RequestState, RequestStatus, State
from serve_app.engine.stats import EngineCounters


class OutputProcessor:
    def __init__(
        self,
        eos_token_ids: frozenset[int],
        counters: EngineCounters,
        forget: Callable[[State], None],
    ) -> None:
        self.eos_token_ids = eos_token_ids
        self.counters = counters
        self.forget = forget

    def on_token(self, state: RequestState, token_id: int) -> None:
        """``completion_tokens`` counts every sampled token, eos included (as vLLM and OpenAI
        do); the eos token's own text is never emitted."""
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
            self.finish(state, text, finish)
        elif text:
            state.push(state.chunk(text))

    def finish(self, state: RequestState, text: str, reason: str) -> None:
        state.finish_reason = reason
        self.complete(state, state.chunk(text, reason))

    def complete(self, state: State, last: GenerationChunk | ScoringChunk) -> None:
        """A request's last item: it is finished, and its slot is counted free."""
        state.status = RequestStatus.FINISHED
        self.counters.requests_finished += 1
        state.push(last)
        self.forget(state)

    def fail(self, state: State, error: BaseException) -> None:
        if state.is_done:
            return
        state.status = RequestStatus.FINISHED
        self.counters.requests_failed += 1
        state.push(error)
        self.forget(state)

    @staticmethod
    def _flush_text(state: RequestState) -> tuple[str, bool]:
        """Release held text at the end: the detokenizer's tail, then the stop matcher's."""
        text, stopped = state.stop_matcher.feed(state.detokenizer.flush())
        if not stopped:
            text += state.stop_matcher.flush()
        return text, stopped
