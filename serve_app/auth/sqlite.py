"""``SQLiteAuthStore``: the default store, one SQLite file shared by the replicas of a node.

WAL mode lets readers run while one process writes; ``busy_timeout`` makes a writer wait for
the lock instead of failing; every read-modify-write runs in ``BEGIN IMMEDIATE``, which takes
the write lock up front, so two processes can never both pass a rate check that only one of
them should.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from serve_app.auth.sql import SqlAuthStore


class SQLiteAuthStore(SqlAuthStore):
    """The default store: a SQLite file in WAL mode, safe for several processes on one node.

    WAL lets readers run while one process writes; ``busy_timeout`` makes a writer wait for
    the lock instead of failing; ``BEGIN IMMEDIATE`` takes the write lock up front, so two
    processes can never both pass a rate check only one of them should (and never deadlock
    upgrading a read lock).
    """

    begin_write = "BEGIN IMMEDIATE"
    integrity_errors = (sqlite3.IntegrityError,)
    unavailable_errors = (sqlite3.OperationalError,)  # "database is locked" past busy_timeout

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout_ms: int = 5000,
        synchronous: str = "NORMAL",
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(clock)
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: no implicit transactions; _write issues BEGIN IMMEDIATE.
        self._conn = sqlite3.connect(
            self.path,
            isolation_level=None,
            check_same_thread=False,
            timeout=busy_timeout_ms / 1000,
        )
        self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        self._conn.execute("PRAGMA journal_mode = WAL")
        # NORMAL in WAL mode: a commit survives a process crash; only an OS crash or power
        # loss can drop the last few commits. FULL fsyncs every commit (and every request).
        self._conn.execute(f"PRAGMA synchronous = {_pragma_word(synchronous)}")
        self._conn.execute("PRAGMA foreign_keys = ON")
        self._migrate()

    def __str__(self) -> str:
        return str(self.path)


def _pragma_word(value: str) -> str:
    """PRAGMA values cannot be bound as parameters: allow only plain words."""
    if not value.isalpha():
        raise ValueError(f"bad pragma value {value!r}")
    return value
