"""Progress a first start can see: INFO lines on stderr while a slow one-time step runs."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def visible_progress(logger: logging.Logger) -> Iterator[None]:
    """Show ``logger``'s INFO records (its children's too) on stderr during a slow step when
    nothing else would print them.

    Python's default is WARNING with no handler, which would make a first start silent for
    minutes (converting a model, quantizing it in a replica: Serve shows a replica's stderr).
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
