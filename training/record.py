"""A run's record, ``OUT/training.json`` beside its adapter: what it learned from (the data's
version, each repository's split, licence and commit), with what settings, from which
adapter it started, and how its validation loss went."""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from serve_app.models.loader import training_record


def data_record(data: Path) -> dict[str, Any]:
    """The data's version, its repositories by split (which an adapter learned from, so a
    later measurement can tell held-out ones) and each one's provenance: the licence it was
    mined under and the commit mined, from the miner's manifest."""
    path = data / "manifest.json"
    manifest = json.loads(path.read_text()) if path.exists() else {}
    splits: dict[str, list[str]] = {}
    provenance: dict[str, dict[str, str]] = {}
    for name, repository in sorted(manifest.get("repositories", {}).items()):
        splits.setdefault(repository.get("split", "train"), []).append(name)
        provenance[name] = {
            "licence": repository.get("licence", "unknown"),
            "commit": repository.get("head", "unknown"),
        }
    return {
        "data_version": manifest.get("version", "unknown"),
        "repositories": splits,
        "provenance": provenance,
    }


def run_record(args: argparse.Namespace, progress: Mapping[str, Any]) -> dict[str, Any]:
    """The record of a run with ``args`` that got to ``progress`` (``train.Progress``'s
    fields: step, validation losses, seconds)."""
    return {
        "base_model": args.model,
        "data": str(args.data),
        **data_record(args.data),
        "style": args.style,
        "no_change_share": args.no_change,
        "min_support": args.min_support,
        "typing": args.typing,
        "history_cursor": args.history_cursor,
        "seed": args.seed,
        "steps": progress["step"],
        "batch": args.batch,
        "rank": args.rank,
        "layers": args.layers,
        "max_tokens": args.max_tokens,
        "lr": args.lr,
        "change_weight": args.change_weight,
        "detach_prompt": args.detach_prompt,
        "objective": args.objective,
        **({"beta": args.beta, "sft_weight": args.sft_weight} if args.objective == "dpo" else {}),
        # A continued adapter learned part of what it knows from the one it started from:
        # that adapter's own record (data, steps, scores) is kept with it. A run going on from
        # its own seed is the same run: it started where the seed's run started.
        **(getattr(args, "run_start", None) or run_start(args.init_adapter)),
        "validation_loss": progress["validation"],
        "validation_loss_changed_tokens": progress["validation_changed"],
        "validation_first_token": progress["validation_first_token"],
        "hours": round(progress["seconds"] / 3600, 3),
        "seconds": round(progress["seconds"], 3),
    }


def run_start(init_adapter: Path | None) -> dict[str, Any]:
    """What a run starting from ``init_adapter`` records of it: its path and its record."""
    return {
        "init_adapter": str(init_adapter) if init_adapter else None,
        "init_record": starting_record(init_adapter) or None,
    }


def seed_run_start(record: Mapping[str, Any], seed: Path) -> dict[str, Any]:
    """Where the run that wrote ``seed`` (its ``record``) started: past the records of its own
    seed that runs going on from it nested (seeds written before ``seed.json`` kept it)."""
    while record.get("init_record") and _same(record.get("init_adapter"), seed):
        record = record["init_record"]
    return {"init_adapter": record.get("init_adapter"), "init_record": record.get("init_record")}


def _same(path: str | None, folder: Path) -> bool:
    return path is not None and Path(path).resolve() == folder.resolve()


def starting_record(init_adapter: Path | None) -> dict[str, Any]:
    """The training record of ``--init-adapter``: in its folder where it was exported
    (``training.export``), beside it where it is a run's ``OUT/adapter``; {} for none."""
    if init_adapter is None:
        return {}
    return training_record(init_adapter) or training_record(init_adapter.parent)
