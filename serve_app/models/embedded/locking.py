"""One converter per model across processes."""

from __future__ import annotations

import contextlib
import fcntl
import logging
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger("serve_app.models.embedded")  # one logger for the package


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """``flock`` on ``path``: one converter per model; the lock dies with its process."""
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("another process is preparing this model (lock %s); waiting for it", path)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
