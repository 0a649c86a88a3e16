"""The adapter a next-edit bench run names: what its training record says of it."""

from __future__ import annotations

from typing import Any


def adapter_training(source: str) -> dict[str, Any]:
    """The adapter's training record ({} when it has none)."""
    from serve_app.models.loader import adapter_path, training_record

    return training_record(adapter_path(source))


def adapter_style(source: str) -> str:
    """The prompt style the adapter was trained on (chat_split where its record is silent)."""
    return adapter_training(source).get("style", "chat_split")


def adapter_record(source: str) -> str:
    """What the adapter was trained on and how long (its ``training.json``), in one line."""
    fields = adapter_training(source)
    if not fields:
        return "(no training.json)"
    keys = ("base_model", "data_version", "style", "steps", "batch", "layers", "rank", "hours")
    return " ".join(f"{key}={fields.get(key)}" for key in keys)
