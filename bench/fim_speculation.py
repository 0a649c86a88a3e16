"""Prompt-lookup speculation for FIM: decode speed by draft length and concurrency, in-process.

    python -m bench.fim_speculation --threads 1 --drafts 0,3,6 --concurrency 1,4,8

One engine per draft length over one loaded model (int8 decode, prompts as the service reads
them on this CPU, ``engine.speculation.max_batch`` off so every batch drafts), in one run.
Workloads:

- ``bench.fim``'s prompt (a salted Python module, a new line to complete, 64 tokens, no stop
  sequences): every stream alone, then ``--concurrency`` streams at once (aggregate tok/s);
- lines cut from Python's standard library (``bench.fim_cases.stdlib_lines``, the FIM
  endpoint's default stop sequences, up to 64 tokens), one at a time: median tok/s.

Each prompt is read once before it is timed, so the figures are decode (and the draft checks),
not prompt reading. Ratios are against draft length 0 measured in the same run; "same text"
compares every output with draft length 0's (speculation must not change a greedy token).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from bench.common import table
from bench.fim import CODE
from bench.fim_cases import stdlib_lines
from serve_app.engine.engine import LLMEngine
from serve_app.engine.protocol import GenerationRequest, SamplingParams, generate_text
from serve_app.engine_config import NO_SPECULATION, EngineConfig
from serve_app.models.loader import load_model
from serve_app.prompts.fim import build_fim_prompt, fim_format_for

STDLIB_STOPS = ("\n\n", "\n \n")  # the FIM endpoint's defaults


def _generate(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, tag: str):
    """All ``prompts`` at once; returns (texts, seconds)."""

    async def main() -> list[tuple[str, Any]]:
        requests = [
            GenerationRequest(f"{tag}{i}", list(p), params, "bench", route="fim")
            for i, p in enumerate(prompts)
        ]
        return await asyncio.gather(*(generate_text(engine, r) for r in requests))

    started = time.perf_counter()
    results = asyncio.run(main())
    return [text for text, _ in results], time.perf_counter() - started


def _timed(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, tag: str):
    """Read the prompts (one token each, untimed), then time the request."""
    _generate(engine, prompts, SamplingParams(max_tokens=1), f"warm-{tag}")
    return _generate(engine, prompts, params, tag)


def measure(loaded: Any, draft: int, workloads: dict[str, Any], args: Any) -> dict[str, Any]:
    config = EngineConfig(
        weights="auto",
        prompt_weights="auto",
        small_prefill_tokens=32,
        max_batch_size=max(args.concurrency),
        speculation=NO_SPECULATION.model_copy(update={"fim": draft, "max_batch": 64}),
    )
    engine = LLMEngine(loaded, config)
    count = loaded.tokenizer.encode
    out: dict[str, Any] = {"texts": []}
    try:
        plain = SamplingParams(max_tokens=64, stop=())
        rates = []
        for i, prompt in enumerate(workloads["bench"]):
            (text,), seconds = _timed(engine, [prompt], plain, f"b{i}")
            rates.append(len(count(text)) / seconds)
            out["texts"].append(text)
        out["single"] = statistics.median(rates)
        for n in args.concurrency:
            texts, seconds = _timed(engine, workloads["bench"][:n], plain, f"c{n}")
            out[f"x{n}"] = sum(len(count(t)) for t in texts) / seconds
            out["texts"] += texts
        stdlib = SamplingParams(max_tokens=64, stop=STDLIB_STOPS)
        rates = []
        for i, prompt in enumerate(workloads["stdlib"]):
            (text,), seconds = _timed(engine, [prompt], stdlib, f"s{i}")
            rates.append(max(1, len(count(text))) / seconds)
            out["texts"].append(text)
        out["stdlib"] = statistics.median(rates)
        stats = engine.stats()
        out["acceptance"] = stats.draft_acceptance if stats.draft_tokens else None
    finally:
        engine.shutdown()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", default="embedded:qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--drafts", default="0,3,6", help="draft lengths; 0 is the baseline")
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--cases", type=int, default=8, help="standard-library FIM cases")
    args = parser.parse_args()
    drafts = sorted({0, *(int(d) for d in args.drafts.split(","))})
    args.concurrency = [int(c) for c in args.concurrency.split(",")]

    loaded = load_model(args.source, threads=args.threads)
    fmt = fim_format_for(loaded.tokenizer, loaded.model_type)
    salted = [f"# run {time.time_ns()}-{i}\n" + CODE for i in range(max(args.concurrency))]
    workloads = {
        "bench": [build_fim_prompt(fmt, loaded.tokenizer, p, "\n") for p in salted],
        "stdlib": [
            build_fim_prompt(fmt, loaded.tokenizer, prefix, suffix)
            for prefix, suffix, _ in stdlib_lines(args.cases)
        ],
    }
    results = {}
    for draft in drafts:
        results[draft] = measure(loaded, draft, workloads, args)
        print(f"draft {draft}: done", flush=True)
    base = results[0]
    columns = ["single", *(f"x{n}" for n in args.concurrency), "stdlib"]
    heads = ["bench.fim prompt, alone (tok/s, median)"]
    heads += [f"{n} streams at once, aggregate (tok/s)" for n in args.concurrency]
    heads += ["stdlib lines, alone (tok/s, median)"]
    rows = [["draft tokens", *heads, "drafts accepted", "same text as 0"]]
    for draft, got in results.items():
        cells = [f"{got[c]:.1f} ({got[c] / base[c]:.2f}x)" for c in columns]
        accepted = "-" if got["acceptance"] is None else f"{got['acceptance']:.0%}"
        same = "yes" if got["texts"] == base["texts"] else "no"
        rows.append([str(draft), *cells, accepted, same])
    print(f"{args.source}, {args.threads} thread(s); ratios against draft length 0, same run")
    print(table(rows))


if __name__ == "__main__":
    main()
