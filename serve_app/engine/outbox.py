"""How the step loop hands items (chunks, errors, the stream's end) to callers' event loops.

Items cross threads through ``loop.call_soon_threadsafe``, which wakes the loop by writing to
its self-pipe: a system call and a wake-up per call, a cost per token that grows with the batch
and was a large share of a wide step. So items are gathered while a phase of a step runs
(prompts, scoring, decode) and each event loop gets one callback per phase, filling its
requests' queues in the order the items were put.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Protocol


class Recipient(Protocol):
    """A request in flight as the outbox sees it (``requests.InFlight``)."""

    queue: asyncio.Queue[Any]
    loop: asyncio.AbstractEventLoop
    abort_requested: bool


class Outbox:
    def __init__(self) -> None:
        self._lock = threading.Lock()  # a caller's thread may fail a request too
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[Recipient, Any]]] = {}

    def put(self, recipient: Recipient, item: Any) -> None:
        """Queue ``item`` for ``recipient``; it is delivered at the next ``flush``."""
        with self._lock:
            self._pending.setdefault(recipient.loop, []).append((recipient, item))

    def flush(self) -> None:
        """One callback per event loop; requests of a closed loop (nobody listens) get aborted."""
        with self._lock:
            pending, self._pending = self._pending, {}
        for loop, items in pending.items():
            try:
                loop.call_soon_threadsafe(_deliver, items)
            except RuntimeError:  # the caller's loop was closed
                for recipient, _ in items:
                    recipient.abort_requested = True


def _deliver(items: list[tuple[Recipient, Any]]) -> None:
    for recipient, item in items:
        recipient.queue.put_nowait(item)
