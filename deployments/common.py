"""What the deployments share: the replica's CPU allotment and option merging."""

from __future__ import annotations

import copy
from typing import Any


def replica_cpus() -> float | None:
    """CPUs Ray reserved for this replica, to size torch's thread pool (None outside Ray)."""
    try:
        import ray

        return ray.get_runtime_context().get_assigned_resources().get("CPU")
    except Exception:
        return None


def merge_options(defaults: dict[str, Any], overrides: dict[str, Any] | None) -> dict[str, Any]:
    merged = copy.deepcopy(defaults)
    for key, value in (overrides or {}).items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged
