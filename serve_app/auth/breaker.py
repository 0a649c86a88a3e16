"""``StoreBreaker``: fail fast while the auth store is away, instead of queueing on it.

A store call that cannot reach the store (PostgreSQL down, a SQLite file locked past its
``busy_timeout``) fails only after that wait, and it holds the store's one connection while
it waits: every call behind it waits its turn, so a minute's outage turned each request into
tens of seconds before its 503 (docs/operations.md has the run, with its figures). After such
a failure the breaker refuses calls at once for
``cooldown_s``; then one write tries the store while the others are still refused, and its
success closes the breaker. The caller's answer to a refusal is the same 503 with
Retry-After, and a ledger row refused goes to the replica's spool at once.
"""

from __future__ import annotations

import threading
import time

COOLDOWN_S = 1.0  # refused at once this long after the store failed, then one write tries it


class StoreUnavailable(Exception):
    """The store failed a moment ago and is not being asked again yet."""


class StoreBreaker:
    """Whether to ask the store now. Reads pass while no write is trying it: a SQLite file
    locked by another writer still reads, and PostgreSQL gone fails a read at once."""

    def __init__(self, cooldown_s: float = COOLDOWN_S) -> None:
        self.cooldown_s = cooldown_s
        self._lock = threading.Lock()
        self._tripped = False
        self._retry_at = 0.0
        self._probe: int | None = None  # the thread whose write tries the store again

    def enter(self, write: bool) -> None:
        """Before a store call, and again once it holds the connection (a call that waited
        behind one that failed is refused too): raise ``StoreUnavailable`` while the store
        is away, except for the one write that tries it after each cooldown."""
        with self._lock:
            me = threading.get_ident()
            if not self._tripped or self._probe == me:
                return
            if self._probe is not None or time.monotonic() < self._retry_at:
                raise StoreUnavailable("the auth store is unavailable")
            if write:
                self._probe = me

    def answered(self, write: bool) -> None:
        """The store answered (an error of the call's own counts as an answer); only a
        write that went through shows it takes writes again."""
        with self._lock:
            if write:
                self._tripped = False
            if self._probe == threading.get_ident():
                self._probe = None

    def unreachable(self) -> None:
        with self._lock:
            self._tripped, self._probe = True, None
            self._retry_at = time.monotonic() + self.cooldown_s
