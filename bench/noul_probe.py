"""How well decisions separate right from wrong answers on a model, in process.

``noul``: 60 claims in 30 true/false pairs over six kinds of state (tickets, code, logs,
orders, reviews, mail): the same claim about two states, or two claims about one state. Prints
how many land on the right side of 0.5, how many pairs are ordered (the true twin above the
false one), the mean gap within pairs and the Brier score, overall and per kind.

``choice`` and ``score``: a few questions whose right label is plain, and score ladders whose
states grow in severity; prints how often the right label is on top and whether the expected
score increases along each ladder.

The scorer is built as the scorer deployment builds it (the engine's runner, prompts on the
weights ``--weights``/``--prompt-weights`` pick, both ``auto`` as ``configs/local.yaml``:
int8 on AVX2 CPUs; ``--prompt-weights dense`` for the dense numbers, ``--runner hf`` for the HF
forward), and answers as the service does (no calibration) unless ``--calibrate KINDS`` names
question kinds to calibrate on the content-free state (``--calibrate noul,choice,score``).
``--calibration`` prints the raw answers and their calibration on each content-free state in
``NULL_STATES`` side by side; ``--held-out`` probes ``HELD_OUT`` instead of ``PAIRS``.

    python -m bench.noul_probe [--model embedded:qwen2.5-coder-0.5b] [--threads 2]
        [--noul-only | --choice-only] [--calibration] [--held-out] [--calibrate KINDS]
        [--runner auto|hf] [--weights auto|int4|int8|dense] [--prompt-weights auto|dense|decode]
        [--int8-kernel auto|q8|fbgemm]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import defaultdict
from typing import Any

from bench.noul_cases import CHOICES, HELD_OUT, LADDERS, PAIRS, Pair
from serve_app.engine_config import EngineConfig
from serve_app.models.loader import load_model
from serve_app.runner.builder import PROMPT_WEIGHTS
from serve_app.serving.scoring import (
    DecisionQuestion,
    LikelihoodScorer,
    QuestionOutcome,
    calibrated,
)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


Result = tuple[str, float, bool]  # kind, p(true), truth

# Content-free states compared by ``--calibration`` (the scorer uses CONTENT_FREE_STATE).
NULL_STATES: dict[str, Any] = {"N/A": "N/A", "empty": "", "{}": {}}


def claims(pairs: list[Pair]) -> list[tuple[str, Any, str, bool]]:
    """(kind, state, claim, truth) for every claim, the true twin of each pair first."""
    return [
        row
        for kind, true_state, true_claim, false_state, false_claim in pairs
        for row in ((kind, true_state, true_claim, True), (kind, false_state, false_claim, False))
    ]


def probe_noul(scorer: LikelihoodScorer, pairs: list[Pair]) -> list[Result]:
    """p(true) for every claim, each asked alone about its state as a caller would."""
    results = []
    for kind, state, claim, truth in claims(pairs):
        outcome = run(
            scorer.score(state, [DecisionQuestion("q", "noul", claim)], cache_salt="bench")
        ).outcomes["q"]
        results.append((kind, outcome.probabilities["true"], truth))
    return results


def compare_calibration(scorer: LikelihoodScorer, pairs: list[Pair]) -> None:
    """The uncalibrated answers, then each content-free state's calibration of them.

    ``scorer`` must not calibrate (``calibrate=()``): its raw answers are corrected here
    with the scorer's own ``calibrated``, one content-free state at a time. The null
    answers for all claims come from one request per null state (same rows as one each).
    """
    rows = claims(pairs)
    raw = probe_noul(scorer, pairs)
    print("uncalibrated:")
    report_noul(raw)
    questions = [
        DecisionQuestion(f"c{i}", "noul", claim) for i, (_, _, claim, _) in enumerate(rows)
    ]
    for label, null in NULL_STATES.items():
        priors = run(scorer.score(null, questions, cache_salt="bench")).outcomes
        fixed = []
        for i, (kind, p, truth) in enumerate(raw):
            answer = QuestionOutcome("q", "noul", {"true": p, "false": 1.0 - p})
            fixed.append((kind, calibrated(answer, priors[f"c{i}"]).probabilities["true"], truth))
        print(f"calibrated on the content-free state {label!r} (its p(true) per claim:")
        print(
            "  "
            + " ".join(f"{priors[f'c{i}'].probabilities['true']:.2f}" for i in range(len(rows)))
            + ")"
        )
        report_noul(fixed)


def report_noul(results: list[Result]) -> None:
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
        outcome = run(scorer.score(state, [q], cache_salt="bench")).outcomes["q"]
        top += outcome.best == right
        print(f"choice {right:>9}: top {outcome.best:>9} p={outcome.probabilities[right]:.2f}")
    print(f"choice: right label on top {top}/{len(CHOICES)}")
    increasing = 0
    for question, levels, states in LADDERS:
        q = DecisionQuestion("q", "score", question, levels)
        scores = [
            run(scorer.score(s, [q], cache_salt="bench")).outcomes["q"].expected_level
            for s in states
        ]
        increasing += all(a < b for a, b in zip(scores, scores[1:], strict=False))
        print(f"score '{question}': " + " ".join(f"{s:.2f}" for s in scores))
    print(f"score: ladders strictly increasing {increasing}/{len(LADDERS)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="embedded:qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--noul-only", action="store_true")
    parser.add_argument("--choice-only", action="store_true", help="skip the noul probe")
    parser.add_argument(
        "--calibration",
        action="store_true",
        help="compare uncalibrated noul answers with each content-free state's calibration",
    )
    parser.add_argument(
        "--held-out", action="store_true", help="probe the held-out pairs instead of PAIRS"
    )
    parser.add_argument(
        "--calibrate",
        default="",
        help="comma-separated question kinds the scorer calibrates (default none, as served)",
    )
    parser.add_argument("--runner", choices=("auto", "hf"), default="auto")
    parser.add_argument("--weights", choices=("auto", "int4", "int8", "dense"), default="auto")
    parser.add_argument("--prompt-weights", choices=PROMPT_WEIGHTS, default="auto")
    parser.add_argument("--int8-kernel", choices=("auto", "q8", "fbgemm"), default="auto")
    args = parser.parse_args()
    pairs = HELD_OUT if args.held_out else PAIRS
    kinds = () if args.calibration else tuple(k for k in args.calibrate.split(",") if k)
    loaded = load_model(args.model, dtype="float32", threads=args.threads)
    options = EngineConfig(
        runner=args.runner,
        weights=args.weights,
        prompt_weights=args.prompt_weights,
        int8_kernel=args.int8_kernel,
    )
    scorer = LikelihoodScorer.for_model(loaded, options, 4096, calibrate=kinds)
    started = time.perf_counter()
    weights = f"{scorer.engine.stats().backend}, {args.weights} weights, {args.int8_kernel} int8"
    print(f"model {args.model} ({weights}), {len(pairs)} pairs, calibrating {list(kinds)}")
    if args.calibration:
        compare_calibration(scorer, pairs)
    elif not args.choice_only:
        report_noul(probe_noul(scorer, pairs))
    print(f"noul probe: {time.perf_counter() - started:.0f}s")
    if not args.noul_only:
        probe_choice_and_score(scorer)


if __name__ == "__main__":
    main()
