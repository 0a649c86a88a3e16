"""Decisions benchmark, with its baseline measured in the same run.

    .venv/bin/python -m bench.decisions --key $SERVE_APP_API_KEY     # against a running service
    .venv/bin/python -m bench.decisions --in-process [--threads 2]   # the scorer, no HTTP
    .venv/bin/python -m bench.decisions --in-process --runner both   # HF vs the engine's runner
    .venv/bin/python -m bench.decisions --in-process --vary int8_kernel=fbgemm,q8   # side by side

p50/p95 latency of one request about one ~1,700-token prompt (state ~1,600 tokens) with 1, 5, 10 and
64 questions, and one 255-label choice; then the baselines: the same 10 questions sent as 10
one-question requests, one after another, on one state and on a fresh state per request
(``--no-baselines`` skips them). Every iteration uses a fresh state (a salted ticket), so the
state's KV is computed each time and the figures show sharing within a request, not the
cross-request state cache.

``--runner`` (in-process): the scorer's forward, as ``engine.runner`` picks it for a deployment:
``auto`` (the engine's runner, dense weights), ``hf`` (the HF model), or ``both``, one after the
other in this run, with a last table comparing them.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import random
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from bench.common import base_parser, percentile, session, table

if TYPE_CHECKING:
    from serve_app.engine_config import EngineConfig

Send = Callable[[dict], Awaitable[tuple[float, dict]]]  # body -> (seconds, usage)

QUESTIONS = {
    "is_bug": {"type": "noul", "instructions": "The ticket reports a software defect."},
    "is_urgent": {"type": "noul", "instructions": "The customer needs a fix today."},
    "mentions_data_loss": {"type": "noul", "instructions": "Data was lost."},
    "is_enterprise": {"type": "noul", "instructions": "The customer is on an enterprise plan."},
    "needs_refund": {"type": "noul", "instructions": "The customer asks for a refund."},
    "team": {
        "type": "choice",
        "criteria": {"backend": "server code", "frontend": "UI", "billing": "payments"},
    },
    "channel": {"type": "choice", "criteria": {"email": None, "phone": None, "chat": None}},
    "severity": {"type": "score", "criteria": ["trivial", "minor", "major", "critical"]},
    "sentiment": {"type": "score", "criteria": ["angry", "unhappy", "neutral", "happy"]},
    "effort": {"type": "score", "criteria": ["minutes", "hours", "days", "weeks"]},
}
MANY = {  # 64 distinct yes/no questions
    f"more_than_{n}_{what}": {"type": "noul", "instructions": f"More than {n} {what} are affected."}
    for n in (1, 10, 100, 1000)
    for what in (
        "users", "seats", "regions", "sessions", "logins", "requests", "tickets", "teams",
        "customers", "agents", "servers", "deploys", "tokens", "pages", "browsers", "errors",
    )
}  # fmt: skip
LABELS = {"pick": {"type": "choice", "criteria": {f"l{i}": None for i in range(255)}}}


def state(salt: int) -> dict:
    """A support ticket of roughly 1,600 tokens once rendered in the prompt."""
    log = "\n".join(
        f"2026-11-{(i % 28) + 1:02d} 10:{i:02d}:00 ERROR auth.session: token refresh failed "
        f"(user={1000 + i}, region=eu-west-{i % 3}, attempt={i % 5})"
        for i in range(34)
    )
    return {
        "ticket": f"#{salt}: Since this morning's deploy users cannot log in; the login page "
        "returns HTTP 500 and sessions expire after a few seconds.",
        "customer": {"name": "Acme Corp", "plan": "enterprise", "seats": 1200},
        "messages": [
            "Our whole support team is locked out, please fix this today.",
            "We tried clearing cookies and another browser, same result.",
        ],
        "log_excerpt": log,
    }


async def run(args, sends: dict[str, Send]) -> dict[str, list[list[str]]]:
    """A table per sender; every request goes to each sender in turn (same body, a state
    none has seen), so a change in the machine's load hits them alike."""
    names = list(QUESTIONS)
    results: dict[str, dict[str, list[float]]] = {kind: {} for kind in sends}
    salts = itertools.count(random.randrange(10**9))  # states never seen by this service
    prompt_tokens = 0

    async def one_request(questions: dict, salt: int) -> dict[str, float]:
        nonlocal prompt_tokens
        body = {"model": args.model, "state": state(salt), "questions": questions}
        seconds = {}
        for kind, send in sends.items():
            seconds[kind], usage = await send(body)
        if len(questions) == 1 and not prompt_tokens:
            prompt_tokens = usage["input_tokens"]
        return seconds

    def record(case: str, seconds: dict[str, float]) -> None:
        for kind, value in seconds.items():
            results[kind].setdefault(case, []).append(value)

    # Warm-up on a state of its own: the fixed prefix (system turn, worked examples) is in the
    # prefix cache of any service that has answered once; the states measured below are not.
    await one_request({names[0]: QUESTIONS[names[0]]}, next(salts))
    prompt_tokens = 0
    cases = {f"{n} question{'s' * (n > 1)}, 1 request": names[:n] for n in (1, 5, 10)}
    for case, questions in cases.items():
        subset = {name: QUESTIONS[name] for name in questions}
        for _ in range(args.repeats):
            record(case, await one_request(subset, next(salts)))
    for case, questions in (("64 questions, 1 request", MANY), ("255-label choice", LABELS)):
        for _ in range(args.repeats):
            record(case, await one_request(questions, next(salts)))
    # Baselines: the same 10 questions as 10 requests, one after another. First on one
    # state (the scorer's prefix cache reuses it across requests), then with every request
    # on a state of its own (nothing to reuse: what sharing the state saves).
    for case, fresh_each in (
        ("10 x 1 question, same state", False),
        ("10 x 1 question, no reuse", True),
    ):
        if not args.baselines:
            break
        for _ in range(args.repeats):
            salt, totals = next(salts), dict.fromkeys(sends, 0.0)
            for name in names:
                one = await one_request(
                    {name: QUESTIONS[name]}, next(salts) if fresh_each else salt
                )
                totals = {kind: totals[kind] + one[kind] for kind in sends}
            record(case, totals)
    print(f"1-question prompt: {prompt_tokens} tokens run (state, system turn and question)")
    return {kind: summary(values) for kind, values in results.items()}


def summary(results: dict[str, list[float]]) -> list[list[str]]:
    one = percentile(results["1 question, 1 request"], 50)
    rows = [["case", "p50 s", "p95 s", "vs 1 question"]]
    for case, values in results.items():
        p50, p95 = percentile(values, 50), percentile(values, 95)
        rows.append([case, f"{p50:.2f}", f"{p95:.2f}", f"{p50 / one:.2f}x"])
    return rows


async def run_http(args) -> list[list[str]]:
    async with session(args.key) as http:

        async def send(body: dict) -> tuple[float, dict]:
            start = time.perf_counter()
            async with http.post(f"{args.url}/v1/decisions", json=body) as response:
                response.raise_for_status()
                answer = await response.json()
            return time.perf_counter() - start, answer["usage"]

        return (await run(args, {"http": send}))["http"]


async def run_in_process(args) -> list[list[str]]:
    """The same requests through the decision service on the embedded model, no HTTP, to a
    scorer per forward asked for (``--runner``) or per value of one engine setting (``--vary``);
    with several, their figures side by side against the first."""
    from serve_app.engine_config import EngineConfig
    from serve_app.models.loader import load_model

    loaded = load_model(f"embedded:{args.model}", dtype="float32", threads=args.threads)
    if args.vary:
        field, values = args.vary
        kinds = {f"{field} {v}": EngineConfig(**{field: v}) for v in values}
    else:
        runners = ["hf", "auto"] if args.runner == "both" else [args.runner]
        kinds = {runner: EngineConfig(runner=runner) for runner in runners}
    sends = {
        kind: in_process_sender(loaded, config, args.cpu_time) for kind, config in kinds.items()
    }
    tables = await run(args, sends)
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    names = list(kinds)
    if len(names) == 1:
        return tables[names[0]]
    for name in names:
        print(f"scorer {name}:\n{table(tables[name])}\n")
    base = tables[names[0]]
    rows = [["case", *(f"{n} p50 s" for n in names), *(f"{n} / {names[0]}" for n in names[1:])]]
    for index, row in enumerate(base[1:], start=1):
        others = [tables[n][index][1] for n in names[1:]]
        ratios = [f"{float(o) / float(row[1]):.2f}" for o in others]
        rows.append([row[0], row[1], *others, *ratios])
    return rows


def in_process_sender(loaded, engine: EngineConfig, cpu_time: bool = False) -> Send:
    """A decision service whose scorer is built as the scorer deployment builds it, on the
    engine settings ``engine``.

    ``cpu_time``: seconds of this process's CPU instead of wall-clock time; with
    ``--threads 1`` that is the request's own work, which other jobs on a shared machine
    hardly change (wall-clock time there measures mostly the load)."""
    from serve_app.api.decisions import DecisionRequest
    from serve_app.serving.billing import BilledCall, RequestContext, UsageMeter
    from serve_app.serving.decisions import DecisionService
    from serve_app.serving.scoring import LikelihoodScorer

    service = DecisionService(LikelihoodScorer.for_model(loaded, engine, 32768))
    context = RequestContext(grant=None, model="bench", endpoint="decisions", cache_salt="bench")

    async def send(body: dict) -> tuple[float, dict]:
        clock = time.process_time if cpu_time else time.perf_counter
        start = clock()
        call = BilledCall(context, UsageMeter())
        answer = await service.decide(DecisionRequest.model_validate(body), call)
        return clock() - start, answer.usage.model_dump()

    return send


def engine_values(text: str) -> tuple[str, list[str]]:
    """``FIELD=A,B`` -> (FIELD, [A, B])."""
    field, _, values = text.partition("=")
    if not field or not values:
        raise argparse.ArgumentTypeError(f"expected FIELD=A,B, got {text!r}")
    return field, values.split(",")


def main() -> None:
    parser = base_parser(__doc__, "decisions")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--in-process", action="store_true", help="score in this process")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (--in-process)")
    parser.add_argument("--no-baselines", dest="baselines", action="store_false")
    parser.add_argument(
        "--runner", choices=["auto", "hf", "both"], default="auto", help="(--in-process)"
    )
    parser.add_argument(
        "--vary",
        type=engine_values,
        default=None,
        metavar="FIELD=A,B",
        help="(--in-process) a scorer per value of engine setting FIELD, side by side "
        "(int8_kernel=fbgemm,q8; prompt_weights=decode,q4)",
    )
    parser.add_argument(
        "--cpu-time", action="store_true", help="process CPU seconds, not wall (--in-process)"
    )
    args = parser.parse_args()
    print(table(asyncio.run(run_in_process(args) if args.in_process else run_http(args))))


if __name__ == "__main__":
    main()
