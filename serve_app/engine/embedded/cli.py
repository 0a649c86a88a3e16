"""``python -m serve_app.engine.embedded [name] [--cache-dir DIR]``: prepare a model once."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

from serve_app.engine.embedded import (
    CACHE_ENV,
    DEFAULT_MODEL,
    EMBEDDED_MODELS,
    EmbeddedModelError,
    ensure_embedded_model,
)

logger = logging.getLogger("serve_app.engine.embedded")  # one logger for the package


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m serve_app.engine.embedded",
        description="Prepare an embedded model once and print its local folder.",
    )
    parser.add_argument("name", nargs="?", default=DEFAULT_MODEL, choices=sorted(EMBEDDED_MODELS))
    parser.add_argument(
        "--cache-dir", default=None, help=f"default: ${CACHE_ENV} or ~/.cache/serve-app/models"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr
    )
    started = time.monotonic()
    try:
        folder = ensure_embedded_model(args.name, cache_dir=args.cache_dir)
    except EmbeddedModelError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    logger.info("%s is ready (%.2fs)", folder, time.monotonic() - started)
    print(folder)
    return 0
