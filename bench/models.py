"""Which model each role gets: both embedded models' quality and latency per role, one run.

    python -m bench.models [--models qwen2.5-coder-0.5b,qwen2.5-coder-1.5b] [--threads 2]

Per model, one after the other, through the code the deployments run, in this process:

- ``fim``: ``--fim-cases`` lines cut from standard-library modules (``bench.fim_cases``'
  ``file`` set: 30 lines before, 10 after), the prompt the FIM service sends
  (``service_fim_prompt``: spm, token healing); exact first line, and the latency of the
  keystroke that matters most after typing along a suggestion, a new line: the file up to the
  line before is read first (untimed, as the keystrokes before it would have), then the
  request for the line is timed (its last line's tokens read, the answer decoded).
- ``edit``: ``bench.next_edit``'s real edits (every ``--edit-every``-th case), today's prompt
  as Continue and Zed send it: exact, delta chrF, no-op share, cold p50 and the p50 of a
  repeat with one more keystroke.
- ``decisions``: ``bench.noul_probe``'s 60 claims in 30 true/false pairs (pairs ordered, claims
  on the right side of 0.5, p50 seconds per claim), then one request of 10 questions and one
  255-label choice, each about a fresh ``bench.decisions`` ~1,600-token ticket, cold (the
  deadline that matters is ``limits.decision_timeout_s``, 120 s).

The rule these figures feed (docs/models.md): each role gets the best quality that meets its
latency budget on the machine it runs on.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from typing import Any

from bench.common import cpu_flags, percentile, table
from bench.fim_cases import CASE_SETS

EMBEDDED = ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")


def p50_p90(seconds: list[float]) -> str:
    return f"{percentile(seconds, 50):.2f}/{percentile(seconds, 90):.2f}"


# ---------------------------------------------------------------------- fim


def fim_role(model: str, threads: int, count: int) -> dict[str, Any]:
    from bench.fim_quality import first_line_matches
    from serve_app.engine.engine import LLMEngine
    from serve_app.engine.engine_config import EngineConfig
    from serve_app.engine.loader import load_model
    from serve_app.engine.prompts.fim import fim_format_for
    from serve_app.engine.protocol import GenerationRequest, SamplingParams, generate_text
    from serve_app.serving.fim import service_fim_prompt

    loaded = load_model(f"embedded:{model}", threads=threads)
    fmt = fim_format_for(loaded.tokenizer, loaded.model_type)
    engine = LLMEngine(loaded, EngineConfig(max_batch_size=2))  # local.yaml's engine block
    params = SamplingParams(max_tokens=64, stop=("\n",))

    def prompt(prefix: str, suffix: str) -> tuple[list[int], str]:
        return service_fim_prompt(fmt, loaded.tokenizer, prefix, suffix, "spm", None, True)

    async def ask(healed: tuple[list[int], str], tag: str) -> tuple[str, float]:
        ids, answer_prefix = healed
        request = GenerationRequest(tag, ids, params, "bench", "fim", answer_prefix)
        started = time.perf_counter()
        text, _ = await generate_text(engine, request)
        return text, time.perf_counter() - started

    async def main() -> tuple[int, list[float]]:
        hits, seconds = 0, []
        for i, case in enumerate(CASE_SETS["file"](count, 1)):
            before = case.prefix[: case.prefix.rstrip("\n").rfind("\n") + 1]  # the line before
            await ask(prompt(before, case.suffix), f"w{i}")
            text, took = await ask(prompt(case.prefix, case.suffix), f"f{i}")
            hits += first_line_matches(text, case.line)
            seconds.append(took)
        return hits, seconds

    try:
        hits, seconds = asyncio.run(main())
    finally:
        engine.shutdown()
    return {"exact": f"{hits}/{count}", "new line p50/p90 s": p50_p90(seconds)}


# ---------------------------------------------------------------------- edit


def edit_role(model: str, threads: int, every: int) -> dict[str, Any]:
    from bench import next_edit

    args = argparse.Namespace(
        data=next_edit.CASES,
        cases=None,
        every=every,
        threads=threads,
        variants=[next_edit.BASELINE],
        repeat_for=[next_edit.BASELINE],
        log=None,
        model=model,
    )
    log = asyncio.run(next_edit.run(args))
    cases = {case.name: case for case in next_edit.load_cases(args.data, None)}
    tally = next_edit.tallies_of(log, cases)[next_edit.BASELINE]
    n = tally.answered
    return {
        "exact": f"{tally.exact}/{n}",
        "delta chrF": f"{tally.chrf / n:.1f}",
        "no-op": f"{tally.noop / n:.0%}",
        "cold p50 s": f"{percentile(tally.cold, 50):.2f}",
        "repeat p50 s": f"{percentile(tally.repeat, 50):.2f}",
    }


# ---------------------------------------------------------------------- decisions


def decisions_role(model: str, threads: int) -> dict[str, Any]:
    from bench import decisions, noul_probe
    from serve_app.engine.engine_config import EngineConfig
    from serve_app.engine.loader import load_model
    from serve_app.engine.scoring import LikelihoodScorer

    loaded = load_model(f"embedded:{model}", dtype="float32", threads=threads)
    scorer = LikelihoodScorer.for_model(loaded, EngineConfig(), 32768)
    seconds, results = [], []
    for _, state, claim, truth in noul_probe.claims(noul_probe.PAIRS):
        started = time.perf_counter()
        question = noul_probe.DecisionQuestion("q", "noul", claim)
        outcome = asyncio.run(scorer.score(state, [question], cache_salt="bench"))
        seconds.append(time.perf_counter() - started)
        results.append((outcome.outcomes["q"].probabilities["true"], truth))
    scorer.engine.shutdown()
    del scorer
    gc.collect()
    ordered = sum(a > b for (a, _), (b, _) in zip(results[::2], results[1::2], strict=True))
    right = sum((p > 0.5) == truth for p, truth in results)
    send = decisions.in_process_sender(loaded, "auto")
    body = {"model": model, "state": decisions.state(time.time_ns()), "questions": {}}
    body["questions"] = decisions.QUESTIONS
    ten, _ = asyncio.run(send(body))
    body |= {"state": decisions.state(time.time_ns()), "questions": decisions.LABELS}
    labels, _ = asyncio.run(send(body))
    return {
        "pairs ordered": f"{ordered}/{len(results) // 2}",
        "right side of 0.5": f"{right}/{len(results)}",
        "p50 s per claim": f"{statistics.median(seconds):.2f}",
        "10 questions, 1.6k-token state, cold s": f"{ten:.1f}",
        "255-label choice, same, s": f"{labels:.1f}",
    }


# ---------------------------------------------------------------------- main

ROLES = {
    "fim": lambda model, args: fim_role(model, args.threads, args.fim_cases),
    "edit": lambda model, args: edit_role(model, args.threads, args.edit_every),
    "decisions": lambda model, args: decisions_role(model, args.threads),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(EMBEDDED))
    parser.add_argument("--roles", default=",".join(ROLES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--fim-cases", type=int, default=30)
    parser.add_argument("--edit-every", type=int, default=5)
    args = parser.parse_args(argv)
    print(f"CPU: {cpu_flags()}; {args.threads} torch threads", flush=True)
    figures: dict[str, dict[str, dict[str, Any]]] = {}
    for role in args.roles.split(","):
        for model in args.models.split(","):
            started = time.perf_counter()
            figures.setdefault(role, {})[model] = ROLES[role](model, args)
            took = time.perf_counter() - started
            print(f"{role} on {model}: {figures[role][model]} ({took:.0f} s)", flush=True)
    for role, by_model in figures.items():
        names = list(next(iter(by_model.values())))
        print(f"\n{role}")
        print(table([["model", *names], *([m, *f.values()] for m, f in by_model.items())]))


if __name__ == "__main__":
    main()
