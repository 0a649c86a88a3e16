"""When a training run's learning rate is what, and when the run ends (``training.train``)."""

from __future__ import annotations

import math
import sys
import time


def learning_rate(step: int, steps: int, peak: float, warmup: int) -> float:
    """Linear warm-up, then cosine down to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    done = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(done, 1.0))))


class RunClock:
    """How many steps fit before a run's deadline (``--minutes``), measured as it goes: the
    run's steps are cut to that, never raised, so the learning rate's cosine comes down by the
    deadline instead of stopping halfway down a curve drawn for steps it never reaches (a GPU
    lease, or two runs sharing one GPU, ends at a time, not at a step)."""

    WARM = 3  # steps before the first cut: the first ones pay for kernels' warm-up

    def __init__(self, minutes: float | None) -> None:
        self.deadline = time.monotonic() + 60 * minutes if minutes else None
        self.steps_done, self.since = 0, time.monotonic()

    def steps_that_fit(self, step: int) -> int:
        """``step`` plus the steps the rest of the time holds at this run's pace (every step
        after the first, evaluations included); no limit without a deadline or before WARM."""
        self.steps_done += 1
        now = time.monotonic()
        if self.steps_done == 1:
            self.since = now
        if self.deadline is None or self.steps_done < self.WARM:
            return sys.maxsize
        pace = (now - self.since) / (self.steps_done - 1)
        return step + max(0, int((self.deadline - now) / pace))


class SessionClock:
    """Whether this session's time (``--session-minutes``) is up: the run then pauses, its
    checkpoint saved, with its steps and schedule as they were, to go on in the next."""

    def __init__(self, minutes: float | None) -> None:
        self.deadline = time.monotonic() + 60 * minutes if minutes else None

    def over(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline
