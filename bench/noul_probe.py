"""How well decisions separate right from wrong answers on a model, in process.

``noul``: 60 claims in 30 true/false pairs over six kinds of state (tickets, code, logs,
orders, reviews, mail): the same claim about two states, or two claims about one state. Prints
how many land on the right side of 0.5, how many pairs are ordered (the true twin above the
false one), the mean gap within pairs and the Brier score, overall and per kind.

``choice`` and ``score``: a few questions whose right label is plain, and score ladders whose
states grow in severity; prints how often the right label is on top and whether the expected
score increases along each ladder.

    python -m bench.noul_probe [--model embedded:qwen2.5-coder-0.5b] [--threads 2]
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from typing import Any

from serve_app.engine.loader import load_model
from serve_app.engine.scoring import DecisionQuestion, LikelihoodScorer

Pair = tuple[str, Any, str, Any, str]  # kind, true state, true claim, false state, false claim


def _same_claim(kind: str, claim: str, true_state: Any, false_state: Any) -> Pair:
    return (kind, true_state, claim, false_state, claim)


def _same_state(kind: str, state: Any, true_claim: str, false_claim: str) -> Pair:
    return (kind, state, true_claim, state, false_claim)


OUTAGE = {"ticket": "The login page returns HTTP 500 for every user since the deploy at 09:00."}
FEATURE = {"ticket": "Could you add a dark mode to the dashboard? It would be nice."}
REFUND = {"ticket": "I was charged twice for my March subscription. Please refund one charge."}

PAIRS: list[Pair] = [
    # tickets
    _same_state(
        "ticket",
        OUTAGE,
        "The ticket describes a service outage.",
        "The ticket asks for a new feature.",
    ),
    _same_state(
        "ticket",
        FEATURE,
        "The ticket asks for a new feature.",
        "The user reports that something is broken.",
    ),
    _same_state(
        "ticket", REFUND, "The ticket is about billing.", "The ticket is about a login problem."
    ),
    _same_claim(
        "ticket",
        "The ticket reports a software defect.",
        {"ticket": "Login page returns HTTP 500 after the last deploy"},
        {"ticket": "Please send me a copy of last year's invoices."},
    ),
    _same_claim(
        "ticket",
        "The ticket is urgent.",
        {
            "ticket": "Production is down for all customers, we are losing orders every minute!",
            "priority": "P1",
        },
        {"ticket": "Minor typo on the about page, fix whenever convenient.", "priority": "P4"},
    ),
    # code
    _same_claim(
        "code",
        "The function add returns the sum of its arguments.",
        "def add(a, b):\n    return a + b",
        "def add(a, b):\n    return a - b",
    ),
    _same_claim(
        "code",
        "The function can raise ZeroDivisionError.",
        "def ratio(a, b):\n    return a / b",
        "def ratio(a, b):\n    if b == 0:\n        return 0.0\n    return a / b",
    ),
    _same_state(
        "code",
        "class User:\n    def __init__(self, name):\n        self.name = name",
        "The code defines a class named User.",
        "The code defines a function named main.",
    ),
    _same_claim(
        "code",
        "The loop prints the numbers 0 to 9.",
        "for i in range(10):\n    print(i)",
        "for i in range(3):\n    print(i)",
    ),
    _same_claim(
        "code",
        "The pull request is ready to merge.",
        {"pr": {"approvals": 2, "ci": "green"}},
        {"pr": {"approvals": 0, "ci": "red"}},
    ),
    # logs
    _same_claim(
        "log",
        "All tests passed.",
        "The build succeeded: 412 tests passed, 0 failed.",
        "The build failed: 3 tests failed in test_auth.py.",
    ),
    _same_claim(
        "log",
        "The script ran without errors.",
        "Python 3.11 was used to run the script, and it printed 'done'.",
        "Traceback (most recent call last): ... KeyError: 'id'",
    ),
    _same_claim(
        "log",
        "The database connection failed.",
        "2024-05-01 10:02:11 ERROR db: connection refused (postgres:5432), retrying in 5s",
        "2024-05-01 10:02:11 INFO db: connected to postgres:5432 in 12 ms",
    ),
    _same_claim(
        "log",
        "The disk is almost full.",
        "WARN disk /var at 97% used (2.1 GB free)",
        "INFO disk /var at 23% used (310 GB free)",
    ),
    _same_state(
        "log",
        "12:00:01 GET /api/users 200 14ms\n12:00:02 GET /api/users 200 11ms\n"
        "12:00:03 POST /api/orders 201 40ms",
        "Every request in the log succeeded.",
        "The log shows a server error.",
    ),
    # orders
    _same_claim(
        "order",
        "The order has shipped.",
        {"order": {"items": 3, "status": "shipped"}},
        {"order": {"items": 3, "status": "cancelled"}},
    ),
    _same_claim(
        "order",
        "The cart is empty.",
        {"cart": [], "user": "guest"},
        {"cart": ["book", "pen"], "user": "guest"},
    ),
    _same_claim(
        "order",
        "The chair is in stock.",
        {"stock": 12, "product": "chair"},
        {"stock": 0, "product": "chair"},
    ),
    _same_claim(
        "order",
        "The invoice has been paid.",
        "The invoice total is 120 EUR and it was paid on 3 March.",
        "The invoice total is 120 EUR and it is still unpaid, due on 3 March.",
    ),
    _same_state(
        "order",
        {
            "order": {
                "id": 881,
                "total_eur": 250,
                "items": ["laptop stand", "usb hub"],
                "country": "DE",
            }
        },
        "The order total is more than 100 EUR.",
        "The order contains a laptop.",
    ),
    # reviews
    _same_claim(
        "review",
        "The review is positive.",
        "The review says: 'Love it, works perfectly and arrived early.'",
        "The review says: 'Terrible product, broke after one day, want my money back.'",
    ),
    _same_claim(
        "review",
        "The reviewer wants a refund.",
        {"rating": 1, "text": "Stopped working after a week. I want my money back."},
        {"rating": 5, "text": "Great value, I would buy it again."},
    ),
    _same_state(
        "review",
        {"rating": 2, "text": "The battery lasts barely two hours."},
        "The review complains about the battery.",
        "The review praises the battery.",
    ),
    _same_claim(
        "review",
        "The reviewer recommends the product.",
        {"rating": 5, "text": "Highly recommend it to anyone with a small kitchen."},
        {"rating": 1, "text": "Do not buy this, it is a waste of money."},
    ),
    _same_state(
        "review",
        {"rating": 4, "text": "Comfortable shoes, but shipping took three weeks."},
        "The review mentions slow shipping.",
        "The review says the shoes are uncomfortable.",
    ),
    # mail
    _same_claim(
        "mail",
        "This email is spam.",
        "Email: Congratulations! You won a free iPhone, click this link to claim your prize now!!!",
        "Email: Hi Anna, the meeting moved to 3pm tomorrow, same room. Thanks, Ben",
    ),
    _same_state(
        "mail",
        {
            "from": "ben@example.com",
            "subject": "Meeting moved",
            "body": "The meeting moved to 3pm tomorrow, same room.",
        },
        "The email is about a meeting.",
        "The email asks for a payment.",
    ),
    _same_claim(
        "mail",
        "The email asks the reader to reset their password.",
        {
            "subject": "Password reset",
            "body": "Click the link below to reset your password. It expires in 1 hour.",
        },
        {"subject": "Newsletter", "body": "Here are this month's product updates and team news."},
    ),
    _same_claim(
        "mail",
        "The email has an attachment.",
        {"subject": "Report", "attachments": ["q1_report.pdf"], "body": "See the attached report."},
        {"subject": "Report", "attachments": [], "body": "I will send the report tomorrow."},
    ),
    _same_state(
        "mail",
        {
            "from": "hr@acme.com",
            "subject": "Welcome aboard",
            "body": "Welcome to Acme! Your first day is Monday 9:00.",
        },
        "The email welcomes a new employee.",
        "The email announces a layoff.",
    ),
]

LABELS = {"backend": "server-side code", "frontend": "UI", "billing": "payments and invoices"}
CHOICES = [  # (state, question, labels, right label)
    (OUTAGE, "Which team should handle the ticket?", LABELS, "backend"),
    (REFUND, "Which team should handle the ticket?", LABELS, "billing"),
    (
        {"ticket": "The Save button is hidden behind the footer on small screens."},
        "Which team should handle the ticket?",
        LABELS,
        "frontend",
    ),
    (
        "2024-05-01 10:02:11 ERROR db: connection refused",
        "Which level is this log line?",
        {"INFO": None, "WARN": None, "ERROR": None},
        "ERROR",
    ),
    (
        {"rating": 1, "text": "Broke after a day."},
        "What is the sentiment of the review?",
        {"positive": None, "neutral": None, "negative": None},
        "negative",
    ),
    (
        {"subject": "You won!!!", "body": "Claim your free prize now, click here"},
        "Which folder does the email belong in?",
        {"inbox": None, "spam": None},
        "spam",
    ),
]

SEVERITY = ["trivial", "minor", "major", "critical"]
LADDERS = [  # (question, levels, states from the least to the most severe)
    (
        "How severe is the ticket?",
        SEVERITY,
        [
            {"ticket": "A typo on the about page: 'teh' instead of 'the'."},
            {"ticket": "The avatar upload is slow, it takes about ten seconds."},
            {"ticket": "Checkout fails for about 10% of customers paying by card."},
            {"ticket": "The whole site is down for all users and no orders go through."},
        ],
    ),
    (
        "How positive is the review?",
        ["very negative", "negative", "positive", "very positive"],
        [
            "Awful. Broke on day one, rude support, never again.",
            "Not great, the strap feels cheap.",
            "Good watch, does what it should.",
            "Absolutely love it, the best purchase I made this year!",
        ],
    ),
]


def probe_noul(scorer: LikelihoodScorer) -> list[tuple[str, float, bool]]:
    """(kind, p(true), truth) for every claim, the true twin of each pair first."""
    results = []
    for kind, true_state, true_claim, false_state, false_claim in PAIRS:
        for state, claim, truth in (
            (true_state, true_claim, True),
            (false_state, false_claim, False),
        ):
            outcome = scorer.score(state, [DecisionQuestion("q", "noul", claim)]).outcomes["q"]
            results.append((kind, outcome.probabilities["true"], truth))
    return results


def report_noul(results: list[tuple[str, float, bool]]) -> None:
    by_kind: dict[str, list[tuple[float, bool]]] = defaultdict(list)
    for kind, p, truth in results:
        by_kind[kind].append((p, truth))
    print(f"{'kind':8} {'right':>7} {'ordered':>8} {'gap':>6} {'Brier':>6}")
    for kind, rows in [*by_kind.items(), ("all", [(p, t) for _, p, t in results])]:
        right = sum((p > 0.5) == truth for p, truth in rows)
        gaps = [a - b for (a, _), (b, _) in zip(rows[::2], rows[1::2], strict=True)]
        brier = sum((p - truth) ** 2 for p, truth in rows) / len(rows)
        print(
            f"{kind:8} {right:>3}/{len(rows):<3} {sum(g > 0 for g in gaps):>4}/{len(gaps):<3}"
            f" {sum(gaps) / len(gaps):>6.3f} {brier:>6.3f}"
        )
    print("true claims: ", " ".join(f"{p:.2f}" for _, p, t in results if t))
    print("false claims:", " ".join(f"{p:.2f}" for _, p, t in results if not t))


def probe_choice_and_score(scorer: LikelihoodScorer) -> None:
    top = 0
    for state, question, labels, right in CHOICES:
        q = DecisionQuestion("q", "choice", question, labels)
        outcome = scorer.score(state, [q]).outcomes["q"]
        top += outcome.best == right
        print(f"choice {right:>9}: top {outcome.best:>9} p={outcome.probabilities[right]:.2f}")
    print(f"choice: right label on top {top}/{len(CHOICES)}")
    increasing = 0
    for question, levels, states in LADDERS:
        q = DecisionQuestion("q", "score", question, levels)
        scores = [scorer.score(s, [q]).outcomes["q"].expected_level for s in states]
        increasing += all(a < b for a, b in zip(scores, scores[1:], strict=False))
        print(f"score '{question}': " + " ".join(f"{s:.2f}" for s in scores))
    print(f"score: ladders strictly increasing {increasing}/{len(LADDERS)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded:qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--noul-only", action="store_true")
    args = parser.parse_args()
    scorer = LikelihoodScorer(
        load_model(args.model, dtype="float32", threads=args.threads), context_length=4096
    )
    started = time.perf_counter()
    results = probe_noul(scorer)
    print(f"model {args.model}: {len(results)} claims in {time.perf_counter() - started:.0f}s")
    report_noul(results)
    if not args.noul_only:
        probe_choice_and_score(scorer)


if __name__ == "__main__":
    main()
