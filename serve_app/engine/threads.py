"""torch's intra-op threads, per replica and per phase of an engine step.

Reading a prompt multiplies hundreds of rows by every weight: it is bound by compute and gains
from a second thread. A decode step multiplies a few rows: it is bound by reading the weights,
and waking a second thread for each small op costs more than the thread saves
(OMP_WAIT_POLICY=PASSIVE, as configs/local.yaml runs, makes every wake-up a futex call). So the
loop may read prompts on more threads than it decodes on (``EngineConfig.prompt_threads``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class PhaseThreads:
    """The loop's thread counts, ``decode`` (torch's at start) and ``prompts``; set from the
    loop's own thread, as torch's OpenMP count belongs to the thread that sets it."""

    def __init__(self, prompts: int | None) -> None:
        self.decode = torch.get_num_threads()
        self.prompts = prompts or self.decode

    @contextmanager
    def reading_prompts(self) -> Iterator[None]:
        if self.prompts == self.decode:
            yield
            return
        torch.set_num_threads(self.prompts)
        try:
            yield
        finally:
            torch.set_num_threads(self.decode)
