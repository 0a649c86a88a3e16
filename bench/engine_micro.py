"""Engine micro-benchmark: one request's decode speed, and what batching buys.

Runs, on one ``LLMEngine`` per backend (``--backends``: the HF model, the runner with dense, q4,
int4 or int8 decode weights), all in one process and one run: a single request (time to first
token, decode tok/s), then the same N requests one after another and all at once (aggregate tok/s),
and prints each backend's ratios to the first one and concurrent / sequential. eos is ignored
(unless ``--respect-eos``) so every request makes exactly ``--max-tokens`` tokens and the runs
compare like for like; the prefix cache is off so the repeated chat template is read every
time.

    python -m bench.engine_micro --threads 1 --concurrency 8 --backends hf,dense,int4
    python -m bench.engine_micro --threads 1 --step-rows 1,8     # one decode step, interleaved
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time

from serve_app.engine.engine import LLMEngine
from serve_app.engine.protocol import GenerationRequest, SamplingParams
from serve_app.engine_config import NO_SPECULATION, EngineConfig
from serve_app.models.loader import load_model

QUESTIONS = [
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain what a Python generator is, with a short example.",
    "Write a SQL query returning the ten most recent orders per customer.",
    "How do I read a JSON file into a dict in Python?",
    "Write a bash one-liner that counts lines in all .py files.",
    "What is the difference between a list and a tuple in Python?",
    "Write a function that merges two sorted lists.",
    "Show how to use asyncio.gather with three coroutines.",
]


@dataclasses.dataclass
class Run:
    tokens: int
    seconds: float
    ttft: float = 0.0
    decode_tps: float = 0.0

    @property
    def tps(self) -> float:
        return self.tokens / self.seconds


async def one(engine: LLMEngine, rid: str, prompt: list[int], max_tokens: int) -> Run:
    params = SamplingParams(max_tokens=max_tokens)
    start = time.perf_counter()
    first = last = None
    tokens = 0
    async for chunk in engine.generate(GenerationRequest(rid, prompt, params, "bench")):
        now = time.perf_counter()
        first = first or now
        last = now
        tokens = chunk.completion_tokens
    decode = (tokens - 1) / (last - first) if tokens > 1 and last > first else 0.0
    return Run(tokens, last - start, ttft=first - start, decode_tps=decode)


async def sequential_round(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> Run:
    start = time.perf_counter()
    runs = [await one(engine, f"seq{i}", p, max_tokens) for i, p in enumerate(prompts)]
    return Run(sum(r.tokens for r in runs), time.perf_counter() - start)


async def concurrent_round(engine: LLMEngine, prompts: list[list[int]], max_tokens: int) -> Run:
    start = time.perf_counter()
    coros = (one(engine, f"con{i}", p, max_tokens) for i, p in enumerate(prompts))
    runs = await asyncio.gather(*coros)
    return Run(sum(r.tokens for r in runs), time.perf_counter() - start)


def median(runs: list[Run]) -> Run:
    return sorted(runs, key=lambda r: r.tps)[len(runs) // 2]


async def bench(
    engine: LLMEngine, prompts: list[list[int]], max_tokens: int, repeats: int, sequential: bool
) -> dict[str, Run]:
    """Rounds alternate sequential/concurrent so a noisy neighbour hits both; medians win."""
    await one(engine, "warmup", prompts[0], 4)
    single = await one(engine, "single", prompts[0], max_tokens)
    seq, con = [], []
    for _ in range(repeats):
        if sequential:
            seq.append(await sequential_round(engine, prompts, max_tokens))
        con.append(await concurrent_round(engine, prompts, max_tokens))
    runs = {"single": single, "concurrent": median(con)}
    return {**runs, "sequential": median(seq)} if seq else runs


BACKENDS = {
    "hf": {"runner": "hf"},
    "dense": {"runner": "auto", "weights": "dense"},
    "int4": {"runner": "auto", "weights": "int4"},
    "int8": {"runner": "auto", "weights": "int8"},
    "q4": {"runner": "auto", "weights": "q4"},
}


def step_times(loaded, rows_list: list[int], context: int = 50, rounds: int = 6) -> None:
    """One decode step's forward alone, best of ``rounds``, the three backends interleaved so a
    noisy neighbour hits each alike: HF model + DynamicCache vs the runner, dense and int4."""
    import torch
    from transformers import DynamicCache

    from serve_app.runner.builder import build_runner

    model = loaded.model
    dense = build_runner(model, weights="dense")
    int4 = build_runner(model, weights="int4", cache_dir=loaded.location)
    cache = dense.new_cache(max(rows_list) + 1, 256, loaded.max_position_embeddings)
    ids = list(range(1000, 1000 + context))
    with torch.inference_mode():
        for rows in rows_list:
            for slot in range(rows):
                dense.forward(cache, slot, [ids], [0], decode=False)
            hf_cache = DynamicCache()
            model(input_ids=torch.tensor([ids] * rows), past_key_values=hf_cache, use_cache=True)
            steps = {
                "hf": lambda r=rows, c=hf_cache: model(
                    input_ids=torch.tensor([[7]] * r),
                    position_ids=torch.tensor([[context]] * r),
                    past_key_values=c,
                    use_cache=True,
                    logits_to_keep=1,
                ),
                "dense": lambda r=rows: dense.forward(
                    cache, 0, [[7]] * r, [context] * r, decode=True
                ),
                "int4": lambda r=rows: int4.forward(
                    cache, 0, [[7]] * r, [context] * r, decode=True
                ),
            }
            best = dict.fromkeys(steps, float("inf"))
            for _ in range(rounds):
                for name, step in steps.items():
                    start = time.perf_counter()
                    step()
                    best[name] = min(best[name], time.perf_counter() - start)
            cells = ", ".join(
                f"{name} {best[name] * 1000:.0f} ms ({best['hf'] / best[name]:.2f}x)"
                for name in steps
            )
            print(f"decode step, {rows} row(s), {context} cached: {cells}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="embedded:qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1, help="rounds; medians reported")
    parser.add_argument("--respect-eos", action="store_true")
    parser.add_argument("--sequential", action="store_true", help="also run requests one by one")
    parser.add_argument(
        "--step-rows",
        help="instead: time one decode step's forward at these batch sizes (e.g. 1,8)",
    )
    parser.add_argument(
        "--backends",
        default="hf,int4",
        help=f"comma-separated, measured in this order in one run: {', '.join(BACKENDS)}",
    )
    args = parser.parse_args()

    t0 = time.perf_counter()
    loaded = load_model(args.source, dtype=args.dtype, threads=args.threads)
    load_s = time.perf_counter() - t0
    if args.step_rows:
        step_times(loaded, [int(r) for r in args.step_rows.split(",")])
        return
    if not args.respect_eos:
        loaded = dataclasses.replace(loaded, eos_token_ids=[])
    tok = loaded.tokenizer
    prompts = [
        tok.encode(
            tok.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False
            )
        )
        for q in QUESTIONS[: args.concurrency]
    ]
    results: dict[str, dict[str, Run]] = {}
    for name in args.backends.split(","):
        config = EngineConfig(
            max_batch_size=max(8, args.concurrency),
            prefix_cache_mb=0,
            speculation=NO_SPECULATION,
            **BACKENDS[name],
        )
        t1 = time.perf_counter()
        engine = LLMEngine(loaded, config)
        print(f"{name}: engine ready in {time.perf_counter() - t1:.1f}s", flush=True)
        try:
            results[name] = asyncio.run(
                bench(engine, prompts, args.max_tokens, args.repeats, args.sequential)
            )
        finally:
            engine.shutdown()
    report(args, loaded, load_s, prompts, results)


def report(args, loaded, load_s: float, prompts, results: dict[str, dict[str, Run]]) -> None:
    lens = [len(p) for p in prompts]
    print(f"model {args.source} ({loaded.dtype}, {args.threads} threads), loaded in {load_s:.1f}s")
    print(f"prompts {lens} tokens, max_tokens {args.max_tokens}, concurrency {args.concurrency}")
    head = f"{'backend':<8}{'run':<12}{'tokens':>8}{'seconds':>10}{'tok/s':>9}"
    print(f"{head}{'ttft s':>9}{'decode tok/s':>14}")
    for backend, runs in results.items():
        for name, r in runs.items():
            extra = f"{r.ttft:>9.2f}{r.decode_tps:>14.1f}" if name == "single" else ""
            row = f"{backend:<8}{name:<12}{r.tokens:>8}{r.seconds:>10.2f}{r.tps:>9.1f}"
            print(f"{row}{extra}")
    base_name, base = next(iter(results.items()))
    for backend, runs in results.items():
        single = runs["single"].decode_tps / base["single"].decode_tps
        many = runs["concurrent"].tps / base["concurrent"].tps
        line = (
            f"{backend} vs {base_name}: single-stream decode {single:.2f}x, "
            f"{args.concurrency}-stream aggregate {many:.2f}x"
        )
        if "sequential" in runs:
            line += (
                f"; concurrent/sequential {runs['concurrent'].tps / runs['sequential'].tps:.2f}x"
            )
        print(line)


if __name__ == "__main__":
    main()
