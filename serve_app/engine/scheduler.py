"""Who runs next: the waiting queue, admission to slots, and the requests' lifecycle lists.

A request moves WAITING -> PREFILLING -> (joining) -> DECODING -> FINISHED/ABORTED.
``enqueue`` (any thread) queues it, or refuses it with a 503 once ``max_waiting`` wait, so load
balancers back off instead of queueing on; ``admit`` (the loop) gives slots first come first
served while fewer than ``max_batch_size`` hold one. A request whose prompt is read joins the
decode batch (the backend's ``rows``) at the next decode step (``take_joining``); a scoring
request (prefill-only) goes to ``scoring``, one pass per step in its slot. ``reap_aborted``
ends requests whose caller left, wherever they are; ``drop_done`` frees every ended request's
slot in the same step.

``_lock`` guards what other threads touch (the waiting queue, the active set); the other lists
belong to the loop thread alone.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence

from serve_app.engine.model_backend import ModelBackend
from serve_app.engine.requests import RequestState, RequestStatus, ScoringState, State
from serve_app.errors import UpstreamUnavailableError


class Scheduler:
    def __init__(
        self,
        backend: ModelBackend,
        max_batch_size: int,
        max_waiting: int,
        keep: Callable[[Sequence[State]], None],
    ) -> None:
        """``keep``: called with ended requests just before their KV is released, to save
        what is worth keeping (the engine's prefix cache)."""
        self.backend = backend
        self.keep = keep
        self.max_batch_size = max_batch_size
        self.max_waiting = max_waiting
        self.prefilling: list[State] = []
        self.joining: list[RequestState] = []
        self.scoring: list[ScoringState] = []
        self._lock = threading.Lock()
        self._waiting: deque[State] = deque()
        self._active: set[State] = set()

    # ------------------------------------------------------------------ any thread

    def enqueue(self, state: State, raise_if_down: Callable[[], None]) -> None:
        with self._lock:
            raise_if_down()
            if len(self._waiting) >= self.max_waiting:
                raise UpstreamUnavailableError(
                    "The model is overloaded: too many requests are waiting. Please retry."
                )
            self._waiting.append(state)
            self._active.add(state)

    def find(self, request_id: str) -> list[State]:
        with self._lock:
            return [s for s in self._active if s.request_id == request_id]

    def forget(self, state: State) -> None:
        """Out of the active set; its KV is released by ``drop_done`` (same step)."""
        with self._lock:
            self._active.discard(state)

    @property
    def num_running(self) -> int:
        """Requests holding a slot, from any thread: the active set less the waiting ones
        (under the lock), so it never dips while the loop moves a request to the decode batch."""
        with self._lock:
            return len(self._active) - len(self._waiting)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    # ------------------------------------------------------------------ the loop thread

    def has_work(self) -> bool:
        return bool(self._waiting or self.in_flight())

    def in_flight(self) -> list[State]:
        """Every admitted request: prefilling, joining, a decode row, or scoring."""
        return [*self.prefilling, *self.joining, *self.backend.rows, *self.scoring]

    def admit(self) -> None:
        with self._lock:
            while self._waiting and self._slots_in_use() < self.max_batch_size:
                state = self._waiting.popleft()
                state.status = RequestStatus.PREFILLING
                self.prefilling.append(state)

    def prefilled(self, state: State) -> None:
        """A prompt is read: the request joins the decode batch at the next decode step, or
        gives its slot back now if its first token ended it; a scoring request keeps its slot
        for its passes. Queued before it leaves the prefill list: ``num_running`` never dips."""
        if isinstance(state, ScoringState):
            self.scoring.append(state)
        elif not state.is_done:
            state.status = RequestStatus.DECODING
            self.joining.append(state)
        else:
            self._release([state])
        self.prefilling.remove(state)

    def take_joining(self) -> list[RequestState]:
        """The requests that join the decode batch now (an ended one gives its slot back)."""
        joining = [s for s in self.joining if not s.is_done]
        self._release([s for s in self.joining if s.is_done])
        self.joining = []
        return joining

    def reap_aborted(self) -> list[State]:
        """End aborted requests wherever they are and free their slots; returns them, to count
        before forgetting them (so whoever sees the slot free also sees the abort counted)."""
        with self._lock:
            aborted = [s for s in self._waiting if s.abort_requested]
            for state in aborted:
                self._waiting.remove(state)
        aborted += [s for s in self.in_flight() if s.abort_requested]
        aborted = [s for s in aborted if not s.is_done]
        for state in aborted:
            state.status = RequestStatus.ABORTED
        if aborted:
            self.drop_done()
        return aborted

    def drop_done(self) -> None:
        done = [s for s in self.in_flight() if s.is_done]
        self.prefilling = [s for s in self.prefilling if not s.is_done]
        self.joining = [s for s in self.joining if not s.is_done]
        self.scoring = [s for s in self.scoring if not s.is_done]
        self._release(done)

    def clear(self, include_waiting: bool) -> list[State]:
        """Empty the loop's lists (and the waiting queue if asked); returns the requests that
        were there, for the caller to fail before it resets the backend."""
        waiting: list[State] = []
        if include_waiting:
            with self._lock:
                waiting = list(self._waiting)
                self._waiting.clear()
        states = waiting + self.in_flight()
        self.prefilling, self.joining, self.scoring = [], [], []
        return states

    def _release(self, states: Sequence[State]) -> None:
        if states:
            self.keep(states)
            self.backend.release(states)

    def _slots_in_use(self) -> int:
        return len(self.prefilling) + len(self.joining) + len(self.backend) + len(self.scoring)
