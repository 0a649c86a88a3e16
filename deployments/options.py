"""The Serve options every deployment's ``get_deployment_options`` builds (no torch here:
the Router and AuthService import this too)."""

from __future__ import annotations

from typing import Any


def deployment_options(
    name: str, *, ongoing: int, max_replicas: int, target: int, cpus: float, **extra: Any
) -> dict[str, Any]:
    """Admit ``ongoing`` requests a replica, queue as many again, then answer 503 instead of
    queueing on; scale between one and ``max_replicas`` replicas at ``target`` ongoing
    requests each; reserve ``cpus`` a replica. ``extra``: further Serve options."""
    return {
        "name": name,
        "max_ongoing_requests": ongoing,
        "max_queued_requests": 2 * ongoing,
        "autoscaling_config": {
            "min_replicas": 1,
            "max_replicas": max_replicas,
            "target_ongoing_requests": target,
        },
        "ray_actor_options": {"num_cpus": cpus},
        **extra,
    }
