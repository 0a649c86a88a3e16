"""FIM quality by prompt layout: exact first line on code no one here wrote, in-process.

    python -m bench.fim_quality --cases 40 --layouts psm,spm [--llama-url http://127.0.0.1:8090]

For every case set of ``bench.fim_cases`` (stdlib windows, long files, short functions, C++
headers) and every layout of ``serve_app.prompts.fim`` (``psm``: prefix, suffix,
middle, today's default; ``spm``: suffix first, the prefix right before the answer), the
embedded model completes each case greedily through the engine as the service runs it on
this CPU (the runner, int8 or int4 decode weights, prompts on ``--prompt-weights``, as
``engine.prompt_weights`` reads them: ``auto``, int8 on AVX2, by default), and a case counts
when the completion's first line equals the removed line (trailing spaces ignored). Ratios
are against ``psm`` in the same run.

With ``--llama-url`` the same prompts, rendered as text with the same markers, also go to a
running ``llama-server`` on the model's own GGUF (``/completion``, greedy, no prompt cache),
so the table shows what llama.cpp reaches with each layout on the same cases.

``--cursor``: where the cursor is. ``line-start`` (the default): the prefix ends with the
newline before the removed line, which is the expected answer. ``indented``: it also holds
the line's indentation, as an editor leaves the cursor after Enter, and the answer is the
line's code. The service's prompt is what the FIM service sends the engine
(``service_fim_prompt``: token healing on, as ``fim_token_healing`` defaults); llama.cpp gets
the same text.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import urllib.request
from pathlib import Path

from bench.common import cpu_flags
from bench.fim_cases import CASE_SETS, FimCase
from serve_app.engine.engine import LLMEngine
from serve_app.engine.protocol import GenerationRequest, SamplingParams, generate_text
from serve_app.engine_config import NO_SPECULATION, EngineConfig
from serve_app.models.loader import load_model
from serve_app.prompts.fim import FIM_LAYOUTS, FimFormat, fim_format_for
from serve_app.serving.fim import service_fim_prompt

MAX_TOKENS = 48


def first_line_matches(text: str, line: str) -> bool:
    return text.split("\n", 1)[0].rstrip() == line.rstrip()


async def _engine_answers(
    engine: LLMEngine, prompts: list[tuple[list[int], str]], tag: str
) -> list[str]:
    params = SamplingParams(max_tokens=MAX_TOKENS, stop=("\n",))
    limit = asyncio.Semaphore(8)

    async def one(i: int, prompt: tuple[list[int], str]) -> str:
        ids, answer_prefix = prompt
        async with limit:
            request = GenerationRequest(
                f"{tag}-{i}", ids, params, f"bench-{tag}-{i}", "fim", answer_prefix
            )
            text, _ = await generate_text(engine, request)
            return text

    return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))


def _llama_answer(url: str, prompt: str) -> str:
    body = {
        "prompt": prompt,
        "n_predict": MAX_TOKENS,
        "temperature": 0,
        "top_k": 1,
        "stop": ["\n"],
        "cache_prompt": False,
    }
    request = urllib.request.Request(
        f"{url}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())["content"]


def at_cursor(case: FimCase, cursor: str) -> FimCase:
    """The case with the cursor after the line's indentation (``indented``) or before it."""
    if cursor == "line-start":
        return case
    code = case.line.lstrip(" \t")
    indent = case.line[: len(case.line) - len(code)]
    return FimCase(case.source, case.prefix + indent, code, case.suffix)


def render(fmt: FimFormat, case: FimCase, layout: str) -> str:
    if layout == "spm":
        return f"{fmt.prefix}{fmt.suffix}{case.suffix}{fmt.middle}{case.prefix}"
    return f"{fmt.prefix}{case.prefix}{fmt.suffix}{case.suffix}{fmt.middle}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", default="embedded:qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cases", type=int, default=40, help="cases per set")
    parser.add_argument("--sets", default=",".join(CASE_SETS))
    parser.add_argument("--layouts", default=",".join(FIM_LAYOUTS))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cursor", choices=("line-start", "indented"), default="line-start")
    parser.add_argument("--llama-url", default=None)
    parser.add_argument("--weights", default="auto", help="engine.weights (decode weights)")
    parser.add_argument(
        "--prompt-weights", default="auto", help="engine.prompt_weights (auto: int8 on AVX2)"
    )
    parser.add_argument(
        "--int8-kernel", default="auto", help="engine.int8_kernel (the prompts' 8-bit kernel)"
    )
    parser.add_argument(
        "--save-answers", type=Path, help="write the service's first lines here (JSON)"
    )
    parser.add_argument(
        "--agree-with",
        type=Path,
        help="a --save-answers file of another run (fp32 prompts, another kernel): print how "
        "many of this run's first lines are the same as its",
    )
    parser.add_argument("--show-misses", action="store_true")
    parser.add_argument(
        "--no-service", action="store_true", help="with --llama-url: only llama.cpp's column"
    )
    args = parser.parse_args()
    layouts = args.layouts.split(",")
    sets = {
        name: [at_cursor(case, args.cursor) for case in CASE_SETS[name](args.cases, args.seed)]
        for name in args.sets.split(",")
    }

    loaded = load_model(args.source, threads=args.threads)
    fmt = fim_format_for(loaded.tokenizer, loaded.model_type)
    config = EngineConfig(
        weights=args.weights,
        prompt_weights=args.prompt_weights,
        int8_kernel=args.int8_kernel,
        max_batch_size=4,
        prefix_cache_mb=0,
        speculation=NO_SPECULATION,
    )
    engine = LLMEngine(loaded, config)
    results: dict[tuple[str, str, str], list[bool]] = {}
    answers: dict[str, str] = {}
    started = time.perf_counter()
    try:
        for set_name, cases in sets.items():
            for layout in layouts:
                prompts = [
                    service_fim_prompt(
                        fmt, loaded.tokenizer, c.prefix, c.suffix, layout, None, True
                    )
                    for c in cases
                ]
                if not args.no_service:
                    texts = asyncio.run(_engine_answers(engine, prompts, f"{set_name}-{layout}"))
                    hits = [
                        first_line_matches(t, c.line) for t, c in zip(texts, cases, strict=True)
                    ]
                    results[("service", set_name, layout)] = hits
                    for i, text in enumerate(texts):
                        answers[f"{set_name}/{layout}/{i}"] = text.split("\n", 1)[0].rstrip()
                    _report_progress("service", set_name, layout, hits, started)
                    if args.show_misses:
                        _show_misses(cases, texts, hits)
                if args.llama_url:
                    texts = [_llama_answer(args.llama_url, render(fmt, c, layout)) for c in cases]
                    hits = [
                        first_line_matches(t, c.line) for t, c in zip(texts, cases, strict=True)
                    ]
                    results[("llama.cpp", set_name, layout)] = hits
                    _report_progress("llama.cpp", set_name, layout, hits, started)
    finally:
        engine.shutdown()
    print(
        f"\n{args.source}, exact first line, greedy, {args.cases} cases per set, {args.cursor}, "
        f"weights {args.weights}, prompt_weights {args.prompt_weights}, "
        f"int8_kernel {args.int8_kernel}"
    )
    print(f"CPU: {cpu_flags()}; engine backend: {engine.stats().backend}")
    print(_table(results, list(sets), layouts))
    if args.save_answers:
        args.save_answers.write_text(json.dumps(answers, indent=1))
    if args.agree_with:
        print(_agreement(answers, json.loads(args.agree_with.read_text()), args.agree_with))


def _agreement(answers: dict[str, str], reference: dict[str, str], name: Path) -> str:
    """How many first lines are the same as ``reference``'s, per set and in all."""
    common = [key for key in answers if key in reference]
    per_set: dict[str, list[bool]] = {}
    for key in common:
        per_set.setdefault(key.split("/", 1)[0], []).append(answers[key] == reference[key])
    parts = [f"{k} {sum(v)}/{len(v)}" for k, v in per_set.items()]
    same = sum(sum(v) for v in per_set.values())
    return f"same first line as {name}: {', '.join(parts)}; all {same}/{len(common)}"


def _report_progress(engine: str, set_name: str, layout: str, hits: list[bool], t0: float):
    elapsed = time.perf_counter() - t0
    print(f"[{elapsed:6.0f} s] {engine} {set_name} {layout}: {sum(hits)}/{len(hits)}", flush=True)


def _show_misses(cases: list[FimCase], texts: list[str], hits: list[bool]) -> None:
    for case, text, hit in zip(cases, texts, hits, strict=True):
        if not hit:
            print(f"  {case.source}: want {case.line.strip()!r} got {text.strip()!r}")


def _table(results: dict[tuple[str, str, str], list[bool]], sets: list[str], layouts: list[str]):
    engines = sorted({engine for engine, _, _ in results}, reverse=True)
    head = ["engine", "layout", *sets, "all"]
    rows = [head, ["---"] * len(head)]
    for engine in engines:
        base = {s: sum(results[(engine, s, layouts[0])]) for s in sets}
        for layout in layouts:
            cells = []
            for s in sets:
                hits = results[(engine, s, layout)]
                ratio = f" ({sum(hits) / base[s]:.2f}x)" if base[s] and layout != layouts[0] else ""
                cells.append(f"{sum(hits)}/{len(hits)}{ratio}")
            total = sum(sum(results[(engine, s, layout)]) for s in sets)
            count = sum(len(results[(engine, s, layout)]) for s in sets)
            cells.append(f"{total}/{count}")
            rows.append([engine, layout, *cells])
    return "\n".join("| " + " | ".join(row) + " |" for row in rows)


if __name__ == "__main__":
    main()
