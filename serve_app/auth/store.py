"""Which auth store to open: ``open_store`` and the one ``resolve_auth_db``.

The store is split by concept: ``records`` (accounts, keys, ledger rows), ``interface``
(the ``AuthStore`` ABC), ``sql`` (the SQL and migrations SQLite and PostgreSQL share),
``sqlite`` (the default, one file per node) and ``postgres`` (a cluster). Records and
``StoreError`` are imported from ``records``, the store classes from their own modules.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from serve_app.auth.interface import AuthStore
from serve_app.auth.sqlite import SQLiteAuthStore

DB_FILENAME = "auth.sqlite3"


def default_data_dir() -> Path:
    """``$SERVE_APP_DATA_DIR``, else ``~/.local/share/serve-app``; absolute, because replicas
    do not run in the directory ``serve run`` was started from."""
    configured = os.environ.get("SERVE_APP_DATA_DIR")
    base = Path(configured) if configured else Path.home() / ".local" / "share" / "serve-app"
    return base.expanduser().resolve()


def resolve_auth_db(db: str | Path | None = None, data_dir: str | Path | None = None) -> str:
    """The one answer to "which auth store": ``db``, else ``$SERVE_APP_AUTH_DB``, else
    ``<data_dir>/auth.sqlite3`` (``data_dir`` defaults to ``default_data_dir()``)."""
    configured = db or os.environ.get("SERVE_APP_AUTH_DB")
    return str(configured or Path(data_dir or default_data_dir()) / DB_FILENAME)


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
