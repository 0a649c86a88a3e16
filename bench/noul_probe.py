"""How well ``noul`` separates true from false claims on a model, in process.

28 claims in 14 pairs: the same claim about two states (or two claims about one state), one
true and one false. Prints how many land on the right side of 0.5, how many pairs are ordered
(the true twin above the false one), the mean gap within pairs and the Brier score.

    python -m bench.noul_probe [--model embedded:qwen2.5-coder-0.5b] [--threads 2]
"""

from __future__ import annotations

import argparse
import time

from serve_app.engine.loader import load_model
from serve_app.engine.scoring import DecisionQuestion, LikelihoodScorer

CASES = [  # (state, claim, is the claim true for the state)
    (
        {"ticket": "The login page returns HTTP 500 for every user since the deploy at 09:00."},
        "The ticket describes a service outage.",
        True,
    ),
    (
        {"ticket": "The login page returns HTTP 500 for every user since the deploy at 09:00."},
        "The ticket asks for a new feature.",
        False,
    ),
    (
        {"ticket": "Could you add a dark mode to the dashboard? It would be nice."},
        "The ticket asks for a new feature.",
        True,
    ),
    (
        {"ticket": "Could you add a dark mode to the dashboard? It would be nice."},
        "The user reports that something is broken.",
        False,
    ),
    (
        "The invoice total is 120 EUR and it was paid on 3 March.",
        "The invoice has been paid.",
        True,
    ),
    (
        "The invoice total is 120 EUR and it is still unpaid, due on 3 March.",
        "The invoice has been paid.",
        False,
    ),
    ({"temperature_c": 38.9, "patient": "adult"}, "The patient has a fever.", True),
    ({"temperature_c": 36.6, "patient": "adult"}, "The patient has a fever.", False),
    (
        "def add(a, b):\n    return a - b",
        "The function add returns the sum of its arguments.",
        False,
    ),
    (
        "def add(a, b):\n    return a + b",
        "The function add returns the sum of its arguments.",
        True,
    ),
    ({"order": {"items": 3, "status": "shipped"}}, "The order has shipped.", True),
    ({"order": {"items": 3, "status": "cancelled"}}, "The order has shipped.", False),
    (
        "Email: Congratulations! You won a free iPhone, click this link to claim your prize now!!!",
        "This email is spam.",
        True,
    ),
    (
        "Email: Hi Anna, the meeting moved to 3pm tomorrow, same room. Thanks, Ben",
        "This email is spam.",
        False,
    ),
    ({"cart": [], "user": "guest"}, "The cart is empty.", True),
    ({"cart": ["book", "pen"], "user": "guest"}, "The cart is empty.", False),
    ("The build failed: 3 tests failed in test_auth.py.", "All tests passed.", False),
    ("The build succeeded: 412 tests passed, 0 failed.", "All tests passed.", True),
    ({"age": 15}, "The person is an adult.", False),
    ({"age": 42}, "The person is an adult.", True),
    (
        "The review says: 'Terrible product, broke after one day, want my money back.'",
        "The review is positive.",
        False,
    ),
    (
        "The review says: 'Love it, works perfectly and arrived early.'",
        "The review is positive.",
        True,
    ),
    ({"stock": 0, "product": "chair"}, "The chair is in stock.", False),
    ({"stock": 12, "product": "chair"}, "The chair is in stock.", True),
    (
        "Python 3.11 was used to run the script, and it printed 'done'.",
        "The script ran without errors.",
        True,
    ),
    (
        "Traceback (most recent call last): ... KeyError: 'id'",
        "The script ran without errors.",
        False,
    ),
    ({"pr": {"approvals": 2, "ci": "green"}}, "The pull request is ready to merge.", True),
    ({"pr": {"approvals": 0, "ci": "red"}}, "The pull request is ready to merge.", False),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded:qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    scorer = LikelihoodScorer(
        load_model(args.model, dtype="float32", threads=args.threads), context_length=4096
    )
    started = time.perf_counter()
    results = []
    for state, claim, truth in CASES:
        outcome = scorer.score(state, [DecisionQuestion("q", "noul", claim)]).outcomes["q"]
        results.append((outcome.probabilities["true"], truth))
    right = sum((p > 0.5) == truth for p, truth in results)
    gaps = [
        (a if a_true else b) - (b if a_true else a)
        for (a, a_true), (b, _) in zip(results[::2], results[1::2], strict=True)
    ]
    brier = sum((p - truth) ** 2 for p, truth in results) / len(results)
    print(f"model {args.model}: {len(CASES)} claims in {time.perf_counter() - started:.0f}s")
    print(f"right side of 0.5: {right}/{len(CASES)}")
    print(f"pairs ordered:     {sum(g > 0 for g in gaps)}/{len(gaps)}")
    print(f"mean pair gap:     {sum(gaps) / len(gaps):.3f}")
    print(f"Brier score:       {brier:.3f} (0.25 = always 0.5)")
    print("true claims: ", " ".join(f"{p:.2f}" for p, t in results if t))
    print("false claims:", " ".join(f"{p:.2f}" for p, t in results if not t))


if __name__ == "__main__":
    main()
