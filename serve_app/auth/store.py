"""Which auth store to open: ``open_store`` and the one ``resolve_auth_db``.

The store is split by concept: ``records`` (accounts, keys, ledger rows), ``interface``
(the ``AuthStore`` ABC), ``sql`` (the SQL and migrations SQLite and PostgreSQL share),
``sqlite`` (the default, one file per node) and ``postgres`` (a cluster). Records and
``StoreError`` are imported from ``records``, the store classes from their own modules.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from serve_app.auth.interface import AuthStore
from serve_app.auth.sqlite import SQLiteAuthStore
from serve_app.config import resolve_auth_db


def open_store(
    db: str | Path | None = None, *, clock: Callable[[], float] | None = None
) -> AuthStore:
    """Open the configured store: a ``postgresql://`` DSN selects PostgreSQL, else SQLite.
    ``clock`` replaces the store's clock (tests only)."""
    target = resolve_auth_db(db)
    if target.startswith(("postgres://", "postgresql://")):
        from serve_app.auth.postgres import PostgresAuthStore

        return PostgresAuthStore(target, clock=clock)
    return SQLiteAuthStore(target, clock=clock)
