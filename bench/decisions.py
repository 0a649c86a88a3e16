"""Decisions benchmark against a running service, with its baseline measured in the same run.

    .venv/bin/python bench/decisions.py --key $SERVE_APP_API_KEY

p50/p95 latency of one request with 1, 5 and 10 questions about one ~500-token state, and the
baseline: the same 10 questions sent as 10 one-question requests, one after another. Every
iteration uses a fresh state (a salted ticket), so the state's KV is computed each time and the
figures show sharing within a request, not the cross-request state cache.
"""

from __future__ import annotations

import asyncio
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
    rows = [["case", "p50 s", "p95 s", "vs 1 question"]]
    results: dict[str, list[float]] = {}
    async with session(args.key) as http:
        salt = 0
        for count in (1, 5, 10):
            results[f"{count} questions, 1 request"] = []
            for _ in range(args.repeats):
                salt += 1
                body = {
                    "model": args.model,
                    "state": state(salt),
                    "questions": {n: QUESTIONS[n] for n in names[:count]},
                }
                results[f"{count} questions, 1 request"].append(await timed(http, args.url, body))
        baseline = "10 questions, 10 requests (baseline)"
        results[baseline] = []
        for _ in range(args.repeats):
            salt += 1
            total = 0.0
            for name in names:
                body = {
                    "model": args.model,
                    "state": state(salt),
                    "questions": {name: QUESTIONS[name]},
                }
                total += await timed(http, args.url, body)
            results[baseline].append(total)
    one = percentile(results["1 questions, 1 request"], 50)
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
