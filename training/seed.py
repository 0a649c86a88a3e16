"""A run's seed: the small state a training run goes on from on another machine.

A CPU run outlives a session (one ends at 180 minutes and the next may start on a new machine,
where the cache folder holding ``OUT/checkpoint`` is gone). With ``--seed-out DIR`` every
checkpoint also writes DIR: the adapter as it ships (bf16, a few MB at rank 8) and
``seed.json``, the run's settings and its progress (step, data order, position, validation
losses, seconds). DIR is small enough to commit. A later run given ``--init-adapter DIR`` goes
on from that step on the same schedule: the seed's settings replace the command line's, the
data must be the same version (``training.mine`` makes it again from the same commits), and
only the optimizer's moments start over (AdamW's, which a few steps rebuild).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from serve_app.models.loader import TRAINING_RECORD, training_record
from training.export import write_adapter
from training.record import data_record, run_record, seed_run_start

SEED_FILE = "seed.json"
# What a run is: the settings its pairs, their order and its learning-rate schedule follow
# from. A run going on from a seed takes these from it.
RUN_SETTINGS = (
    "model", "style", "steps", "batch", "lr", "warmup", "rank", "layers", "max_tokens", "seed",
    "no_change", "min_support", "typing", "history_cursor", "change_weight", "detach_prompt",
    "objective", "eval_examples",
)  # fmt: skip


def is_seed(folder: Path | None) -> bool:
    return folder is not None and (folder / SEED_FILE).exists()


def save_seed(folder: Path, model: Any, progress: Any, args: argparse.Namespace) -> None:
    """``model``'s adapter and the run's settings and ``progress`` in ``folder``, replaced
    whole, with the run's record so far beside them."""
    record = run_record(args, asdict(progress))
    seed = {
        "data_version": data_record(args.data)["data_version"],
        "settings": {name: getattr(args, name) for name in RUN_SETTINGS},
        "progress": asdict(progress),
        "start": {key: record[key] for key in ("init_adapter", "init_record")},
    }
    files = {SEED_FILE: json.dumps(seed) + "\n", TRAINING_RECORD: json.dumps(record, indent=1)}
    with tempfile.TemporaryDirectory() as saved:
        model.save_pretrained(saved)
        write_adapter(Path(saved), folder, args.model, files)


def adopt_seed(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The seed's progress (``train.Progress``'s fields), after setting ``args`` to the seed's
    run; refuses data of another version, which would give other pairs in another order."""
    seed = json.loads((folder / SEED_FILE).read_text())
    version = data_record(args.data)["data_version"]
    if seed["data_version"] != version:
        raise SystemExit(
            f"{folder} was trained on data version {seed['data_version']}, {args.data} is "
            f"{version}: mine the same repositories at the same commits (its training.json "
            "names them) to go on"
        )
    if seed["settings"]["objective"] == "dpo":
        raise SystemExit(f"{folder}: a DPO run's reference is its starting adapter; go on from OUT")
    changed = {
        name: value for name, value in seed["settings"].items() if getattr(args, name) != value
    }
    for name, value in seed["settings"].items():
        setattr(args, name, value)
    # The same run goes on: its record names where it started, not this seed.
    args.run_start = seed.get("start") or seed_run_start(training_record(folder), folder)
    if changed:
        print(f"the seed's settings replace the command line's: {changed}", file=sys.stderr)
    return seed["progress"]
