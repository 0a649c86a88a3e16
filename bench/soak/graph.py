"""The soak's graph (tests/graph.py's ``serve run``), its accounts, and what its replicas
hold: PSS and prefix-cache bytes."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import yaml

from bench.common import ROOT
from bench.soak import (
    ACCOUNTS,
    BROKE,
    CACHE_METRIC,
    EMBEDDED,
    KILL_LIMITS,
    LIMITED,
    LIMITED_RPM,
    REPLICA_TITLE,
)


def soak_configure(
    embedded: bool, kill: bool, auth_db: str | None = None
) -> Callable[[dict], None]:
    """Edit tests/graph.py's config: embedded, local.yaml's settings with the 0.5B in every
    role; ``kill``, the short deadlines; ``auth_db``, the auth store (a postgresql:// DSN)."""

    def configure(document: dict) -> None:
        (application,) = document["applications"]
        if embedded:
            local = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())
            (declared,) = local["applications"]
            model = declared["args"]["models"][0]
            assert model["id"] == EMBEDDED, model
            roles = dict.fromkeys(("fim", "edit", "decisions"), EMBEDDED)
            application["args"] = {**declared["args"], "models": [model], "roles": roles}
            application["deployments"] = declared["deployments"]
        if kill:
            application["args"]["limits"] = dict(KILL_LIMITS)
        if auth_db:
            application["args"]["auth"] = {**application["args"].get("auth", {}), "db": auth_db}

    return configure


@contextlib.contextmanager
def soak_graph(
    workdir: Path, tiny: bool, kill: bool, tiny_source: str | None = None,
    auth_db: str | None = None,
) -> Iterator[dict]:  # fmt: skip
    """The graph (tests/graph.py's ``start_graph``) and its accounts: ``keys`` by account;
    ``db``, the auth store (``auth_db``, or the graph's own SQLite file)."""
    from serve_app.models.tiny import build_tiny_model
    from tests.graph import MODEL, start_graph

    if tiny:
        source = tiny_source or "tiny:" + str(build_tiny_model(workdir / "tiny"))
        model = MODEL
    else:
        source, model = f"embedded:{EMBEDDED}", EMBEDDED
    configure = soak_configure(not tiny, kill, auth_db)
    running = start_graph(source, workdir / "graph", configure, model=model)
    started = next(running)
    if auth_db:
        started["db"] = auth_db
    try:
        yield {**started, "model": model, "keys": make_accounts(started["db"])}
    finally:
        running.close()


def make_accounts(db: str) -> dict[str, str]:
    from tests.fixtures.auth import new_account

    keys = {name: new_account(db, name)[0] for name in ACCOUNTS}
    keys[LIMITED] = new_account(db, LIMITED, rpm=LIMITED_RPM)[0]
    keys[BROKE] = new_account(db, BROKE, quota_tokens=1)[0]
    return keys


def replica_pids(session: int) -> dict[str, list[int]]:
    """The graph's replica processes by deployment (``serve run`` leads their session)."""
    found: dict[str, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) != session:
                continue
            title = (entry / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if title.startswith(REPLICA_TITLE):
            name = title[len(REPLICA_TITLE) :].split(".")[0].split()[0]
            found.setdefault(name, []).append(int(entry.name))
    return {name: sorted(pids) for name, pids in found.items()}


def pss_kb(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    line = next(line for line in text.splitlines() if line.startswith("Pss:"))
    return int(line.split()[1])


def cache_bytes(ports: list[int]) -> dict[str, float]:
    """Each replica's prefix-cache bytes from Ray's Prometheus endpoints: ``Deployment#replica``."""
    found: dict[str, float] = {}
    for port in ports:
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        except httpx.HTTPError:
            continue
        for line in text.splitlines():
            if not line.startswith(CACHE_METRIC + "{"):
                continue
            labels, value = line[len(CACHE_METRIC) + 1 :].rsplit("} ", 1)
            pairs = (part.split("=", 1) for part in labels.split('",') if "=" in part)
            tags = {key: value.strip('"') for key, value in pairs}
            name = f"{tags.get('deployment', '?')}#{tags.get('replica', '?')}"
            found[name] = float(value)
    return found
