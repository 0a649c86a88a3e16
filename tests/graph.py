"""The real graph for end-to-end tests: ``serve run`` on configs/local.yaml with the tiny model.

Started once per test session (``graph`` fixture in conftest.py), with 2 Router and 2
AuthService replicas so the auth tests check limits in total across replicas, and request
deadlines of 30 s (60 s for decisions) so a hang shows within a minute: tests/test_soak.py
kills each deployment of it under load last of all.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import LONG_CONTEXT, TEST_KEY

ROOT = Path(__file__).resolve().parents[1]
MODEL = "tiny-qwen2"
START_TIMEOUT_S = 240
# What ray.init() or `ray start` says when the raylet gave up on its node's agents: they have
# ~15 s to report their ports, which a 2-core box at load 15-40 did not always give them.
NODE_START_FAILED = "The current node timed out during startup"
START_ATTEMPTS = 3


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def graph_config(tiny_source: str, port: int) -> dict:
    """configs/local.yaml with the tiny model, two Router/AuthService replicas and the soak's
    short deadlines."""
    from bench.soak import KILL_LIMITS

    document = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())
    document["http_options"]["port"] = port
    (application,) = document["applications"]
    args = application["args"]
    tiny = {"id": MODEL, "source": tiny_source, "context_length": LONG_CONTEXT, "dtype": "auto"}
    args["models"] = [args["models"][0] | tiny]  # one model, the first's settings, every role
    args["roles"] = {"fim": MODEL, "edit": MODEL, "decisions": MODEL}
    args["limits"] = {**args.get("limits", {}), **KILL_LIMITS}
    # Tests that need a request in flight send LONG_FIM, which must run for seconds on any CPU:
    # prompt lookup would accept nearly every draft of the tiny model's one repeated token
    # (three tokens a step), so FIM drafts nothing here and writes one token a step.
    args["engine"]["speculation"]["fim"] = 0
    for name in ("Router", "AuthService"):
        deployment = deployment_options(document, name)
        deployment["autoscaling_config"] = {"min_replicas": 2, "max_replicas": 2}
        deployment["ray_actor_options"] = {"num_cpus": 0.05}
    return document


def deployment_options(document: dict, name: str) -> dict:
    """The ``deployments:`` entry of deployment ``name`` in a graph config (edit in place)."""
    (application,) = document["applications"]
    (options,) = [d for d in application["deployments"] if d["name"] == name]
    return options


def start_graph(
    tiny_source: str,
    workdir: Path,
    configure: Callable[[dict], None] | None = None,
    address: str | None = None,
    model: str = MODEL,
) -> Iterator[dict]:
    """``serve run`` on ``graph_config`` (``configure`` may edit it first), its files in
    ``workdir``: in a Ray cluster of its own, or on the running cluster at ``address`` (whose
    nodes' environment is then what the replicas see). Ready once FIM on ``model`` answers
    (a ``configure`` that serves other models names the FIM one)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    document = graph_config(tiny_source, port)
    if configure is not None:
        configure(document)
    config_path = workdir / "graph.yaml"
    config_path.write_text(yaml.safe_dump(document))
    # "local": a cluster of its own even where a `ray start` cluster runs on this machine
    # (ray.init() would join the last one started).
    env = {**os.environ, **graph_env(workdir), "RAY_ADDRESS": address or "local"}
    env.pop("SERVE_APP_AUTH_DB", None)
    log = workdir / "serve.log"
    url = f"http://127.0.0.1:{port}"
    for _ in range(START_ATTEMPTS):
        process = serve_run(config_path, env, log)
        if wait_until_ready(url, process, log, model):
            break
    else:
        pytest.fail(f"Ray did not start in {START_ATTEMPTS} tries:\n{log.read_text()[-4000:]}")
    try:
        yield {
            "url": url,
            "db": str(workdir / "data" / "auth.sqlite3"),
            "workdir": workdir,
            "pid": process.pid,
            "ray_address": address or gcs_address(process.pid),
            "log": workdir / "serve.log",
        }
    finally:
        kill_session(process)


def kill_session(leader: subprocess.Popen) -> None:
    """SIGKILL to every process of ``leader``'s session: ``serve run`` and, where it started
    its own Ray cluster, that cluster (its daemons and every replica). A test graph holds
    nothing to save, and Serve's orderly shutdown (serve run's Ctrl-C) took ~10 s a graph."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.getsid(int(entry.name)) == leader.pid:
                os.kill(int(entry.name), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    leader.wait(timeout=60)


def serve_run(config_path: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    """``serve run`` as ``make run`` starts it (``serve_app.launch``: Ray without its
    dashboard)."""
    return subprocess.Popen(
        [sys.executable, "-m", "serve_app.launch", str(config_path)],
        cwd=ROOT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def graph_env(workdir: Path) -> dict[str, str]:
    """What the graph's processes need in their environment: its data folder, the test key
    (bootstrapped as the local account's), no Ray token auth, no usage reporting."""
    return {
        "SERVE_APP_DATA_DIR": str(workdir / "data"),
        "SERVE_APP_API_KEY": TEST_KEY,
        "RAY_AUTH_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
    }


def wait_until_ready(url: str, process: subprocess.Popen, log: Path, model: str = MODEL) -> bool:
    """Ready when every deployment answers: a FIM call goes through auth and a model replica.
    False when Ray's own node did not start (``NODE_START_FAILED``: try again)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    body = {"model": model, "prompt": "x", "max_tokens": 1}
    while time.monotonic() < deadline:
        if process.poll() is not None and NODE_START_FAILED in log.read_text():
            return False
        if process.poll() is not None or "DEPLOY_FAILED" in log.read_text():
            pytest.fail(f"serve run failed:\n{log.read_text()[-4000:]}")
        try:
            response = httpx.post(
                f"{url}/v1/fim/completions", json=body, headers=auth(), timeout=10
            )
            if response.status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(1)
    pytest.fail(f"graph not ready after {START_TIMEOUT_S}s:\n{log.read_text()[-4000:]}")


def gcs_address(session_id: int) -> str | None:
    """The GCS address of the Ray cluster this graph's ``serve run`` started, or None.

    Explicit rather than ``ray.init(address="auto")``, which picks whichever cluster on the
    machine started last. ``serve run`` runs in its own session (``start_new_session``), its
    Ray daemons inherit it, and several of them carry ``--gcs-address=IP:PORT`` on their
    command lines. Linux (/proc) only.
    """
    if not Path("/proc").is_dir():
        return None
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getsid(int(entry.name)) != session_id:
                continue
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        for arg in args:
            if arg.startswith(b"--gcs-address="):
                return arg.split(b"=", 1)[1].decode()
    return None


def auth(key: str = TEST_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
