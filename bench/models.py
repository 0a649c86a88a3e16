"""Which model each role gets: both embedded models' quality and latency per role, one run.

    python -m bench.models [--models qwen2.5-coder-0.5b,qwen2.5-coder-1.5b] [--threads 1]
        [--roles fim,edit,decisions] [--config configs/local.yaml]

Per model, one after the other, through the code the deployments run, in this process, with
the engine settings ``--config`` gives each role's deployment (``engine`` with its
``role_engines``; ``--threads`` torch threads per replica, as ``torch_threads``):

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
- ``decode``: decode tok/s of one request at a time with no speculation, prompt lookup and
  draft-model speculation (the 1.5B drafted by the 0.5B), as ``bench.draft_model`` measures.

The rule these figures feed (docs/models.md): each role gets the best quality that meets its
latency budget on the machine it runs on.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import cpu_flags, percentile, table
from bench.fim_cases import CASE_SETS

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")


def p50_p90(seconds: list[float]) -> str:
    return f"{percentile(seconds, 50):.2f}/{percentile(seconds, 90):.2f}"


# ---------------------------------------------------------------------- fim


def role_config(config_path: Path, model: str, threads: int) -> Any:
    """``config_path``'s application config with ``model`` (an embedded model, with the
    settings the config gives it, or those of its first model) serving every role on
    ``threads`` torch threads."""
    from serve_app.config import AppConfig

    document = yaml.safe_load(config_path.read_text())
    args = document["applications"][0]["args"]
    source = f"embedded:{model}"
    declared = [m for m in args["models"] if m["source"] == source] or args["models"][:1]
    served = {**declared[0], "id": model, "source": source, "aliases": []}
    if declared[0]["source"] != source:  # another model's adapter does not fit this one
        served.pop("edit_adapter", None)
    served.pop("openrouter_slug", None)
    engine = {**args.get("engine", {}), "torch_threads": threads}
    roles = {"fim": model, "edit": model, "decisions": model}
    return AppConfig.model_validate(
        {**args, "models": [served], "roles": roles, "engine": engine, "auth": {}}
    )


def fim_role(config: Any, count: int) -> dict[str, Any]:
    from bench.fim_quality import first_line_matches
    from serve_app.engine.engine import LLMEngine
    from serve_app.engine.protocol import GenerationRequest, SamplingParams, generate_text
    from serve_app.prompts.fim import fim_format_for
    from serve_app.serving.fim import service_fim_prompt

    engine = LLMEngine.from_config(config, "fim", model=config.models[0])
    loaded = engine.loaded
    fmt = fim_format_for(loaded.tokenizer, loaded.model_type)
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


def edit_role(config: Any, every: int) -> dict[str, Any]:
    """``bench.next_edit`` with the prompt the model is configured with (``edit_prompt``), as
    Continue and Zed send it."""
    from bench import next_edit

    model = config.models[0]
    variant = f"{model.edit_prompt}/as-sent"
    if variant not in next_edit.VARIANTS:
        variant = next_edit.BASELINE
    args = next_edit.parse_args(
        ["--every", str(every), "--variants", variant, "--repeat-for", variant]
    )
    log = asyncio.run(next_edit.run(args, config))
    cases = {case.name: case for case in next_edit.load_cases(args.data, None)}
    tally = next_edit.tallies_of(log, cases)[variant]
    n = tally.answered
    return {
        "exact": f"{tally.exact}/{n}",
        "delta chrF": f"{tally.chrf / n:.1f}",
        "no-op": f"{tally.noop / n:.0%}",
        "cold p50 s": f"{percentile(tally.cold, 50):.2f}",
        "repeat p50 s": f"{percentile(tally.repeat, 50):.2f}",
        "prompt": variant,
    }


# ---------------------------------------------------------------------- decisions


def decisions_role(config: Any) -> dict[str, Any]:
    """As the DecisionScorer deployment scores: its role's engine settings."""
    from bench import decisions, noul_probe
    from serve_app.engine.startup import load_role_model
    from serve_app.serving.scoring import LikelihoodScorer

    model = config.models[0]
    loaded = load_role_model(config, model, "decisions")
    engine = config.engine_for("decisions")
    scorer = LikelihoodScorer.for_model(loaded, engine, model.context_length)
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
    send = decisions.in_process_sender(loaded, engine)
    body = {"model": model.id, "state": decisions.state(time.time_ns()), "questions": {}}
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


# ---------------------------------------------------------------------- decode


def decode_role(config: Any, cases: int) -> dict[str, Any]:
    """Decode tok/s of one request at a time: no speculation, prompt lookup and, for a model
    with a smaller embedded one to draft for it, the draft model (``bench.draft_model``'s
    comparison: ``cases`` stdlib FIM lines, 64 greedy tokens each)."""
    from bench import draft_model
    from serve_app.models.loader import load_model

    model = config.models[0]
    threads = config.engine.torch_threads
    target = load_model(model.source, dtype=model.dtype, threads=threads)
    smaller = EMBEDDED[: EMBEDDED.index(model.id)] if model.id in EMBEDDED else ()
    draft = None
    if smaller:
        draft = load_model(f"embedded:{smaller[-1]}", dtype=model.dtype, threads=threads)
    modes = [mode for mode in draft_model.MODES if draft is not None or "draft" not in mode]
    prompts = draft_model.stdlib_prompts(target, cases)
    results = draft_model.compare(target, draft, prompts, 64, "cpu", modes)
    base = results["none"]
    figures: dict[str, Any] = {}
    for mode in draft_model.MODES:
        got = results.get(mode)
        if got is None:
            figures[f"{mode} tok/s"] = "-"
            continue
        same = "" if got["ids"] == base["ids"] else ", NOT the same text"
        figures[f"{mode} tok/s"] = f"{got['tps']:.1f} ({got['tps'] / base['tps']:.2f}x{same})"
    return figures


# ---------------------------------------------------------------------- main

ROLES = {
    "fim": lambda config, args: fim_role(config, args.fim_cases),
    "edit": lambda config, args: edit_role(config, args.edit_every),
    "decisions": lambda config, args: decisions_role(config),
    "decode": lambda config, args: decode_role(config, args.decode_cases),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(EMBEDDED))
    parser.add_argument("--roles", default=",".join(ROLES))
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "local.yaml")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per replica")
    parser.add_argument("--fim-cases", type=int, default=30)
    parser.add_argument("--edit-every", type=int, default=5)
    parser.add_argument("--decode-cases", type=int, default=6)
    args = parser.parse_args(argv)
    print(f"CPU: {cpu_flags()}; {args.config}, {args.threads} torch threads", flush=True)
    figures: dict[str, dict[str, dict[str, Any]]] = {}
    for role in args.roles.split(","):
        for model in args.models.split(","):
            started = time.perf_counter()
            config = role_config(args.config, model, args.threads)
            figures.setdefault(role, {})[model] = ROLES[role](config, args)
            took = time.perf_counter() - started
            print(f"{role} on {model}: {figures[role][model]} ({took:.0f} s)", flush=True)
    for role, by_model in figures.items():
        names = list(next(iter(by_model.values())))
        print(f"\n{role}")
        print(table([["model", *names], *([m, *f.values()] for m, f in by_model.items())]))


if __name__ == "__main__":
    main()
