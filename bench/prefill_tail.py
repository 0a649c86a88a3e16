"""Does reading a prompt's tail on the decode weights pay? ``small_prefill_tokens`` 0 vs N.

    python -m bench.prefill_tail --threads 1 --rounds 3

Two engines over one loaded embedded model (``runner: auto``, ``weights: auto`` as
``configs/local.yaml``), one with ``small_prefill_tokens`` 0 (every prompt chunk on dense
weights) and one with ``--small`` (default 32, the config's value), take the same kinds of FIM
requests in alternating order, so a neighbour's load hits both alike:

- warm short: ``bench.fim``'s short prompt read once, then again with four more spaces (the
  prefix cache holds all but the tail: what an editor sends as the user types);
- warm long: a ~1,500-token prompt read once, then again with a new last line.

Each prompt is new to both engines (a per-round salt). Prints the median time to first token
of each case per engine and the ratio dense / small.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

from bench.fim import CODE, long_prompts
from serve_app.engine.engine import LLMEngine
from serve_app.engine.protocol import GenerationRequest, SamplingParams
from serve_app.engine_config import EngineConfig
from serve_app.models.loader import load_model
from serve_app.prompts.fim import build_fim_prompt, fim_format_for


async def first_token_s(engine: LLMEngine, prompt: list[int]) -> float:
    """Seconds to the first streamed chunk of a one-token greedy request."""
    request = GenerationRequest(uuid.uuid4().hex, prompt, SamplingParams(max_tokens=1), "bench")
    started = time.perf_counter()
    async for _ in engine.generate(request):
        return time.perf_counter() - started
    raise RuntimeError("no token")


async def run(args: argparse.Namespace) -> None:
    loaded = load_model(args.source, threads=args.threads)
    tokenizer = loaded.tokenizer
    fmt = fim_format_for(tokenizer, loaded.model_type)

    def fim(prefix: str) -> list[int]:
        return build_fim_prompt(fmt, tokenizer, prefix, "\n")

    engines = {
        small: LLMEngine(
            loaded, EngineConfig(runner="auto", weights="auto", small_prefill_tokens=small)
        )
        for small in (0, args.small)
    }
    times: dict[int, dict[str, list[float]]] = {k: {"short": [], "long": []} for k in engines}
    for _ in range(args.rounds):
        for small, engine in engines.items():
            code = f"# run {uuid.uuid4().hex[:8]}\n" + CODE
            await first_token_s(engine, fim(code))
            times[small]["short"].append(await first_token_s(engine, fim(code + "    ")))
            cold, warm = long_prompts(tokenizer, args.long_tokens, uuid.uuid4().hex[:8])
            await first_token_s(engine, fim(cold))
            times[small]["long"].append(await first_token_s(engine, fim(warm)))
    for engine in engines.values():
        engine.shutdown()
    print(f"model {args.source}, {args.threads} thread(s), {args.rounds} rounds, medians")
    print(f"| case | small_prefill_tokens 0 (ms) | {args.small} (ms) | ratio |")
    print("| --- | --- | --- | --- |")
    for case, label in (
        ("short", "warm short prompt + 4 spaces"),
        ("long", "1,500 tokens + new line"),
    ):
        dense = statistics.median(times[0][case])
        small = statistics.median(times[args.small][case])
        print(f"| {label} | {dense * 1000:.0f} | {small * 1000:.0f} | {dense / small:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="embedded:qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--small", type=int, default=32)
    parser.add_argument("--long-tokens", type=int, default=1500)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
