"""The local account's key on a laptop: kept in a 0600 file, shown once on the terminal.

``make run`` runs ``serve-app-keys bootstrap`` before ``serve run``: the key is printed to the
terminal that asked for it, and never reaches a replica's stderr, which Ray copies into its
log files. A replica that bootstraps by itself (``auth.bootstrap_local_key`` without ``make``)
writes the file and logs only where it is.
"""

from __future__ import annotations

import os
from pathlib import Path

from serve_app.auth.authorizer import bootstrap_local
from serve_app.auth.interface import AuthStore
from serve_app.config import default_data_dir

KEY_FILENAME = "local-api-key"


def key_file_for(db: str) -> Path:
    """Beside a SQLite store; in the data dir for a PostgreSQL one."""
    if db.startswith(("postgres://", "postgresql://")):
        return default_data_dir() / KEY_FILENAME
    return Path(db).expanduser().resolve().parent / KEY_FILENAME


def write_key_file(path: Path, key: str) -> None:
    """Write ``key`` readable by its owner only (0600), never world-readable even briefly."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        os.fchmod(file.fileno(), 0o600)
        file.write(key + "\n")


def bootstrap_key_file(
    store: AuthStore, db: str, key_from_env: str | None
) -> tuple[str | None, Path]:
    """``bootstrap_local``; a key it generates is also written to ``key_file_for(db)``.
    Returns (the new key or None, the key file's path)."""
    key = bootstrap_local(store, key_from_env)
    path = key_file_for(db)
    if key is not None:
        write_key_file(path, key)
    return key, path
