"""Soak: mixed client traffic for minutes against the real graph, and each deployment killed.

    .venv/bin/python -m bench.soak --minutes 30 --warmup 3  # embedded 0.5B, configs/local.yaml
    .venv/bin/python -m bench.soak --minutes 3 --tiny       # the tiny random model, a quick check
    .venv/bin/python -m bench.soak --kill [--tiny]          # kill -9 each deployment in turn
    ... --dump run.json                                     # every call and ledger row, as JSON

Figures and what they showed: docs/operations.md (Reliability).

It starts its own ``serve run`` (tests/graph.py) on configs/local.yaml. Embedded: the models,
roles, engine and deployments as local.yaml declares them, except that every role runs the
0.5B (the 1.5B local.yaml names for FIM and decisions is not installed on the soak box; the
file itself says to name the 0.5B for FIM on an AVX2 CPU). ``--tiny``: tests/graph.py's tiny
random model, two Router and two AuthService replicas.

Traffic (``Traffic``): one closed-loop user per account, three accounts (``soak-a`` sends as
Continue, ``soak-b`` as Zed, ``soak-c`` as Kilo Code/ProxyAI): a keystroke FIM session (the
prefix grows by a character a request, same file, streamed every other request), then one of
next-edit, apply, decisions or chat (streamed). One stream in ``CANCEL_SHARE`` is closed by
the client after its first text. Designed refusals: once an interval ``soak-rate`` (5 requests
a minute) sends short FIM requests until it gets two 429s, and ``soak-quota``, whose quota is
spent, one request (402).

Every interval (``--sample-s``, a minute): each replica's PSS (``/proc/PID/smaps_rollup`` of
the ``ray::ServeReplica:llm:<Deployment>`` processes of this graph), each prefix cache's bytes
(``ray_serve_app_engine_prefix_cache_bytes`` on Ray's Prometheus endpoint), p50/p99 per kind
of request (200s, not cancelled), 5xx by kind (status and code; a stream's error event counts
as its code), the load average. At the end the ledger (usage_ledger) against what every
client was told (``check_ledger``): rows are matched per account to the requests, a whole
answer by (endpoint, status 200, input, output tokens), a cut stream by its usage chunk, a
cancelled stream by one 499 (or 200, when it finished first) row, an error after admission
by one row of its status (or none), a refusal by none, a request whose router died under it
by one row of what the model side processed ("unanswered"). The ledger's request id is the
router's own (not the ``x-request-id`` a client sees), so the match is by these multisets: a
missing row is a request left unmatched, a doubled one a row no request accounts for.

The verdict is issue 50's: p99 per kind over the last 5 intervals at most 1.3x the first 5
after warm-up; no replica's PSS more than 5% over its value at the end of warm-up; 0 ledger
rows missing or doubled; no 5xx but designed 503s; no request past its deadline.

``--kill``: the same traffic runs; each of Router, AuthService, FimModel, EditModel and
DecisionScorer in turn has every replica's OS process killed with SIGKILL while long requests
run on it; printed per deployment: the in-flight requests' outcomes, seconds until Serve runs
the deployment's replicas again (new processes) and a request through it answers 200, and the
ledger check of the requests started in its phase. Request deadlines are 30 s (60 s for
decisions) there, as tests/test_cluster.py's, so a hang shows within a minute.
tests/test_soak.py runs both, short, on the tiny model.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.common import ROOT, cpu_flags, percentile, table

DEPLOYMENTS = ("Router", "AuthService", "FimModel", "EditModel", "DecisionScorer")
EMBEDDED = "qwen2.5-coder-0.5b"
REPLICA_TITLE = "ray::ServeReplica:llm:"
CACHE_METRIC = "ray_serve_app_engine_prefix_cache_bytes"
CANCEL_SHARE = 0.1
KEYSTROKES = 6
KEYSTROKE_GAP_S = 0.15
WINDOW = 5  # intervals compared at the start and the end
P99_RATIO = 1.3
PSS_GROWTH = 0.05
BACKSTOP_GRACE_S = 5.0  # serve_app.http.app: the router answers this long past a deadline
HANG_MARGIN_S = 15.0  # past deadline + grace: a hang, not a slow answer
KILL_LIMITS = {"request_timeout_s": 30, "decision_timeout_s": 60}
RECOVERY_S = 60.0
REFUSED = (401, 402, 429)  # answered before admission: no ledger row
ACCOUNTS = ("soak-a", "soak-b", "soak-c")
LIMITED = "soak-rate"  # a request rate limit it goes over once an interval
LIMITED_RPM = 5
BROKE = "soak-quota"  # a spent quota
# an error event's code, and the status its ledger row records
CODE_STATUS = {"timeout": 504, "service_unavailable": 503, "bad_gateway": 502}
LEDGER_ENDPOINTS = {
    "/v1/fim/completions": "fim.completions",
    "/v1/completions": "fim.completions",
    "/v1/edit/completions": "edit.completions",
    "/v1/chat/completions": "chat.completions",
    "/v1/apply/completions": "apply.completions",
    "/v1/decisions": "decisions",
}


# --- what a client got --------------------------------------------------------------------------


@dataclass
class Call:
    """One request and what its client got: the status, the error code (a JSON body's, or a
    stream's error event's), the usage it was told (input, output), how many events carried
    text, whether the client closed the stream itself, and a transport failure's name."""

    account: str
    kind: str
    path: str
    stream: bool
    started: float  # time.time()
    seconds: float = 0.0
    status: int = 0
    code: str | None = None
    usage: tuple[int, int] | None = None
    error_event: bool = False
    text_events: int = 0
    cancelled: bool = False
    failure: str | None = None

    @property
    def endpoint(self) -> str:
        return LEDGER_ENDPOINTS[self.path]

    @property
    def ended(self) -> float:
        return self.started + self.seconds

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error_event and not self.failure

    @property
    def outcome(self) -> str:
        if self.failure:
            return self.failure
        if self.cancelled:
            return "cancelled"
        if self.error_event:
            return f"200+{self.code}"
        return str(self.status) if self.status == 200 else f"{self.status} {self.code}"


def usage_of(usage: dict | None) -> tuple[int, int] | None:
    if not usage:
        return None
    if "input_tokens" in usage:  # decisions
        return usage["input_tokens"], usage["output_tokens"]
    return usage["prompt_tokens"], usage["completion_tokens"]


def chunk_text(chunk: dict) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    return choice.get("text") or (choice.get("delta") or {}).get("content") or ""


def send(
    client: httpx.Client, url: str, key: str, account: str, kind: str, path: str, body: dict,
    cancel: bool = False,
) -> Call:  # fmt: skip
    """One request as its client sends it; a stream is read to ``[DONE]``, or closed after
    its first text when ``cancel``."""
    call = Call(account, kind, path, bool(body.get("stream")), time.time())
    start = time.monotonic()
    headers = {"Authorization": f"Bearer {key}"}
    try:
        if not call.stream:
            response = client.post(url + path, json=body, headers=headers)
            call.status = response.status_code
            if call.status == 200:
                call.usage = usage_of(response.json().get("usage"))
            else:
                call.code = error_code(response.content)
        else:
            with client.stream("POST", url + path, json=body, headers=headers) as response:
                call.status = response.status_code
                if call.status != 200:
                    call.code = error_code(response.read())
                else:
                    read_stream(response, call, cancel)
    except (httpx.HTTPError, ValueError) as exc:
        call.failure = type(exc).__name__
    call.seconds = time.monotonic() - start
    return call


def error_code(body: bytes) -> str:
    """The contract error's code; Ray's proxy answers some failures in plain text."""
    try:
        return str((json.loads(body).get("error") or {}).get("code"))
    except (ValueError, AttributeError):
        return f"text: {body[:40].decode(errors='replace')!r}"


def read_stream(response: httpx.Response, call: Call, cancel: bool) -> None:
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        if line[6:] == "[DONE]":
            return
        chunk = json.loads(line[6:])
        if "error" in chunk:
            call.error_event = True
            call.code = chunk["error"].get("code")
        call.usage = usage_of(chunk.get("usage")) or call.usage
        if chunk_text(chunk):
            call.text_events += 1
            if cancel:
                call.cancelled = True
                return  # leaving the `with` closes the connection: the client went away
    call.failure = "no [DONE]"


# --- the traffic ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Material:
    """Code a session works on: a prefix, the line being typed, the rest of the file."""

    path: str
    prefix: str
    line: str
    suffix: str


def materials(count: int, seed: int) -> list[Material]:
    from bench.keystroke import typing_sessions

    sessions = typing_sessions(count, KEYSTROKES, seed)
    return [
        Material(s.source.split(":")[0], s.prefix[-2000:], s.line, s.suffix[:600]) for s in sessions
    ]


class Traffic:
    """The client loops and every ``Call`` they made (``calls``, in order of ending)."""

    def __init__(self, url: str, model: str, keys: dict[str, str], tiny: bool, seed: int = 0):
        self.url = url
        self.model = model
        self.keys = keys
        self.tiny = tiny
        self.seed = seed
        self.calls: list[Call] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.materials = materials(24, seed)
        self.client_timeout = 600.0

    def record(self, call: Call) -> Call:
        with self.lock:
            self.calls.append(call)
        return call

    def snapshot(self) -> list[Call]:
        with self.lock:
            return list(self.calls)

    def start(self) -> None:
        for index, account in enumerate(ACCOUNTS):
            thread = threading.Thread(target=self.user, args=(account, index), daemon=True)
            thread.start()
            self.threads.append(thread)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=self.client_timeout)

    def send(
        self, client: httpx.Client, account: str, kind: str, path: str, body: dict,
        cancel: bool = False,
    ) -> Call:  # fmt: skip
        call = send(client, self.url, self.keys[account], account, kind, path, body, cancel)
        return self.record(call)

    def user(self, account: str, index: int) -> None:
        rng = random.Random(self.seed * 100 + index)
        with httpx.Client(timeout=self.client_timeout) as client:
            while not self.stop.is_set():
                material = rng.choice(self.materials)
                self.keystrokes(client, account, material, rng)
                if self.stop.is_set():
                    break
                kind = rng.choice(("next-edit", "apply", "decisions", "chat"))
                path, body = getattr(self, kind.replace("-", "_"))(account, material, rng)
                cancel = bool(body.get("stream")) and rng.random() < CANCEL_SHARE
                self.send(client, account, kind, path, self.long(body) if cancel else body, cancel)

    def long(self, body: dict) -> dict:
        """A stream the client will close: long enough that it is still running then."""
        return {**body, "max_tokens": 256, "stop": []}

    def keystrokes(
        self, client: httpx.Client, account: str, material: Material, rng: random.Random
    ) -> None:
        """Typing a line: a FIM request a keystroke, the prefix one character longer each."""
        for typed in range(1, KEYSTROKES + 1):
            if self.stop.is_set():
                return
            stream = typed % 2 == 0
            body = {
                "model": self.model,
                "prompt": material.prefix + material.line[:typed],
                "suffix": material.suffix,
                "max_tokens": 16,
                "temperature": 0,
                "stop": ["\n"],
            }
            if stream:
                body |= {"stream": True, "stream_options": {"include_usage": True}}
            cancel = stream and rng.random() < CANCEL_SHARE
            path = "/v1/fim/completions" if stream else "/v1/completions"
            self.send(client, account, "fim", path, self.long(body) if cancel else body, cancel)
            time.sleep(KEYSTROKE_GAP_S)

    def next_edit(self, account: str, material: Material, rng: random.Random) -> tuple[str, dict]:
        from tests.fixtures.edit_clients import (
            EDIT_PATH,
            Scenario,
            continue_call,
            kilo_call,
            zed_call,
        )

        lines = (material.prefix.rsplit("\n", 30)[-30:] if material.prefix else [""])[:-1]
        lines = [*lines, material.line, *material.suffix.split("\n")[:8]]
        row = min(len(lines) - 1, 24)
        changed = f"{lines[row - 2]}  # reviewed"
        hunk = f"@@ -{row - 1},1 +{row - 1},1 @@\n-{lines[row - 2]}\n+{changed}"
        lines[row - 2] = changed
        scenario = Scenario(
            path=material.path, file="\n".join(lines), cursor=(row, 0), first_line=row,
            last_line=min(row + 4, len(lines) - 1), snippets=(), hunks=(hunk,),
        )  # fmt: skip
        build = {"soak-a": continue_call, "soak-b": zed_call}.get(account, kilo_call)
        body = dict(build(scenario, self.model).body)
        if self.tiny:  # random weights write to max_tokens: keep it short
            body["max_tokens"] = 48
        return EDIT_PATH, body

    def apply(self, account: str, material: Material, rng: random.Random) -> tuple[str, dict]:
        from tests.clients import continue_apply_messages, tagged_apply

        lines = material.prefix.split("\n")[-16:]
        at = rng.randrange(len(lines))
        edited = [*lines]
        edited[at] = f"{lines[at]}  # updated"
        snippet = "\n".join(edited[max(0, at - 2) : at + 3])
        original = "\n".join(lines)
        if account == "soak-a":  # Continue: its prompt and prefill, streamed
            body = {"model": self.model, "messages": continue_apply_messages(original, snippet),
                    "temperature": 0.0, "stream": True,
                    "stream_options": {"include_usage": True}}  # fmt: skip
        else:  # ProxyAI: the tagged format, one answer
            content = tagged_apply(original, snippet)
            body = {"model": self.model, "messages": [{"role": "user", "content": content}],
                    "stream": False}  # fmt: skip
        if self.tiny:
            body["max_tokens"] = 64
        return "/v1/apply/completions", body

    def decisions(self, account: str, material: Material, rng: random.Random) -> tuple[str, dict]:
        body = {
            "model": self.model,
            "state": material.prefix[-1200:],
            "questions": {
                "done": {"type": "noul", "instructions": "Is the function complete?"},
                "next": {
                    "type": "choice",
                    "criteria": {"test": "write a test", "refactor": None, "ship": None},
                },
            },
        }
        return "/v1/decisions", body

    def chat(self, account: str, material: Material, rng: random.Random) -> tuple[str, dict]:
        question = f"What does this line do?\n```\n{material.line}\n```"
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 48,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        return "/v1/chat/completions", body

    def refusals(self) -> None:
        """The designed refusals of an interval: the rate-limited account sends short FIM
        requests until two 429s (or 3x its rate), the spent account one request (402)."""
        body = {"model": self.model, "prompt": "x", "max_tokens": 1}
        with httpx.Client(timeout=self.client_timeout) as client:
            limited = 0
            for _ in range(3 * LIMITED_RPM):
                call = self.send(client, LIMITED, "burst", "/v1/fim/completions", body)
                limited += call.status == 429
                if limited == 2 or self.stop.is_set():
                    break
            self.send(client, BROKE, "quota", "/v1/fim/completions", body)


# --- the graph and what it holds ------------------------------------------------------------------


def soak_configure(embedded: bool, kill: bool) -> Callable[[dict], None]:
    """Edit tests/graph.py's config: embedded, local.yaml's settings with the 0.5B in every
    role; ``kill``, the short deadlines."""

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

    return configure


@contextlib.contextmanager
def soak_graph(
    workdir: Path, tiny: bool, kill: bool, tiny_source: str | None = None
) -> Iterator[dict]:
    """The graph (tests/graph.py's ``start_graph``) and its accounts: ``keys`` by account."""
    from serve_app.models.tiny import build_tiny_model
    from tests.graph import MODEL, start_graph

    if tiny:
        source = tiny_source or "tiny:" + str(build_tiny_model(workdir / "tiny"))
        model = MODEL
    else:
        source, model = f"embedded:{EMBEDDED}", EMBEDDED
    running = start_graph(source, workdir / "graph", soak_configure(not tiny, kill), model=model)
    started = next(running)
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


# --- the ledger -----------------------------------------------------------------------------------


@dataclass
class LedgerCheck:
    """Rows against calls: ``missing``, calls that should have a row and have none;
    ``doubled``, rows no call accounts for (account, endpoint, status, input, output tokens,
    created_at); ``matched`` rows, of which ``unanswered`` are of requests whose client got
    no answer (the router died under them): work the model side did and billed."""

    matched: int = 0
    missing: list[Call] = field(default_factory=list)
    doubled: list[tuple] = field(default_factory=list)
    unanswered: list = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.missing and not self.doubled

    def line(self) -> str:
        unanswered = ""
        if self.unanswered:
            tokens = sum(r.input_tokens + r.output_tokens for r in self.unanswered)
            unanswered = f" ({len(self.unanswered)} of unanswered requests, {tokens} tokens)"
        return (
            f"{self.matched} rows matched{unanswered}, {len(self.missing)} missing, "
            f"{len(self.doubled)} doubled"
        )


def ledger_rows(db: str, names: list[str], since: float = 0.0) -> dict[str, list]:
    """Each account's rows written from ``since`` (the store's clock, ``time.time()``)."""
    from serve_app.auth.store import open_store

    store = open_store(db)
    try:
        return {
            name: [
                row
                for row in store.list_usage(store.get_account_by_name(name).id, limit=1_000_000)
                if row.created_at >= since
            ]
            for name in names
        }
    finally:
        store.close()


def check_ledger(
    calls: list[Call], rows_by_account: dict[str, list], late_s: float = 360.0
) -> LedgerCheck:
    """Match every call to at most one row, in order of strictness (module docstring): the
    earliest row that fits, written from the call's start to ``late_s`` after it (a replica
    whose router died goes on to its deadline; a spooled row comes seconds later)."""
    result = LedgerCheck()
    for account, rows in rows_by_account.items():
        left = sorted(rows, key=lambda row: row.created_at)
        mine = sorted((c for c in calls if c.account == account), key=lambda c: c.started)

        def take(
            predicate: Callable[[Any], bool], into: list | None = None, left: list = left
        ) -> bool:
            for index, row in enumerate(left):
                if predicate(row):
                    del left[index]
                    result.matched += 1
                    if into is not None:
                        into.append(row)
                    return True
            return False

        def fits(row: Any, call: Call) -> bool:
            return call.started - 1.0 <= row.created_at <= call.started + late_s

        told = [c for c in mine if c.usage is not None and not c.cancelled and not c.failure]
        for call in told:  # a whole answer (200) or a cut stream (its error's status)

            def same(r: Any, c: Call = call) -> bool:
                counts = (r.endpoint, r.input_tokens, r.output_tokens)
                return counts == (c.endpoint, *c.usage) and fits(r, c)

            found = take(lambda r, c=call: same(r) and (r.status == 200) == (not c.error_event))
            # a cut stream whose replica had billed exactly what got through, then died
            found = found or (call.error_event and take(same))
            if not found:
                result.missing.append(call)
        for call in [c for c in mine if c.cancelled]:  # the client left: 499, or done first
            if not take(
                lambda r, c=call: r.endpoint == c.endpoint and r.status in (499, 200) and fits(r, c)
            ):
                result.missing.append(call)
        told_ids = {id(c) for c in told}
        unknown = [
            c for c in mine if id(c) not in told_ids and not c.cancelled and c.status not in REFUSED
        ]
        for call in unknown:  # admitted errors: a row of what was processed, or none
            if call.failure is None and call.status != 500:
                status = CODE_STATUS.get(call.code or "", 0) if call.error_event else call.status
                take(
                    lambda r, c=call, s=status: (
                        r.endpoint == c.endpoint and r.status in (s, 499) and fits(r, c)
                    )
                )
            # no answer at all (its router died): the model side bills what it processed
            elif take(lambda r, c=call: r.endpoint == c.endpoint and fits(r, c), result.unanswered):
                pass
        result.doubled += [
            (account, r.endpoint, r.status, r.input_tokens, r.output_tokens, r.created_at)
            for r in left
        ]
    return result


def settled_ledger(db: str, calls: list[Call], wait_s: float = 45.0) -> LedgerCheck:
    """The check once the rows stopped coming (replica spools flush every 5 s)."""
    names = sorted({c.account for c in calls} | {BROKE, LIMITED})
    since = min((c.started for c in calls), default=0.0)  # rows of earlier runs on the graph
    deadline = time.monotonic() + wait_s
    while True:
        check = check_ledger(calls, ledger_rows(db, names, since))
        if check.clean or time.monotonic() > deadline:
            return check
        time.sleep(2)


# --- the soak -------------------------------------------------------------------------------------


@dataclass
class Sample:
    minute: int
    at: float
    load: float
    pss_kb: dict[str, int]  # "Deployment#n" -> kB
    cache: dict[str, float]  # "Deployment#replica" -> bytes


def sample(index: int, session: int, ports: list[int]) -> Sample:
    pss: dict[str, int] = {}
    for name, pids in replica_pids(session).items():
        for number, pid in enumerate(pids, 1):
            kb = pss_kb(pid)
            if kb is not None:
                pss[f"{name}#{number}" if len(pids) > 1 else name] = kb
    return Sample(index, time.time(), os.getloadavg()[0], pss, cache_bytes(ports))


def deadline_s(call: Call, limits: dict[str, float]) -> float:
    timeout = (
        limits["decision_timeout_s"] if call.kind == "decisions" else limits["request_timeout_s"]
    )
    return timeout + BACKSTOP_GRACE_S + HANG_MARGIN_S


def five_xx(calls: list[Call]) -> Counter:
    kinds: Counter = Counter()
    for call in calls:
        if call.status >= 500:
            kinds[f"{call.status} {call.code}"] += 1
        elif call.error_event:
            kinds[f"event {call.code}"] += 1
        elif call.failure:
            kinds[f"transport {call.failure}"] += 1
    return kinds


KINDS = ("fim", "next-edit", "apply", "decisions", "chat")


def latencies(calls: list[Call], kind: str) -> list[float]:
    return [c.seconds for c in calls if c.kind == kind and c.ok and not c.cancelled]


def p(values: list[float], q: float) -> str:
    return f"{percentile(values, q):.2f}" if values else "-"


@dataclass
class SoakResult:
    samples: list[Sample]
    calls: list[Call]
    ledger: LedgerCheck
    warmup: int
    limits: dict[str, float]
    verdict: dict[str, tuple[bool | None, str]] = field(default_factory=dict)


def run_soak(
    started: dict, minutes: float, sample_s: float = 60.0, warmup: int = 2, tiny: bool = False,
    limits: dict[str, float] | None = None,
) -> SoakResult:  # fmt: skip
    """Traffic for ``minutes``; a sample every ``sample_s``; the ledger check at the end."""
    from tests.ray_admin import RayAdmin

    limits = limits or {"request_timeout_s": 300.0, "decision_timeout_s": 120.0}
    admin = RayAdmin(started["ray_address"])
    try:
        ports = admin.command("metrics")["ports"]
    finally:
        admin.close()
    traffic = Traffic(started["url"], started["model"], started["keys"], tiny)
    traffic.start()
    samples: list[Sample] = []
    begun = time.monotonic()
    intervals = max(1, round(minutes * 60 / sample_s))
    header_printed = False
    for index in range(1, intervals + 1):
        end_of_interval = begun + index * sample_s
        # beside the traffic, not before the sample: a short request may queue for seconds
        threading.Thread(target=traffic.refusals, daemon=True).start()
        time.sleep(max(0.0, end_of_interval - time.monotonic()))
        samples.append(sample(index, started["pid"], ports))
        if not header_printed:
            print(table([interval_header(samples[-1])]).splitlines()[0], flush=True)
            header_printed = True
        print(interval_row(samples, traffic.snapshot(), sample_s), flush=True)
    traffic.finish()
    calls = traffic.snapshot()
    ledger = settled_ledger(started["db"], calls)
    result = SoakResult(samples, calls, ledger, warmup, limits)
    result.verdict = soak_verdict(result, sample_s)
    return result


def interval_header(first: Sample) -> list[str]:
    names = sorted(first.pss_kb)
    return ["min", "load", "reqs", *[f"{k} p50/p99 s" for k in KINDS], "5xx", "429/402",
            *[f"{n} PSS MB" for n in names], "cache MB"]  # fmt: skip


def in_interval(
    calls: list[Call], samples: list[Sample], index: int, sample_s: float
) -> list[Call]:
    """Calls that ended within interval ``index`` (1-based)."""
    end = samples[index - 1].at
    start = end - sample_s
    return [c for c in calls if start < c.ended <= end]


def interval_row(samples: list[Sample], calls: list[Call], sample_s: float) -> str:
    last = samples[-1]
    mine = in_interval(calls, samples, last.minute, sample_s)
    names = sorted(samples[0].pss_kb)
    cells = [str(last.minute), f"{last.load:.1f}", str(len(mine))]
    for kind in KINDS:
        values = latencies(mine, kind)
        cells.append(f"{p(values, 50)}/{p(values, 99)}")
    errors = five_xx(mine)
    cells.append(",".join(f"{k}:{v}" for k, v in errors.items()) or "0")
    cells.append(f"{sum(c.status == 429 for c in mine)}/{sum(c.status == 402 for c in mine)}")
    cells += [f"{last.pss_kb.get(n, 0) / 1024:.0f}" for n in names]
    cells.append(f"{sum(last.cache.values()) / 2**20:.0f}")
    return "| " + " | ".join(cells) + " |"


def soak_verdict(result: SoakResult, sample_s: float) -> dict[str, tuple[bool | None, str]]:
    """Issue 50's criteria, each (passed, figures); passed None: a figure shown beside them."""
    samples, calls = result.samples, result.calls
    after = len(samples) - result.warmup
    window = max(1, min(WINDOW, after // 2))
    verdict: dict[str, tuple[bool | None, str]] = {}
    if after >= 2:
        first = [c for i in range(result.warmup + 1, result.warmup + window + 1)
                 for c in in_interval(calls, samples, i, sample_s)]  # fmt: skip
        last = [c for i in range(len(samples) - window + 1, len(samples) + 1)
                for c in in_interval(calls, samples, i, sample_s)]  # fmt: skip
        ratios = []
        for kind in KINDS:
            a, b = latencies(first, kind), latencies(last, kind)
            if a and b:
                ratios.append((kind, percentile(b, 99) / percentile(a, 99),
                               percentile(a, 99), percentile(b, 99)))  # fmt: skip
        worst = max((r[1] for r in ratios), default=0.0)
        text = ", ".join(f"{k} {a:.2f}->{b:.2f} s ({r:.2f}x)" for k, r, a, b in ratios)
        verdict["p99 last/first"] = (worst <= P99_RATIO, f"{window} intervals each: {text}")
        base = samples[result.warmup - 1] if result.warmup else samples[0]
        growth = []
        for name, kb in base.pss_kb.items():
            peak = max(s.pss_kb.get(name, 0) for s in samples[result.warmup :])
            growth.append((name, peak / kb - 1, kb, peak))
        worst_growth = max((g[1] for g in growth), default=0.0)
        text = ", ".join(
            f"{n} {a / 1024:.0f}->{b / 1024:.0f} MB ({g:+.1%})" for n, g, a, b in growth
        )
        verdict["PSS growth"] = (worst_growth <= PSS_GROWTH, text)
        # the prefix caches fill towards prefix_cache_mb as sessions come: what grew besides
        lean = []
        for name, *_ in growth:
            deployment = name.split("#")[0]

            def less_cache(s: Sample, deployment: str = deployment, name: str = name) -> float:
                held = sum(v for k, v in s.cache.items() if k.split("#")[0] == deployment)
                return s.pss_kb.get(name, 0) - held / 1024

            peak = max(less_cache(s) for s in samples[result.warmup :])
            lean.append(f"{name} {peak / less_cache(base) - 1:+.1%}")
        verdict["PSS less prefix cache"] = (None, ", ".join(lean))
    verdict["ledger"] = (result.ledger.clean, result.ledger.line())
    errors = five_xx(calls)
    undesigned = {k: v for k, v in errors.items() if not k.startswith("503 ")}
    verdict["5xx"] = (not undesigned, dict(errors).__repr__())
    hung = [c for c in calls if c.seconds > deadline_s(c, result.limits)]
    verdict["past deadline"] = (not hung, f"{len(hung)} requests")
    designed = sum(c.status in (402, 429) for c in calls)
    verdict["designed 429/402"] = (designed > 0, f"{designed} refusals")
    return verdict


def print_soak(result: SoakResult) -> None:
    calls = result.calls
    kinds = Counter(c.kind for c in calls)
    cancelled = sum(c.cancelled for c in calls)
    streams = sum(c.stream for c in calls)
    print(f"\n{len(calls)} requests {dict(kinds)}; {streams} streams, {cancelled} cancelled by "
          f"the client; statuses {dict(Counter(c.outcome for c in calls))}")  # fmt: skip
    rows = [["kind", "n (200)", "p50 s", "p99 s"]]
    for kind in KINDS:
        values = latencies(calls, kind)
        rows.append([kind, str(len(values)), p(values, 50), p(values, 99)])
    print(table(rows))
    for name, size in sorted(result.samples[-1].cache.items()):
        print(f"prefix cache {name}: {size / 2**20:.1f} MB at the end")
    if result.ledger.missing or result.ledger.doubled:
        print(f"ledger missing: {result.ledger.missing[:10]}")
        print(f"ledger doubled: {result.ledger.doubled[:10]}")
    print("\nverdict (issue 50's done criteria):")
    print_verdict(result.verdict)


def print_verdict(verdict: dict[str, tuple[bool | None, str]]) -> None:
    for name, (passed, text) in verdict.items():
        mark = "INFO" if passed is None else "PASS" if passed else "FAIL"
        print(f"  {mark} {name}: {text}")


# --- killing each deployment ------------------------------------------------------------------


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
            call = send_watching(client, traffic, "soak-a", kind, path, body, event)
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


def send_watching(
    client: httpx.Client, traffic: Traffic, account: str, kind: str, path: str, body: dict,
    event: threading.Event,
) -> Call:  # fmt: skip
    """``send``, setting ``event`` once a stream's first event is in."""
    call = Call(account, kind, path, bool(body.get("stream")), time.time())
    start = time.monotonic()
    headers = {"Authorization": f"Bearer {traffic.keys[account]}"}
    try:
        if not call.stream:
            response = client.post(traffic.url + path, json=body, headers=headers)
            call.status = response.status_code
            if call.status == 200:
                call.usage = usage_of(response.json().get("usage"))
            else:
                call.code = error_code(response.content)
        else:
            with client.stream("POST", traffic.url + path, json=body, headers=headers) as r:
                call.status = r.status_code
                event.set()
                if call.status != 200:
                    call.code = error_code(r.read())
                else:
                    read_stream(r, call, cancel=False)
    except (httpx.HTTPError, ValueError) as exc:
        call.failure = type(exc).__name__
    event.set()
    call.seconds = time.monotonic() - start
    return call


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


# --- main -----------------------------------------------------------------------------------------


def dump(path: Path, calls: list[Call], db: str) -> None:
    """Every call and every ledger row of the run, as JSON, to look into a failed check."""
    import dataclasses

    names = sorted({c.account for c in calls} | {BROKE, LIMITED})
    rows = {
        name: [dataclasses.asdict(row) for row in account_rows]
        for name, account_rows in ledger_rows(db, names).items()
    }
    path.write_text(json.dumps({"calls": [dataclasses.asdict(c) for c in calls], "rows": rows}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--sample-s", type=float, default=60.0, help="one table row per interval")
    parser.add_argument("--warmup", type=int, default=2, help="intervals before the baseline")
    parser.add_argument("--tiny", action="store_true", help="the tiny random model")
    parser.add_argument("--kill", action="store_true", help="kill -9 each deployment in turn")
    parser.add_argument("--dump", type=Path, help="write every call and ledger row here (JSON)")
    args = parser.parse_args(argv)
    print(
        f"bench.soak {' '.join(sys.argv[1:])}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print(f"CPU: {cpu_flags()}; load {os.getloadavg()} (shared box: timings are noisy)")
    with (
        tempfile.TemporaryDirectory(prefix="bench-soak-") as folder,
        soak_graph(Path(folder), args.tiny, args.kill) as started,
    ):
        print(f"graph up: {started['url']}, model {started['model']}", flush=True)
        if args.kill:
            phases, calls = kill_each(started, args.tiny)
            if args.dump:
                dump(args.dump, calls, started["db"])
            print_kills(phases)
            verdict = kill_verdict(phases, calls)
            print_verdict(verdict)
        else:
            result = run_soak(started, args.minutes, args.sample_s, args.warmup, args.tiny)
            if args.dump:
                dump(args.dump, result.calls, started["db"])
            print_soak(result)
            verdict = result.verdict
    print(f"load at the end {os.getloadavg()}")
    return 0 if all(passed is not False for passed, _ in verdict.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
