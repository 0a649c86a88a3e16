"""Independent autoscaling on the real graph: a FIM burst takes FimModel from 1 replica to 3 and
back while the other deployments keep theirs; the replica timeline as Serve reports it.

    .venv/bin/python -m bench.autoscale                # tiny random model, about 2 minutes
    .venv/bin/python -m bench.autoscale --baseline     # and the same burst on one FimModel
    .venv/bin/python -m bench.autoscale --per-replica  # one FimModel replica, embedded model

It starts its own ``serve run`` (configs/local.yaml, the tiny random model, FimModel scaling
1..3 at one ongoing request per replica with short delays: ``autoscaling_fim``), then:

- burst: ``--clients`` concurrent FIM clients (every other one streaming), prompts cut from
  Python stdlib files, until Serve reports 3 RUNNING FimModel replicas and ``HOLD_S`` more;
- trickle: one client, one request at a time, until FimModel is back to 1 replica, so requests
  run while replicas are being stopped.

Printed: each change of a deployment's RUNNING replica count (``serve.status()``, sampled every
``SAMPLE_S``) with its time since the burst began, requests per phase by status, and the burst's
FIM throughput (completion tokens/s). ``--baseline``: the same burst for as long, in a second
graph whose FimModel is fixed at one replica; the ratio is what the extra replicas bought here
(on a 2-core box little: the replicas share the same two cores, unlike one GPU per replica).
tests/test_autoscale.py runs the same scenario and asserts on it.

``--per-replica``: what one FimModel replica delivers against how many requests it has ongoing,
the figure ``target_ongoing_requests`` is about (docs/operations.md derives configs/prod.yaml's
from it). One replica of the embedded model as configs/local.yaml serves it; at each level of
``CONCURRENCY``, that many streaming clients send ``PER_CLIENT`` requests of ``MAX_TOKENS``
greedy tokens each (prompts from stdlib files); printed: aggregate and per-stream decode tok/s,
median time to first token, and the aggregate's ratio to the single stream (the baseline).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.common import cpu_flags, session, stream_fim, table

FIM = "FimModel"
SAMPLE_S = 0.5
HOLD_S = 4.0  # after reaching max replicas, keep the burst on so the new replicas serve it
MAX_TOKENS = 96
STDLIB = Path(os.__file__).parent
CONCURRENCY = (1, 2, 4, 8, 16)
PER_CLIENT = 2
SOURCES = ("argparse.py", "json/decoder.py", "textwrap.py", "difflib.py", "pathlib.py")


@dataclass
class Outcome:
    """One request: its phase, whether it streamed, status, completion tokens, error event."""

    phase: str
    streamed: bool
    status: int
    tokens: int
    error: str | None
    started: float
    ended: float


@dataclass
class Scenario:
    """A run: the replica samples ``(seconds since start, {deployment: RUNNING})``, every
    request's outcome, and when each phase ended (seconds since start)."""

    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    burst_s: float = 0.0  # when the burst's last request ended
    burst_stopped_s: float = 0.0  # when the burst stopped sending new requests
    trickle_s: float = 0.0

    def counts(self, deployment: str) -> list[int]:
        return [counts.get(deployment, 0) for _, counts in self.samples]

    def changes(self) -> list[str]:
        """Each change of a RUNNING count, e.g. ``+6.5s FimModel 1 -> 2``."""
        lines, previous = [], {}
        for at, counts in self.samples:
            for name, count in sorted(counts.items()):
                if previous and previous.get(name) != count:
                    lines.append(f"+{at:5.1f}s  {name} {previous.get(name)} -> {count}")
            previous = counts
        return lines


def autoscaling_fim(document: dict, max_replicas: int = 3) -> None:
    """Edit a graph config (tests.graph): FimModel scales 1..``max_replicas`` at one ongoing
    request per replica, on seconds-long delays (production's are in configs/prod.yaml); the
    three model deployments get small CPU shares so 3 FimModel replicas fit on 2 cores."""
    from tests.graph import deployment_options

    for name in ("EditModel", "DecisionScorer", FIM):
        deployment_options(document, name)["ray_actor_options"] = {"num_cpus": 0.2}
    deployment_options(document, FIM)["autoscaling_config"] = {
        "min_replicas": 1,
        "max_replicas": max_replicas,
        "target_ongoing_requests": 1,
        "metrics_interval_s": 0.5,
        "look_back_period_s": 2,
        "upscale_delay_s": 1,
        "downscale_delay_s": 3,
    }


def stdlib_prompts(count: int, seed: int = 0) -> list[str]:
    """``count`` prefixes of 12 lines each, cut at random places from stdlib files."""
    rng = random.Random(seed)
    lines = [
        line
        for source in SOURCES
        for line in (STDLIB / source).read_text().splitlines()
        if line.strip()
    ]
    starts = [rng.randrange(len(lines) - 12) for _ in range(count)]
    return ["\n".join(lines[start : start + 12]) + "\n" for start in starts]


def fim_request(client: httpx.Client, url: str, key: str, body: dict, phase: str) -> Outcome:
    """One FIM request, streamed or not; a transport failure is status 0."""
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {key}"}
    path = f"{url}/v1/fim/completions"
    tokens, error, status = 0, None, 0
    try:
        if body.get("stream"):
            with client.stream("POST", path, json=body, headers=headers) as response:
                status = response.status_code
                for line in response.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    event = json.loads(line[6:])
                    if "error" in event:
                        error = event["error"].get("code") or "error"
                    elif event.get("usage"):
                        tokens = event["usage"]["completion_tokens"]
        else:
            response = client.post(path, json=body, headers=headers)
            status = response.status_code
            if status == 200:
                tokens = response.json()["usage"]["completion_tokens"]
    except httpx.HTTPError as exc:
        error = type(exc).__name__
    streamed = bool(body.get("stream"))
    return Outcome(phase, streamed, status, tokens, error, started, time.monotonic())


def drive(
    url: str, key: str, model: str, clients: int, keep_going: Callable[[], bool], phase: str
) -> list[Outcome]:
    """``clients`` threads, each sending FIM requests one after another while ``keep_going()``;
    client i streams when i is odd."""
    prompts = stdlib_prompts(64, seed=clients)
    outcomes: list[Outcome] = []
    lock = threading.Lock()

    def client_loop(index: int) -> None:
        with httpx.Client(timeout=120) as client:
            sent = 0
            while keep_going():
                body = {
                    "model": model,
                    "prompt": prompts[(index + sent * clients) % len(prompts)],
                    "max_tokens": MAX_TOKENS,
                    "temperature": 0.0,
                    "stop": [],
                    "stream": index % 2 == 1,
                    "stream_options": {"include_usage": True} if index % 2 else None,
                }
                outcome = fim_request(client, url, key, body, phase)
                sent += 1
                with lock:
                    outcomes.append(outcome)

    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def run_scenario(
    url: str,
    key: str,
    model: str,
    replica_counts: Callable[[], dict[str, int]],
    clients: int = 9,
    max_replicas: int = 3,
    phase_timeout_s: float = 120.0,
    burst_s: float | None = None,
) -> Scenario:
    """The burst, then the trickle (see the module's docstring), with replica samples all
    along. ``burst_s``: a burst of fixed length instead (the baseline's), and no trickle."""
    scenario = Scenario()
    start = time.monotonic()
    done = threading.Event()
    reached_max_at: list[float] = []

    def sample() -> None:
        while not done.is_set():
            counts = replica_counts()
            now = time.monotonic()
            scenario.samples.append((now - start, counts))
            if counts.get(FIM, 0) >= max_replicas and not reached_max_at:
                reached_max_at.append(now)
            time.sleep(SAMPLE_S)

    def bursting() -> bool:
        now = time.monotonic()
        if burst_s is not None:
            going = now - start < burst_s
        else:
            held = bool(reached_max_at) and now - reached_max_at[0] >= HOLD_S
            going = not held and now - start < phase_timeout_s
        if not going and not scenario.burst_stopped_s:  # clients finish what they sent
            scenario.burst_stopped_s = now - start
        return going

    def trickling() -> bool:
        elapsed = time.monotonic() - start
        back = scenario.samples and scenario.samples[-1][1].get(FIM) == 1
        return not back and elapsed - scenario.burst_s < phase_timeout_s

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        scenario.outcomes += drive(url, key, model, clients, bursting, "burst")
        scenario.burst_s = time.monotonic() - start
        if burst_s is None:
            scenario.outcomes += drive(url, key, model, 1, trickling, "trickle")
        scenario.trickle_s = time.monotonic() - start - scenario.burst_s
        time.sleep(SAMPLE_S * 2)  # one more sample after the last request
    finally:
        done.set()
        sampler.join()
    return scenario


def burst_tokens_per_s(scenario: Scenario) -> float:
    tokens = sum(o.tokens for o in scenario.outcomes if o.phase == "burst" and o.status == 200)
    return tokens / scenario.burst_s if scenario.burst_s else 0.0


def report(title: str, scenario: Scenario) -> None:
    print(f"\n== {title}")
    first = scenario.samples[0][1] if scenario.samples else {}
    print("replicas at start: " + ", ".join(f"{k} {v}" for k, v in sorted(first.items())))
    for line in scenario.changes():
        print(line)
    for phase, seconds in (("burst", scenario.burst_s), ("trickle", scenario.trickle_s)):
        mine = [o for o in scenario.outcomes if o.phase == phase]
        if not mine:
            continue
        statuses: dict[str, int] = {}
        for outcome in mine:
            label = f"{outcome.status}" + (f" + {outcome.error}" if outcome.error else "")
            statuses[label] = statuses.get(label, 0) + 1
        streamed = sum(o.streamed for o in mine)
        print(
            f"{phase}: {seconds:.1f}s, {len(mine)} requests ({streamed} streamed), "
            f"statuses {statuses}"
        )
    print(f"burst FIM throughput: {burst_tokens_per_s(scenario):.1f} completion tokens/s")


async def per_replica(url: str, key: str, model: str) -> list[list[str]]:
    """The ``--per-replica`` table: one row per level of ``CONCURRENCY``."""
    prompts = stdlib_prompts(sum(CONCURRENCY) * PER_CLIENT, seed=1)
    rows = [["ongoing requests", "aggregate tok/s", "per stream tok/s", "TTFT p50 (s)", "vs 1"]]
    single = None
    async with session(key) as client:
        for level in CONCURRENCY:
            batch = [prompts.pop() for _ in range(level * PER_CLIENT)]

            async def client_loop(mine: list[str]) -> list:
                body = {"model": model, "max_tokens": MAX_TOKENS, "temperature": 0.0, "stop": []}
                return [await stream_fim(client, url, {**body, "prompt": p}) for p in mine]

            start = time.perf_counter()
            chunks = [batch[i::level] for i in range(level)]
            results = [r for rs in await asyncio.gather(*map(client_loop, chunks)) for r in rs]
            elapsed = time.perf_counter() - start
            aggregate = sum(r.completion_tokens for r in results) / elapsed
            per_stream = statistics.median(
                r.completion_tokens / max(r.total_s - r.ttft_s, 1e-9) for r in results
            )
            single = single or aggregate
            rows.append(
                [
                    str(level),
                    f"{aggregate:.1f}",
                    f"{per_stream:.1f}",
                    f"{statistics.median(r.ttft_s for r in results):.2f}",
                    f"{aggregate / single:.2f}x",
                ]
            )
            print(" | ".join(rows[-1]), flush=True)
    return rows


def embedded_fim(document: dict) -> None:
    """Edit a graph config: the embedded default model as configs/local.yaml serves it."""
    (application,) = document["applications"]
    application["args"]["models"][0].update(
        source="embedded:qwen2.5-coder-0.5b", dtype="float32", context_length=32768
    )


@contextlib.contextmanager
def graph(
    source: str, workdir: Path, configure: Callable[[dict], None]
) -> Iterator[tuple[str, object]]:
    """The graph and a RayAdmin connected to it."""
    from tests.graph import start_graph
    from tests.ray_admin import RayAdmin

    running = start_graph(source, workdir, configure)
    started = next(running)
    admin = RayAdmin(started["ray_address"])
    try:
        yield started["url"], admin
    finally:
        admin.close()
        running.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=9)
    parser.add_argument("--baseline", action="store_true", help="also FimModel fixed at 1")
    parser.add_argument("--per-replica", action="store_true", help="tok/s against ongoing")
    args = parser.parse_args()
    from serve_app.models.tiny import build_tiny_model
    from tests.conftest import TEST_KEY
    from tests.graph import MODEL

    print(f"CPU: {cpu_flags()}; load {os.getloadavg()[0]:.1f} (shared box: timings are noisy)")
    with tempfile.TemporaryDirectory(prefix="bench-autoscale-") as folder:
        root = Path(folder)
        if args.per_replica:
            with graph("embedded:qwen2.5-coder-0.5b", root / "one", embedded_fim) as (url, _):
                rows = asyncio.run(per_replica(url, TEST_KEY, MODEL))
            print(f"\none FimModel replica, embedded 0.5B, {MAX_TOKENS} tokens a request")
            print(table(rows))
            return
        tiny = "tiny:" + str(build_tiny_model(root / "tiny"))
        with graph(tiny, root / "scaling", autoscaling_fim) as (url, admin):
            scaling = run_scenario(url, TEST_KEY, MODEL, admin.replica_counts, args.clients)
        report("FimModel 1..3 replicas", scaling)
        if not args.baseline:
            return
        with graph(tiny, root / "fixed", lambda d: autoscaling_fim(d, 1)) as (url, admin):
            fixed = run_scenario(
                url, TEST_KEY, MODEL, admin.replica_counts, args.clients,
                max_replicas=1, burst_s=scaling.burst_s,
            )  # fmt: skip
        report("baseline: FimModel fixed at 1 replica, same burst length", fixed)
        ratio = burst_tokens_per_s(scaling) / max(burst_tokens_per_s(fixed), 1e-9)
        print(f"\nburst throughput, 1..3 replicas / 1 replica: {ratio:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
