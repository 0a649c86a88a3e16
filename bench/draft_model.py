"""Draft-model speculation against none and prompt lookup: decode speed, acceptance, same text.

    python -m bench.draft_model                       # embedded 1.5B drafted by the 0.5B, CPU
    python -m bench.draft_model --random 1.5b:0.5b --device cuda   # published shapes, a GPU
    python -m bench.draft_model --smoke               # the tiny model drafting for itself, CPU

Real models (the default): lines cut from Python's standard library
(``bench.fim_cases.stdlib_lines``), one request at a time, greedy, 64 tokens with no stop
sequence; each prompt is read once untimed first (the target's prompt is then a prefix-cache
hit, as on a keystroke; that request decodes nothing, so the draft model reads the prompt
inside the timed decode).
Engines, one per mode over the same loaded models:

- ``none``: no speculation (the baseline of every ratio);
- ``lookup``: prompt-lookup drafts of 2 (configs/local.yaml's FIM setting);
- ``draft``: the draft model's greedy tokens (k from 4, adapting);
- ``lookup+draft``: lookup first, the draft model where lookup finds nothing.

Per mode: median decode tok/s (tokens after the first over their time), drafted tokens kept,
and whether every text equals ``none``'s (greedy output must not change).

``--random T:D``: bench.gpu's random-weight models of the published shapes, whose tokens agree
by chance only (acceptance ~0): the end-to-end figure is draft-model speculation's cost when
every draft is rejected. Beside it, the step costs that decide when it pays, timed on the
runner directly: the target's forward of 1 and of k + 1 positions, one draft step; and the
speed they imply at a per-token acceptance a, for a greedy draft of k kept up to the first miss:
tokens per step (1 - a^(k+1)) / (1 - a), over (k draft steps + one check) in target steps.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import torch

from bench.common import table
from serve_app.engine.engine import LLMEngine
from serve_app.engine.protocol import GenerationRequest, SamplingParams
from serve_app.engine_config import NO_SPECULATION, EngineConfig
from serve_app.models.loader import LoadedModel, load_model

MODES = {
    "none": dict(),
    "lookup": dict(fim=2),
    "draft": dict(draft_model_routes=["fim"]),
    "lookup+draft": dict(fim=2, draft_model_routes=["fim"]),
}
ACCEPTANCES = (0.5, 0.7, 0.8, 0.9)


def engine_for(target: LoadedModel, draft: LoadedModel, mode: str, device: str) -> LLMEngine:
    speculation = NO_SPECULATION.model_copy(update={**MODES[mode], "draft_model_tokens": 4})
    config = EngineConfig(
        max_batch_size=2,
        prefix_cache_mb=512,
        prefill_chunk_tokens=1024 if device.startswith("cuda") else 256,
        speculation=speculation,
    )
    return LLMEngine(target, config, draft=draft if "draft" in mode else None)


async def timed(engine: LLMEngine, prompt: list[int], tokens: int, tag: str) -> tuple:
    """(token ids, decode tok/s after the first token)."""
    request = GenerationRequest(
        tag, prompt, SamplingParams(max_tokens=tokens, stop=()), "bench", route="fim"
    )
    ids: list[int] = []
    first = last = 0.0
    async for chunk in engine.generate(request):
        last = time.perf_counter()
        if not ids and chunk.token_ids:
            first = last
        ids += chunk.token_ids
    return ids, (len(ids) - 1) / (last - first) if len(ids) > 1 else 0.0


def run_mode(engine: LLMEngine, prompts: list[list[int]], tokens: int) -> dict[str, Any]:
    async def main() -> list[tuple]:
        out = []
        for i, prompt in enumerate(prompts):
            await timed(engine, prompt, 1, f"warm{i}")  # the target reads the prompt, untimed
            out.append(await timed(engine, prompt, tokens, f"run{i}"))
        return out

    results = asyncio.run(main())
    stats = engine.stats()
    return {
        "ids": [ids for ids, _ in results],
        "tps": statistics.median(rate for _, rate in results),
        "kept": stats.accepted_draft_tokens / stats.draft_tokens if stats.draft_tokens else None,
        "model_kept": (
            stats.accepted_model_draft_tokens / stats.model_draft_tokens
            if stats.model_draft_tokens
            else None
        ),
    }


def compare(target, draft, prompts, tokens: int, device: str, modes: list[str]) -> dict:
    results = {}
    for mode in modes:
        engine = engine_for(target, draft, mode, device)
        try:
            results[mode] = run_mode(engine, prompts, tokens)
        finally:
            engine.shutdown()
        print(f"{mode}: done", flush=True)
    return results


def print_modes(results: dict[str, dict[str, Any]]) -> None:
    base = results["none"]
    rows = [["mode", "decode tok/s (median)", "drafts kept", "draft model's kept", "same text"]]
    for mode, got in results.items():
        rows.append(
            [
                mode,
                f"{got['tps']:.1f} ({got['tps'] / base['tps']:.2f}x)",
                "-" if got["kept"] is None else f"{got['kept']:.0%}",
                "-" if got["model_kept"] is None else f"{got['model_kept']:.0%}",
                "yes" if got["ids"] == base["ids"] else "NO",
            ]
        )
    print(table(rows))


# ---------------------------------------------------------------------- step costs


def step_seconds(runner: Any, positions: int, context: int, repeats: int) -> float:
    """One forward of ``positions`` new tokens after ``context`` cached ones, one row (and
    the spare slot the engine's caches keep: on a GPU the step replays a CUDA graph)."""
    cache = runner.new_cache(2, context + positions, context + positions)
    runner.forward(cache, 0, [[1] * context], [0], decode=False)
    tokens = [[2] * positions]
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    for _ in range(3):
        runner.forward(cache, 0, tokens, [context], decode=True)
    sync()
    started = time.perf_counter()
    for _ in range(repeats):
        runner.forward(cache, 0, tokens, [context], decode=True)
    sync()
    return (time.perf_counter() - started) / repeats


def print_step_costs(engine: LLMEngine, context: int, repeats: int) -> None:
    target = engine.backend.runner  # type: ignore[attr-defined]
    assert engine.drafter is not None
    one = step_seconds(target, 1, context, repeats)
    draft_step = step_seconds(engine.drafter.runner, 1, context, repeats)
    print(
        f"target step {one * 1e3:.2f} ms; draft step {draft_step * 1e3:.2f} ms "
        f"({draft_step / one:.2f} target steps); {context} tokens of context"
    )
    rows = [["k", "check k+1 (target steps)"] + [f"tok/s x at a={a}" for a in ACCEPTANCES]]
    for k in (1, 2, 3, 4, 6, 8):
        check = step_seconds(target, k + 1, context, repeats) / one
        cost = check + k * draft_step / one
        gains = [(1 - a ** (k + 1)) / (1 - a) / cost for a in ACCEPTANCES]
        rows.append([str(k), f"{check:.2f}"] + [f"{g:.2f}" for g in gains])
    print(table(rows))


# ---------------------------------------------------------------------- main


def stdlib_prompts(loaded: LoadedModel, count: int) -> list[list[int]]:
    from bench.fim_cases import stdlib_lines
    from serve_app.prompts.fim import build_fim_prompt, fim_format_for

    fmt = fim_format_for(loaded.tokenizer, loaded.model_type)
    return [
        build_fim_prompt(fmt, loaded.tokenizer, prefix, suffix)
        for prefix, suffix, _ in stdlib_lines(count)
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default="embedded:qwen2.5-coder-1.5b")
    parser.add_argument("--draft", default="embedded:qwen2.5-coder-0.5b")
    parser.add_argument("--random", default=None, help="T:D shapes of bench.gpu (random weights)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cases", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--smoke", action="store_true", help="the tiny model, seconds")
    args = parser.parse_args(argv)
    modes = args.modes.split(",")
    torch.set_num_threads(args.threads)
    if args.smoke:
        args.target = args.draft = "tiny"
        args.cases, args.tokens = 2, 8
    if args.random:
        from bench.gpu import device_name, loaded_model, prompt

        shape_t, shape_d = args.random.split(":")
        target = loaded_model(shape_t, args.device, torch.bfloat16)
        draft = loaded_model(shape_d, args.device, torch.bfloat16)
        # Prompt ids every model can read (the 7B has 128 more rows than the 0.5B): an id the
        # draft lacks would turn drafting off for that request.
        vocab = min(int(m.model.config.vocab_size) for m in (target, draft))
        prompts = [prompt(512, vocab, seed) for seed in range(args.cases)]
        where = device_name(args.device)
    else:
        target = load_model(args.target, device=args.device, threads=args.threads)
        draft = load_model(args.draft, device=args.device, threads=args.threads)
        prompts = stdlib_prompts(target, args.cases)
        where = f"{args.device}, {args.threads} thread(s)"
    print(
        f"target {args.random or args.target}, draft {args.draft if not args.random else ''}"
        f"on {where}; {len(prompts)} prompts, {args.tokens} tokens each, greedy"
    )
    results = compare(target, draft, prompts, args.tokens, args.device, modes)
    print_modes(results)
    engine = engine_for(target, draft, "draft", args.device)
    try:
        print_step_costs(engine, 512, 10 if args.smoke else 50)
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
