"""Two Ray nodes on one machine, PostgreSQL as the auth store, and a node lost under load.

The cluster is what configs/prod.yaml runs on, in small: a head (``ray start --head``) for the
Serve controller, the proxy, Router and AuthService, and a worker (``ray start --address``)
whose custom resource ``model_slot`` draws the three model deployments to it, as GPUs draw
them to the GPU workers in cluster.yaml. The auth store is a PostgreSQL server from the
machine's own ``initdb``/``pg_ctl`` (``postgres_server``, on a Unix socket). Every address is
loopback.

The head has model slots too, so that Serve can restart the models there once the worker is
gone ("the remaining node"). While the graph deploys, a placeholder actor holds the head's
slots, so the first placement is on the worker for certain; it is released before the kill.
(Ray offers no "prefer this node" for Serve replicas: ``label_selector`` is hard, and with a
``fallback_strategy`` Serve 2.60's spread scheduler placed a replica on the unlabelled head
although the labelled worker was free.)

Then FIM streams, FIM and chat requests are in flight when the worker's whole process group
(raylet and every replica on it) is killed with SIGKILL. Afterwards: every request answered
200, a 503 with Retry-After, or (a stream already under way) an SSE error event and [DONE],
within a bound that tells an answer from a hang; the ledger rows written in PostgreSQL are
exactly the delivered answers' usage (one row each, same tokens), a stream cut by the kill
included: the router bills what it had delivered and tells the client in a usage chunk before
the error event (a plain call's 503 delivered nothing: its row, if any, is of no tokens);
Serve restarts the model replicas on the head and new requests answer 200.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from serve_app.api.common import ErrorResponse
from serve_app.auth.store import open_store
from tests.conftest import LONG_FIM, new_postgres_schema
from tests.graph import MODEL, ROOT, auth, deployment_options, free_port, graph_env, start_graph
from tests.ray_admin import RayAdmin

pytestmark = pytest.mark.ray

MODEL_DEPLOYMENTS = ("FimModel", "EditModel", "DecisionScorer")
MODEL_SLOTS = len(MODEL_DEPLOYMENTS)
NODE_START_S = 180
START_ATTEMPTS = 10
# An answer, even a failure, comes within this; longer is a hang (the request deadline in
# this config is 30 s, and Ray notices a dead node within seconds).
ANSWER_WITHIN_S = 60
RECOVERY_S = 180


@dataclass
class Answer:
    """What a client got: status, Retry-After, the usage it was told (a whole answer's, or a
    cut stream's usage chunk of what it delivered; None if there was none), whether a stream
    ended in an error event, and how long it took; for a stream, how many events with text it
    delivered."""

    kind: str
    status: int
    retry_after: str | None
    usage: dict | None
    error_event: dict | None
    body: str
    seconds: float
    text_events: int = 0


class RayNode:
    """One ``ray start --block`` in a process group of its own: SIGKILL to the group is the
    node lost (raylet, agents and every worker process on it)."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], workdir: Path) -> None:
        self.command = [
            str(Path(sys.executable).with_name("ray")),
            "start",
            "--block",
            "--node-ip-address=127.0.0.1",
            "--disable-usage-stats",
            *args,
        ]
        self.env = env
        self.log = workdir / f"{name}.log"
        self.temp_dirs: list[str] = []
        self.process = self.start()

    def start(self) -> subprocess.Popen:
        # A temp dir of its own: Ray writes its "last cluster started" file there, so no other
        # ray.init() on this machine joins this cluster; and this node's logs are its alone.
        # Short: Ray's socket paths must fit in 107 bytes.
        self.temp_dirs.append(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
        self.log_offset = self.log.stat().st_size if self.log.exists() else 0
        ports = [
            f"--{flag}={free_port()}"
            for flag in (
                "dashboard-agent-listen-port",
                "dashboard-agent-grpc-port",
                "metrics-export-port",
                "runtime-env-agent-port",
            )
        ]
        return subprocess.Popen(
            [*self.command, *ports, f"--temp-dir={self.temp_dirs[-1]}"],
            env=self.env,
            stdout=self.log.open("a"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def wait_started(self) -> None:
        """Until ``ray start`` says the node runs. The raylet gives up when the node's agents
        take more than ~15 s to report their ports (seen at load 17-40 on a 2-core box, not
        configurable): then the node is started again, up to START_ATTEMPTS times."""
        for _ in range(START_ATTEMPTS):
            deadline = time.monotonic() + NODE_START_S
            while time.monotonic() < deadline and self.process.poll() is None:
                if "Ray runtime started" in self.log.read_text()[self.log_offset :]:
                    return
                if self.raylet_failed():
                    break
                time.sleep(0.5)
            self.kill()
            self.process = self.start()
        pytest.fail(f"ray start failed {START_ATTEMPTS} times:\n{self.log.read_text()[-3000:]}")

    def raylet_failed(self) -> bool:
        logs = Path(self.temp_dirs[-1]).glob("session_*/logs/raylet*.out")
        return any("Check failed" in log.read_text(errors="replace") for log in logs)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def remove_files(self) -> None:
        for folder in self.temp_dirs:
            shutil.rmtree(folder, ignore_errors=True)


def wait_for_nodes(admin: RayAdmin, count: int) -> None:
    deadline = time.monotonic() + NODE_START_S
    while admin.command("nodes")["alive"] != count:
        if time.monotonic() > deadline:
            pytest.fail(f"{count} Ray nodes not up after {NODE_START_S}s")
        time.sleep(0.5)


def wait_for_replicas(admin: RayAdmin, deadline: float) -> dict[str, int]:
    """Until every deployment has its replicas RUNNING (Serve's status); the counts."""
    expected = {"Router": 2, "AuthService": 2, **dict.fromkeys(MODEL_DEPLOYMENTS, 1)}
    while (counts := admin.replica_counts()) != expected:
        if time.monotonic() > deadline:
            pytest.fail(f"replicas not back: {counts}")
        time.sleep(1)
    return counts


def two_node_config(dsn: str):
    """The graph config's edits: PostgreSQL, Router/AuthService on the head, models on a
    model slot, a 30 s request deadline."""

    def configure(document: dict) -> None:
        (application,) = document["applications"]
        application["args"]["auth"]["db"] = dsn
        application["args"]["limits"] = {"request_timeout_s": 30}
        for name in ("Router", "AuthService"):
            options = deployment_options(document, name)["ray_actor_options"]
            options["resources"] = {"ingress_slot": 1}
        for name in MODEL_DEPLOYMENTS:
            options = {"num_cpus": 0.2, "resources": {"model_slot": 1}}
            deployment_options(document, name)["ray_actor_options"] = options

    return configure


@pytest.fixture(scope="module")
def cluster(
    tiny_source: str, postgres_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict]:
    workdir = tmp_path_factory.mktemp("cluster")
    dsn = new_postgres_schema(postgres_server)
    # The nodes' environment is the replicas': this worktree's code, the test key, the store.
    env = {**os.environ, **graph_env(workdir), "PYTHONPATH": str(ROOT)}
    # The raylet gives the node's agents ~15 s to start and report their ports: on a loaded
    # 2-core box (load 17-37 here) the dashboard agent's imports alone took longer.
    env["RAY_raylet_start_wait_time_s"] = "180"
    env["RAY_agent_register_timeout_ms"] = "180000"
    env.pop("RAY_ADDRESS", None)
    gcs = f"127.0.0.1:{free_port()}"
    head = RayNode(
        "head",
        [
            "--head",
            f"--port={gcs.split(':')[1]}",
            f"--ray-client-server-port={free_port()}",
            "--include-dashboard=false",
            "--num-cpus=2",
            json_flag("--resources", {"ingress_slot": 8, "model_slot": MODEL_SLOTS}),
        ],
        env,
        workdir,
    )
    worker = None
    admin = None
    try:
        head.wait_started()
        admin = RayAdmin(gcs)
        worker = RayNode(
            "worker",
            [
                f"--address={gcs}",
                "--num-cpus=2",
                json_flag("--resources", {"model_slot": MODEL_SLOTS}),
            ],
            env,
            workdir,
        )
        worker.wait_started()
        wait_for_nodes(admin, 2)
        admin.command(f"hold model_slot {MODEL_SLOTS}")  # the first placement: the worker
        graph = start_graph(tiny_source, workdir, two_node_config(dsn), address=gcs)
        started = next(graph)
        wait_for_replicas(admin, time.monotonic() + NODE_START_S)
        admin.command("release")
        try:
            yield {**started, "admin": admin, "worker": worker, "dsn": dsn}
        finally:
            graph.close()
    finally:
        if admin is not None:
            admin.close()
        for node in (worker, head):
            if node is not None:
                node.kill()
                node.remove_files()


def json_flag(flag: str, value: dict) -> str:
    return f"{flag}={json.dumps(value)}"


# --- the clients ------------------------------------------------------------------------------


def fim_body(stream: bool, max_tokens: int = 3000) -> dict:
    return {"model": MODEL, **LONG_FIM, "max_tokens": max_tokens, "stream": stream,
            "stream_options": {"include_usage": True} if stream else None}  # fmt: skip


def chat_body(max_tokens: int = 3000) -> dict:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "presence_penalty": 0.2,
    }


def post(url: str, path: str, body: dict, kind: str) -> Answer:
    """One non-streamed request, timed."""
    start = time.monotonic()
    with httpx.Client(timeout=ANSWER_WITHIN_S * 2) as client:
        response = client.post(url + path, json=body, headers=auth())
    usage = response.json().get("usage") if response.status_code == 200 else None
    return Answer(
        kind, response.status_code, response.headers.get("retry-after"), usage, None,
        response.text, time.monotonic() - start,
    )  # fmt: skip


def stream(url: str, started: threading.Event, max_tokens: int = 3000) -> Answer:
    """A FIM stream read to its end; ``started`` is set once its first event is in."""
    start = time.monotonic()
    events: list[str] = []
    with httpx.Client(timeout=ANSWER_WITHIN_S * 2) as client:
        body = fim_body(stream=True, max_tokens=max_tokens)
        with client.stream("POST", f"{url}/v1/fim/completions", json=body, headers=auth()) as r:
            status, retry_after = r.status_code, r.headers.get("retry-after")
            if status != 200:  # refused before its first chunk: a JSON error body
                started.set()
                text = r.read().decode()
            for line in r.iter_lines() if status == 200 else ():
                if line.startswith("data: "):
                    events.append(line[6:])
                    started.set()
    started.set()
    if status == 200:
        assert events and events[-1] == "[DONE]", events[-3:]
        text = "\n".join(events[-3:])
    payloads = [json.loads(event) for event in events if event != "[DONE]"]
    return Answer(
        "fim-stream", status, retry_after,
        next((p["usage"] for p in payloads if p.get("usage")), None),
        next((p for p in payloads if "error" in p), None),
        text, time.monotonic() - start,
        sum(1 for p in payloads if any(c.get("text") for c in p.get("choices") or ())),
    )  # fmt: skip


def assert_clean(answer: Answer) -> None:
    """200 with a whole answer, 503 with Retry-After, or a stream that ended in an error
    event; no traceback anywhere; within ANSWER_WITHIN_S."""
    assert answer.seconds < ANSWER_WITHIN_S, answer
    assert "Traceback" not in answer.body, answer
    if answer.status == 200 and answer.error_event is None:
        assert answer.usage is not None, answer
        return
    if answer.status == 200:  # the stream was under way: the error travels as an event
        error = ErrorResponse.model_validate(answer.error_event).error
        if answer.text_events:  # and what it delivered is billed: the usage chunk says what
            assert answer.usage is not None, answer
            assert answer.usage["completion_tokens"] >= answer.text_events, answer
    else:
        assert answer.status == 503, answer
        assert answer.retry_after is not None and int(answer.retry_after) >= 1, answer
        error = ErrorResponse.model_validate_json(answer.body).error
    assert (error.type, error.code) == ("server_error", "service_unavailable"), answer


def ledger(dsn: str) -> list:
    store = open_store(dsn)
    try:
        account = store.get_account_by_name("local")
        return store.list_usage(account.id, limit=100_000)
    finally:
        store.close()


# --- the test ---------------------------------------------------------------------------------


def test_losing_the_model_node_under_load(cluster):
    url, admin, dsn = cluster["url"], cluster["admin"], cluster["dsn"]
    before = {row.id for row in ledger(dsn)}

    streams_started = [threading.Event() for _ in range(3)]
    with ThreadPoolExecutor(max_workers=12) as pool:
        futures = [pool.submit(stream, url, event) for event in streams_started]
        futures += [
            pool.submit(post, url, "/v1/fim/completions", fim_body(False), "fim") for _ in range(3)
        ]
        futures += [
            pool.submit(post, url, "/v1/chat/completions", chat_body(), "chat") for _ in range(2)
        ]
        # short ones that finish before the kill: delivered answers that must be billed
        futures += [
            pool.submit(post, url, "/v1/fim/completions", fim_body(False, 8), "fim-short")
            for _ in range(2)
        ]
        for event in streams_started:
            assert event.wait(ANSWER_WITHIN_S), "a stream never started"
        time.sleep(0.5)
        killed_at = time.monotonic()
        cluster["worker"].kill()
        # new requests while the node is gone and its replicas restart on the head
        probes = recover(url, killed_at)
        answers = [future.result(timeout=ANSWER_WITHIN_S * 2) for future in futures]
    outcomes = [(a.kind, a.status, "error event" if a.error_event else "") for a in answers]
    print(f"\ncluster: in flight at the kill: {outcomes}")
    cut = [(a.text_events, a.usage) for a in answers if a.error_event]
    print(f"cluster: streams cut by the kill delivered (text events, usage billed): {cut}")
    print(f"cluster: probes after it: {[(a.kind, a.status) for a in probes]}")

    for answer in answers + probes:
        assert_clean(answer)
    assert any(a.error_event or a.status == 503 for a in answers), "the kill hit no request"

    # replicas back on the one node left, and answering
    assert admin.command("nodes")["alive"] == 1
    wait_for_replicas(admin, killed_at + RECOVERY_S)
    after = [
        post(url, "/v1/fim/completions", fim_body(False, 8), "after"),
        post(url, "/v1/chat/completions", chat_body(8), "after"),
    ]
    assert [a.status for a in after] == [200, 200], after

    # billing: exactly one ledger row per delivered answer, with its tokens
    answered = answers + probes + after

    def told(status: int) -> list[tuple[int, int]]:
        """(input, output) tokens of the answers that ended as ``status`` would bill them:
        200 a whole answer, 503 a stream cut by the kill (the usage chunk before its error)."""
        return sorted(
            (a.usage["prompt_tokens"], a.usage["completion_tokens"])
            for a in answered
            if a.status == 200 and a.usage is not None and bool(a.error_event) == (status == 503)
        )

    def billed(rows: list, status: int) -> list[tuple[int, int]]:
        """What ``rows`` of ``status`` billed; a plain call whose replica died delivered
        nothing, and its row (503) is of no tokens (``billing.bill_lost_answer``): left out."""
        counts = [(r.input_tokens, r.output_tokens) for r in rows if r.status == status]
        return sorted(c for c in counts if status != 503 or c != (0, 0))

    # Some ledger writes are detached from the answer: wait until every answer's row is there.
    deadline = time.monotonic() + 30
    while True:
        rows = [r for r in ledger(dsn) if r.id not in before]
        settled = all(billed(rows, status) == told(status) for status in (200, 503))
        if settled or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    # one row per request: every row names its request, no request twice
    assert all(r.request_id for r in rows) and len({r.request_id for r in rows}) == len(rows)
    for status in (200, 503):
        assert billed(rows, status) == told(status), status
    unary_503 = [a for a in answered if a.status == 503]
    nothing = [r for r in rows if (r.status, r.input_tokens, r.output_tokens) == (503, 0, 0)]
    assert len(nothing) <= len(unary_503), (nothing, unary_503)
    cut = [a for a in answered if a.error_event and a.text_events]
    assert cut and all(a.usage is not None for a in cut), "a cut stream's text went unbilled"
    # Any other row is work a replica did and the router cancelled at its backstop, just as
    # the replica took the request (a race with the replica's start): billed as a client that
    # left (499), as serve_app.serving.billing bills any cancelled request.
    others = [r for r in rows if r.status not in (200, 503)]
    print(f"cluster: {len(rows)} ledger rows, {len(told(200))} answers and {len(cut)} cut streams "
          f"delivered, others {others}")  # fmt: skip
    assert all(r.status == 499 for r in others), others


def recover(url: str, since: float) -> list[Answer]:
    """FIM (streamed and not) and chat requests every half second until each answers 200."""
    probes: list[Answer] = []
    ok: set[str] = set()
    while ok != {"fim", "chat", "fim-stream"}:
        if time.monotonic() - since > RECOVERY_S:
            last = [(a.kind, a.status) for a in probes[-6:]]
            pytest.fail(f"no recovery in {RECOVERY_S}s: {last}")
        for kind, path, body in (
            ("fim", "/v1/fim/completions", fim_body(False, 8)),
            ("chat", "/v1/chat/completions", chat_body(8)),
        ):
            if kind not in ok:
                probes.append(post(url, path, body, kind))
                if probes[-1].status == 200:
                    ok.add(kind)
        if "fim-stream" not in ok:
            probes.append(stream(url, threading.Event(), max_tokens=8))
            if probes[-1].status == 200 and probes[-1].error_event is None:
                ok.add("fim-stream")
        time.sleep(0.5)
    print(f"cluster: every probe answers 200 again {time.monotonic() - since:.1f}s after the kill")
    return probes
