"""One converter per model across processes, and progress a first start can see."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import sys
from collections.abc import Iterator
from pathlib import Path

logger = logging.getLogger("serve_app.engine.embedded")  # one logger for the package


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


@contextlib.contextmanager
def visible_progress() -> Iterator[None]:
    """Show INFO progress on stderr during the slow path when nothing else would print it.

    Python's default is WARNING with no handler, which would make a first start silent.
    """
    added: logging.Handler | None = None
    old_level = logger.level
    if not logger.isEnabledFor(logging.INFO):
        logger.setLevel(logging.INFO)
    if not logger.hasHandlers():
        added = logging.StreamHandler(sys.stderr)
        added.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
        logger.addHandler(added)
    try:
        yield
    finally:
        if added is not None:
            logger.removeHandler(added)
        logger.setLevel(old_level)
