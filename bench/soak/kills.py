"""Each deployment killed under load (SIGKILL of every replica process): in-flight
outcomes, recovery, billing."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from bench.common import table
from bench.soak import BACKSTOP_GRACE_S, DEPLOYMENTS, KILL_LIMITS, RECOVERY_S, REFUSED
from bench.soak.calls import Call, send
from bench.soak.graph import replica_pids
from bench.soak.ledger import LedgerCheck, settled_ledger
from bench.soak.run import deadline_s, five_xx
from bench.soak.traffic import Traffic


@dataclass
class KillPhase:
    deployment: str
    killed: list[int]
    killed_at: float  # time.time()
    running_s: float | None  # Serve runs new replica processes
    back_s: float | None  # and a request through them answered 200
    in_flight: list[Call]
    probes: list[Call]
    ledger: LedgerCheck | None = None


def long_requests(model: str, deployment: str, tiny: bool) -> list[tuple[str, str, dict]]:
    """Requests that are running on ``deployment`` (or through it) when it is killed."""
    fim = {"model": model, "prompt": "def main(", "max_tokens": 2000 if tiny else 400,
           "temperature": 0.0, "presence_penalty": 0.2, "stop": [], "stream": True,
           "stream_options": {"include_usage": True}}  # fmt: skip
    chat = {"model": model, "messages": [{"role": "user", "content": "Count to a thousand."}],
            "max_tokens": 2000 if tiny else 400, "temperature": 0.0, "presence_penalty": 0.2,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    decision = {"model": model, "state": "x " * (6000 if tiny else 1500),
                "questions": {f"q{i}": {"type": "noul"} for i in range(16)}}  # fmt: skip
    unary_fim = {**fim, "stream": False, "stream_options": None}
    by_deployment = {
        "FimModel": [("fim", "/v1/fim/completions", fim), ("fim", "/v1/completions", unary_fim)],
        "EditModel": [("chat", "/v1/chat/completions", chat),
                      ("chat", "/v1/chat/completions", {**chat, "stream": False,
                                                        "stream_options": None})],
        "DecisionScorer": [("decisions", "/v1/decisions", decision)] * 2,
    }  # fmt: skip
    through = [("fim", "/v1/fim/completions", fim), ("chat", "/v1/chat/completions", chat)]
    return by_deployment.get(deployment, through)


def probe_body(model: str, deployment: str) -> tuple[str, str, dict]:
    if deployment == "EditModel":
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        return "chat", "/v1/chat/completions", body
    if deployment == "DecisionScorer":
        return "decisions", "/v1/decisions", {"model": model, "state": "s",
                                               "questions": {"q": {"type": "noul"}}}  # fmt: skip
    return "fim", "/v1/fim/completions", {"model": model, "prompt": "x", "max_tokens": 1}


def kill_each(
    started: dict, tiny: bool, deployments: tuple[str, ...] = DEPLOYMENTS,
    log: Callable[[str], None] = print,
) -> tuple[list[KillPhase], list[Call]]:  # fmt: skip
    """Traffic runs; each deployment's replicas are killed (SIGKILL) in turn with long
    requests on them; returns what happened per deployment (the ledger checked at the end)
    and every call."""
    from tests.ray_admin import RayAdmin

    url, session, model = started["url"], started["pid"], started["model"]
    traffic = Traffic(url, model, started["keys"], tiny, seed=1)
    traffic.client_timeout = 2 * (KILL_LIMITS["decision_timeout_s"] + BACKSTOP_GRACE_S)
    admin = RayAdmin(started["ray_address"])
    phases: list[KillPhase] = []
    traffic.start()
    try:
        expected = admin.replica_counts()
        for deployment in deployments:
            phases.append(kill_one(traffic, admin, session, deployment, expected[deployment]))
            phase = phases[-1]
            back = f"running {seconds(phase.running_s)}, answering {seconds(phase.back_s)}"
            outcomes = [c.outcome for c in phase.in_flight]
            log(f"soak --kill: {deployment} pids {phase.killed}: in flight {outcomes}, back {back}")
    finally:
        traffic.finish()
        admin.close()
    calls = traffic.snapshot()
    check = settled_ledger(started["db"], calls)
    # each phase: the requests started from the previous kill to the next one
    starts = [float("-inf")] + [phase.killed_at for phase in phases[1:]]
    ends = [phase.killed_at for phase in phases[1:]] + [float("inf")]
    for phase, start, end in zip(phases, starts, ends, strict=True):
        mine = [c for c in calls if start <= c.started < end and c.status not in REFUSED]
        missing = [c for c in check.missing if start <= c.started < end]
        phase.ledger = LedgerCheck(
            matched=len(mine) - len(missing),
            missing=missing,
            doubled=[row for row in check.doubled if start <= row[-1] < end],
            unanswered=[row for row in check.unanswered if start <= row.created_at < end],
        )
    return phases, calls


def kill_one(
    traffic: Traffic, admin: object, session: int, deployment: str, expected: int
) -> KillPhase:
    limits = KILL_LIMITS
    started_events: list[threading.Event] = []
    threads = []
    client = httpx.Client(timeout=traffic.client_timeout)
    for kind, path, body in long_requests(traffic.model, deployment, traffic.tiny):
        event = threading.Event()
        started_events.append(event)

        def run(
            kind: str = kind, path: str = path, body: dict = body, event: threading.Event = event
        ) -> None:
            # a unary request is under way once sent: killed half a second later
            timer = threading.Timer(0.5 if not body.get("stream") else 60, event.set)
            timer.start()
            key = traffic.keys["soak-a"]
            call = send(client, traffic.url, key, "soak-a", kind, path, body, on_headers=event.set)
            event.set()  # a call that failed before its headers is under way no longer
            timer.cancel()
            traffic.record(call)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)
    for event in started_events:
        event.wait(60)
    time.sleep(0.5)
    killed = replica_pids(session).get(deployment, [])
    killed_at = time.time()
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    running_s, back_s, probes = wait_back(
        traffic, admin, session, deployment, expected, killed, killed_at
    )
    for thread in threads:
        thread.join(timeout=2 * limits["decision_timeout_s"])
    client.close()
    time.sleep(2)
    in_flight = [
        c for c in traffic.snapshot() if c.started < killed_at < c.ended and c not in probes
    ]
    return KillPhase(deployment, killed, killed_at, running_s, back_s, in_flight, probes)


def wait_back(
    traffic: Traffic, admin, session: int, deployment: str, expected: int, killed: list[int],
    killed_at: float,
) -> tuple[float | None, float | None, list[Call]]:  # fmt: skip
    """Seconds from the kill until Serve runs ``expected`` new replica processes of
    ``deployment`` (RUNNING in ``serve.status()``), and until a probe through it then answers
    200 (queued behind the traffic's requests meanwhile); None: not within ``RECOVERY_S``+60."""
    kind, path, body = probe_body(traffic.model, deployment)
    probes: list[Call] = []
    running_s = None
    with httpx.Client(timeout=traffic.client_timeout) as client:
        while time.time() - killed_at < RECOVERY_S + 60:
            if running_s is None:
                pids = set(replica_pids(session).get(deployment, []))
                running = admin.replica_counts().get(deployment, 0)  # type: ignore[attr-defined]
                if running == expected and len(pids) == expected and not pids & set(killed):
                    running_s = time.time() - killed_at
            if running_s is not None:
                call = traffic.send(client, "soak-b", kind, path, body)
                probes.append(call)
                if call.ok:
                    return running_s, time.time() - killed_at, probes
            time.sleep(0.5)
    return running_s, None, probes


def seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


def print_kills(phases: list[KillPhase]) -> None:
    rows = [["deployment", "killed pids", "in flight (outcomes)", "running / answering", "ledger"]]
    for phase in phases:
        outcomes = Counter(c.outcome for c in phase.in_flight)
        ledger = phase.ledger.line() if phase.ledger else "-"
        back = f"{seconds(phase.running_s)} / {seconds(phase.back_s)}"
        shown = ", ".join(f"{k} x{v}" for k, v in outcomes.items())
        rows.append([phase.deployment, ",".join(map(str, phase.killed)), shown, back, ledger])
    print(table(rows))
    for phase in phases:
        for call in phase.ledger.missing if phase.ledger else []:
            print(f"  {phase.deployment}: no row for {call}")
        for row in phase.ledger.doubled if phase.ledger else []:
            print(f"  {phase.deployment}: a row no request accounts for: {row}")


def kill_verdict(phases: list[KillPhase], calls: list[Call]) -> dict[str, tuple[bool | None, str]]:
    hung = [c for c in calls if c.seconds > deadline_s(c, KILL_LIMITS)]
    slow = [p.deployment for p in phases if p.running_s is None or p.running_s > RECOVERY_S]
    missing = sum(len(p.ledger.missing) for p in phases if p.ledger)
    doubled = sum(len(p.ledger.doubled) for p in phases if p.ledger)
    errors = five_xx(calls)
    unanswered = [row for p in phases if p.ledger for row in p.ledger.unanswered]
    tokens = sum(r.input_tokens + r.output_tokens for r in unanswered)
    return {
        "past deadline": (not hung, f"{len(hung)} requests: {[c.outcome for c in hung][:5]}"),
        f"running again within {RECOVERY_S:.0f} s": (
            not slow,
            f"not: {slow}" if slow else "all five",
        ),
        "ledger": (missing == 0 and doubled == 0, f"{missing} missing, {doubled} doubled"),
        "billed, never answered": (None, f"{len(unanswered)} rows, {tokens} tokens"),
        "5xx and dropped connections": (None, repr(dict(errors))),
    }
