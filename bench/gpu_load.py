"""The engine under a mixed load that clients cancel, on a GPU: does every request end, and
does anything stay behind?

    python -m bench.gpu_load                      # the 1.5B's shape, 150 requests
    python -m bench.gpu_load --models 1.5b,7b --requests 300
    python -m bench.gpu_load --smoke              # the tiny config on CPU in seconds (tests)

bench.gpu's random bf16 models and stand-in tokenizer, prod.yaml's engine block (batch 32,
1,024-token chunks, an 8 GiB prefix cache, CUDA graphs, the default speculation per role).
The requests arrive over two seconds, three accounts: half are keystrokes (a prefix of the
account's 3,000-token file, then a few new tokens), a third short prompts, the rest 2k-7k
tokens; 70% greedy, the rest sampled with a seed; 1-95 tokens each; a quarter are closed by
their client after 0-19 chunks, as an IDE drops the previous request on a keystroke.

Prints per model: the wall time, how many requests raised, how many that were not closed
ended without a finish reason, what the engine still holds once it has had SETTLE_S to reap
the closed requests (running, waiting: both must be 0), prefix-cache hits, the peak GPU
memory, and how many greedy answers the same request sent alone afterwards repeats word for
word. The last is not exactness: on a GPU a step's bits depend on the batch's shape
(docs/operations.md), and random weights' top two logits lie close, so a batch of 20 can flip
a token a batch of one does not.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import torch

from bench.common import table
from bench.gpu import device_name, loaded_model, prompt
from serve_app.engine.engine import LLMEngine
from serve_app.engine.protocol import GenerationRequest, SamplingParams
from serve_app.engine_config import EngineConfig

ACCOUNTS = ("acct-a", "acct-b", "acct-c")
FILE_TOKENS = 3000
SETTLE_S = 10.0


def workload(n: int, vocab: int, seed: int) -> list[tuple[GenerationRequest, int | None, float]]:
    """(request, chunks after which its client closes it or None, delay before it is sent)."""
    rng = random.Random(seed)
    files = {a: prompt(FILE_TOKENS, vocab, 100 + i) for i, a in enumerate(ACCOUNTS)}
    out = []
    for i in range(n):
        account = rng.choice(ACCOUNTS)
        kind = rng.random()
        if kind < 0.5:
            ids = files[account][: rng.randrange(200, FILE_TOKENS)]
            ids = ids + prompt(rng.randrange(1, 40), vocab, i)
        elif kind < 0.8:
            ids = prompt(rng.randrange(1, 200), vocab, i)
        else:
            ids = prompt(rng.randrange(2000, 7000), vocab, i)
        temperature = 0.0 if rng.random() < 0.7 else 0.8
        params = SamplingParams(max_tokens=rng.randrange(1, 96), temperature=temperature, seed=i)
        route = rng.choice(["fim", "edit", "chat"])
        close_after = rng.randrange(0, 20) if rng.random() < 0.25 else None
        request = GenerationRequest(f"r{i}", ids, params, account, route=route)
        out.append((request, close_after, rng.random() * 2))
    return out


async def send(
    engine: LLMEngine, request: GenerationRequest, close_after: int | None, delay: float
) -> tuple[str | None, str]:
    """(finish reason or None, text) of one request, closed after ``close_after`` chunks."""
    await asyncio.sleep(delay)
    chunks, text, finish = 0, [], None
    stream = engine.generate(request)
    try:
        async for chunk in stream:
            chunks += 1
            text.append(chunk.text)
            finish = chunk.finish_reason
            if close_after is not None and chunks >= close_after:
                break
    finally:
        await stream.aclose()
    return finish, "".join(text)


async def load(engine: LLMEngine, jobs: list, repeats: int) -> list[str]:
    start = time.perf_counter()
    results = await asyncio.gather(*(send(engine, *job) for job in jobs), return_exceptions=True)
    wall = time.perf_counter() - start
    raised = [r for r in results if isinstance(r, BaseException)]
    for error in raised[:3]:
        print(f"  raised: {error!r}"[:300])
    unfinished = sum(
        1
        for (_, close_after, _), r in zip(jobs, results, strict=True)
        if close_after is None and not isinstance(r, BaseException) and r[0] is None
    )
    # Closed streams' aborts land at the loop's next step: what stays past SETTLE_S is a leak.
    await engine.wait_until_idle(SETTLE_S)
    stats = engine.stats()
    greedy = [
        (request, r[1])
        for (request, close_after, _), r in zip(jobs, results, strict=True)
        if close_after is None and request.params.temperature == 0.0 and isinstance(r, tuple)
    ][:repeats]
    same = 0
    for request, text in greedy:
        again = GenerationRequest(
            request.request_id + "-alone",
            request.prompt_token_ids,
            request.params,
            request.cache_salt,
            route=request.route,
        )
        same += (await send(engine, again, None, 0.0))[1] == text
    return [
        f"{wall:.1f}",
        str(len(raised)),
        str(unfinished),
        f"{stats.num_running}/{stats.num_waiting}",
        f"{stats.prefix_cache_hits}/{stats.prefix_cache_queries}",
        f"{same}/{len(greedy)}",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="1.5b", help="bench.gpu's shapes")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--requests", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=20, help="greedy answers sent again alone")
    parser.add_argument("--smoke", action="store_true", help="the tiny config on CPU, 30 requests")
    args = parser.parse_args(argv)
    if args.smoke:
        args.models, args.device, args.requests, args.repeats = "tiny", "cpu", 30, 10
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    head = ["model", "requests", "wall s", "raised", "unfinished", "left running/waiting"]
    rows = [head + ["prefix hits", "greedy alone = under load", "peak GiB"]]
    for shape in args.models.split(","):
        loaded = loaded_model(shape, args.device, dtype)
        config = EngineConfig(
            max_batch_size=32, prefill_chunk_tokens=1024, prefix_cache_mb=8192, max_waiting=256
        )
        engine = LLMEngine(loaded, config, context_length=8192)
        jobs = workload(args.requests, int(loaded.model.config.vocab_size), seed=1)
        try:
            figures = asyncio.run(load(engine, jobs, args.repeats))
        finally:
            engine.shutdown()
        peak = torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else 0
        rows.append([shape, str(args.requests), *figures, f"{peak:.1f}"])
        del loaded, engine
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    print(f"device: {device_name(args.device)}")
    print(table(rows))


if __name__ == "__main__":
    main()
