"""Decisions benchmark, with its baseline measured in the same run.

    .venv/bin/python -m bench.decisions --key $SERVE_APP_API_KEY     # against a running service
    .venv/bin/python -m bench.decisions --in-process [--threads 2]   # the scorer, no HTTP

p50/p95 latency of one request about one ~1,700-token prompt (state ~1,600 tokens) with 1, 5, 10 and
64 questions, and one 255-label choice; then the baselines: the same 10 questions sent as 10
one-question requests, one after another, on one state and on a fresh state per request
(``--no-baselines`` skips them). Every iteration uses a fresh state (a salted ticket), so the
state's KV is computed each time and the figures show sharing within a request, not the
cross-request state cache.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import time
from collections.abc import Awaitable, Callable

from bench.common import base_parser, percentile, session, table

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


async def run(args, send: Send) -> list[list[str]]:
    names = list(QUESTIONS)
    results: dict[str, list[float]] = {}
    salts = itertools.count(random.randrange(10**9))  # states never seen by this service
    prompt_tokens = 0

    async def one_request(questions: dict, salt: int) -> float:
        nonlocal prompt_tokens
        body = {"model": args.model, "state": state(salt), "questions": questions}
        seconds, usage = await send(body)
        if len(questions) == 1 and not prompt_tokens:
            prompt_tokens = usage["input_tokens"]
        return seconds

    # Warm-up on a state of its own: the fixed prefix (system turn, worked examples) is in the
    # prefix cache of any service that has answered once; the states measured below are not.
    await one_request({names[0]: QUESTIONS[names[0]]}, next(salts))
    prompt_tokens = 0
    cases = {f"{n} question{'s' * (n > 1)}, 1 request": names[:n] for n in (1, 5, 10)}
    for case, questions in cases.items():
        subset = {name: QUESTIONS[name] for name in questions}
        results[case] = [await one_request(subset, next(salts)) for _ in range(args.repeats)]
    for case, questions in (("64 questions, 1 request", MANY), ("255-label choice", LABELS)):
        results[case] = [await one_request(questions, next(salts)) for _ in range(args.repeats)]
    # Baselines: the same 10 questions as 10 requests, one after another. First on one
    # state (the scorer's prefix cache reuses it across requests), then with every request
    # on a state of its own (nothing to reuse: what sharing the state saves).
    for case, fresh_each in (
        ("10 x 1 question, same state", False),
        ("10 x 1 question, no reuse", True),
    ):
        if not args.baselines:
            break
        results[case] = []
        for _ in range(args.repeats):
            salt, total = next(salts), 0.0
            for name in names:
                total += await one_request(
                    {name: QUESTIONS[name]}, next(salts) if fresh_each else salt
                )
            results[case].append(total)
    one = percentile(results["1 question, 1 request"], 50)
    print(f"1-question prompt: {prompt_tokens} tokens run (state, system turn and question)")
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

        return await run(args, send)


async def run_in_process(args) -> list[list[str]]:
    """The same requests through the decision service on the embedded model, no HTTP."""
    from serve_app.api.decisions import DecisionRequest
    from serve_app.engine.loader import load_model
    from serve_app.engine.scoring import LikelihoodScorer
    from serve_app.serving.decisions import DecisionService

    loaded = load_model(f"embedded:{args.model}", dtype="float32", threads=args.threads)
    service = DecisionService(LikelihoodScorer(loaded, context_length=32768))

    async def send(body: dict) -> tuple[float, dict]:
        start = time.perf_counter()
        answer = await service.decide(DecisionRequest.model_validate(body))
        return time.perf_counter() - start, answer.usage.model_dump()

    rows = await run(args, send)
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return rows


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--in-process", action="store_true", help="score in this process")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (--in-process)")
    parser.add_argument("--no-baselines", dest="baselines", action="store_false")
    args = parser.parse_args()
    print(table(asyncio.run(run_in_process(args) if args.in_process else run_http(args))))


if __name__ == "__main__":
    main()
