"""Micro-benchmark of decision scoring, in process: what the shared state prefix saves.

Times, on a ~500-token state: 1 question; 10 questions in one call (state run once, the
questions as one batch); 10 questions as 10 calls with the prefix LRU on (state run once,
then cache hits) and off (state run 10 times: the cost without any sharing).

    python bench/decisions_micro.py [--model PATH] [--threads 2] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Callable

from serve_app.engine_config import EngineConfig
from serve_app.models.loader import load_model
from serve_app.serving.scoring import DecisionQuestion, LikelihoodScorer, ScoringResult

DEFAULT_MODEL = os.path.expanduser("~/.cache/serve-app/models/qwen2.5-coder-0.5b")


def make_state() -> dict:
    """A support ticket with some history: about 500 tokens once rendered as JSON."""
    events = [
        {"at": f"2024-05-0{d} 0{h}:15", "by": who, "text": text}
        for d, h, who, text in [
            (1, 9, "customer", "The export to CSV fails with a timeout for large projects."),
            (1, 10, "agent", "Thanks, could you tell us how many rows the project has?"),
            (2, 8, "customer", "About 2 million rows. Smaller projects export fine."),
            (2, 9, "agent", "We reproduced it; engineering is looking into the query plan."),
            (3, 7, "engineer", "Added an index on project_id; export now streams in batches."),
            (3, 8, "customer", "Still failing for me, same timeout after 60 seconds."),
            (4, 9, "agent", "The fix is deployed to the EU region only, US follows Friday."),
            (5, 8, "customer", "I am in the US region. This blocks our monthly reporting."),
        ]
    ]
    return {
        "ticket": {"id": "T-4821", "priority": "high", "region": "us-east", "plan": "business"},
        "customer": {"name": "Dana Whitfield", "company": "Northwind Analytics", "seats": 140},
        "product": {"area": "data export", "version": "5.12.3"},
        "events": events,
        "sla": {"first_response_hours": 4, "resolution_days": 5, "breached": False},
    }


def make_questions() -> list[DecisionQuestion]:
    q = DecisionQuestion
    return [
        q("resolved", "noul", "The customer's problem is resolved."),
        q("us_region", "noul", "The customer is in the US region."),
        q("blocking", "noul", "The issue blocks the customer's work."),
        q("engineering", "noul", "Engineering was involved."),
        q("sla_breached", "noul", "The SLA was breached."),
        q(
            "area",
            "choice",
            "Which product area is affected?",
            {"export": None, "billing": None, "login": None},
        ),
        q(
            "next",
            "choice",
            "What should happen next?",
            {
                "wait_for_deploy": "wait for the US fix",
                "escalate": "escalate to engineering",
                "close": "close the ticket",
            },
        ),
        q(
            "mood",
            "choice",
            "How does the customer feel?",
            {"satisfied": None, "frustrated": None, "neutral": None},
        ),
        q("urgency", "score", "How urgent is the ticket?", ["low", "medium", "high", "critical"]),
        q("effort", "score", "How much effort did support spend?", ["none", "some", "a lot"]),
    ]


def seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run(coroutine):
    return asyncio.run(coroutine)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    loaded = load_model(args.model, threads=args.threads)
    state, questions = make_state(), make_questions()
    cached = LikelihoodScorer.for_model(loaded, EngineConfig(), 32768)
    uncached = LikelihoodScorer.for_model(loaded, EngineConfig(prefix_cache_mb=0), 32768)
    probe = run(uncached.score(state, questions[:1], cache_salt="bench"))
    print(f"model {args.model}, threads {args.threads}, {args.repeats} rounds")
    print(f"1-question prompt: {probe.input_tokens} tokens")
    run(uncached.score(state, questions, cache_salt="bench"))  # warm-up

    def one_call(scorer: LikelihoodScorer, qs: list[DecisionQuestion]) -> ScoringResult:
        scorer.engine.prefix_cache.clear()  # cold: the state is run in every measured call
        return run(scorer.score(state, qs, cache_salt="bench"))

    def separate_calls(scorer: LikelihoodScorer) -> None:
        scorer.engine.prefix_cache.clear()
        for q in questions:
            run(scorer.score(state, [q], cache_salt="bench"))

    cases: list[tuple[str, Callable[[], object]]] = [
        ("1 question, 1 call", lambda: one_call(uncached, questions[:1])),
        ("10 questions, 1 call", lambda: one_call(uncached, questions)),
        ("10 questions, 10 calls, prefix LRU on", lambda: separate_calls(cached)),
        ("10 questions, 10 calls, no prefix cache", lambda: separate_calls(uncached)),
        (
            "10 questions, 1 call, warm prefix",
            lambda: run(cached.score(state, questions, cache_salt="bench")),
        ),
    ]
    # Rounds interleave the cases, so load from other processes hits them alike; the
    # minimum is the least disturbed run.
    samples: dict[str, list[float]] = {name: [] for name, _ in cases}
    for _ in range(args.repeats):
        for name, fn in cases:
            samples[name].append(seconds(fn))
    best = {name: min(values) for name, values in samples.items()}
    base = best[cases[0][0]]
    print(f"{'case':42s} {'min s':>7s} {'median s':>9s} {'min/1q':>7s}")
    for name, values in samples.items():
        print(
            f"{name:42s} {best[name]:7.3f} {statistics.median(values):9.3f} "
            f"{best[name] / base:7.2f}"
        )
    print(f"load average while running: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    usage = one_call(uncached, questions)
    print(
        f"usage of 10 questions, 1 call: input_tokens={usage.input_tokens} "
        f"output_tokens={usage.output_tokens}; 1 question: input_tokens={probe.input_tokens}"
    )
    ten_calls, one = best[cases[3][0]], best[cases[1][0]]
    print(f"10 calls without sharing / 10 questions in 1 call: {ten_calls / one:.2f}x")


if __name__ == "__main__":
    main()
