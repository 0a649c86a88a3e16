"""``python -m serve_app.launch CONFIG``: ``serve run CONFIG`` on a Ray without its dashboard.

What ``make run`` starts. ``serve run`` starts a Ray of its own with the dashboard on: eleven
more processes and ~0.3 GB of a laptop's memory (docs/operations.md) that serving does not
use (Ray keeps one small head process for usage stats, without its web frontend). This starts
that Ray first, without the dashboard, then hands over to ``serve run``'s own command, which
finds Ray running and does the rest as always (the config, blocking, Ctrl-C). ``serve
status``, ``serve deploy`` and the Ray dashboard need the dashboard: start with plain ``serve
run`` (``make run DASHBOARD=1``) where you want them. Where ``RAY_ADDRESS`` names a running
cluster, Ray joins it and the dashboard is that cluster's.
"""

from __future__ import annotations

import sys

import ray
from ray.serve._private.constants import SERVE_NAMESPACE
from ray.serve.scripts import run


def main(argv: list[str] | None = None) -> None:
    """``argv``: ``serve run``'s arguments (a config file or an import path first)."""
    ray.init(namespace=SERVE_NAMESPACE, include_dashboard=False)
    run.main(args=sys.argv[1:] if argv is None else argv, prog_name="python -m serve_app.launch")


if __name__ == "__main__":
    main()
