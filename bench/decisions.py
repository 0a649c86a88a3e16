"""Decisions benchmark against a running service, with its baseline measured in the same run.

    .venv/bin/python bench/decisions.py --key $SERVE_APP_API_KEY

p50/p95 latency of one request with 1, 5 and 10 questions about one ~500-token state, and the
baselines: the same 10 questions sent as 10 one-question requests, one after another, on one
state and on a fresh state per request. Every
iteration uses a fresh state (a salted ticket), so the state's KV is computed each time and the
figures show sharing within a request, not the cross-request state cache.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time

from bench.common import base_parser, percentile, session, table

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


def state(salt: int) -> dict:
    """A support ticket of roughly 500 tokens."""
    log = "\n".join(
        f"2026-11-{(i % 28) + 1:02d} 10:{i:02d}:00 ERROR auth.session: token refresh failed "
        f"(user={1000 + i}, region=eu-west-{i % 3}, attempt={i % 5})"
        for i in range(14)
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


async def timed(http, url: str, body: dict) -> float:
    start = time.perf_counter()
    async with http.post(f"{url}/v1/decisions", json=body) as response:
        response.raise_for_status()
        await response.json()
    return time.perf_counter() - start


async def run(args) -> list[list[str]]:
    names = list(QUESTIONS)
    results: dict[str, list[float]] = {}
    salts = itertools.count(random.randrange(10**9))  # states never seen by this service

    async def one_request(questions: list[str], salt: int) -> float:
        body = {
            "model": args.model,
            "state": state(salt),
            "questions": {name: QUESTIONS[name] for name in questions},
        }
        return await timed(http, args.url, body)

    async with session(args.key) as http:
        for count in (1, 5, 10):
            case = f"{count} question{'s' * (count > 1)}, 1 request"
            results[case] = [
                await one_request(names[:count], next(salts)) for _ in range(args.repeats)
            ]
        # Baselines: the same 10 questions as 10 requests, one after another. First on one
        # state (the scorer's prefix cache reuses it across requests), then with every request
        # on a state of its own (nothing to reuse: what sharing the state saves).
        for case, fresh_each in (
            ("10 x 1 question, same state", False),
            ("10 x 1 question, no reuse", True),
        ):
            results[case] = []
            for _ in range(args.repeats):
                salt, total = next(salts), 0.0
                for name in names:
                    total += await one_request([name], next(salts) if fresh_each else salt)
                results[case].append(total)
    one = percentile(results["1 question, 1 request"], 50)
    rows = [["case", "p50 s", "p95 s", "vs 1 question"]]
    for case, values in results.items():
        p50, p95 = percentile(values, 50), percentile(values, 95)
        rows.append([case, f"{p50:.2f}", f"{p95:.2f}", f"{p50 / one:.2f}x"])
    return rows


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(table(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
