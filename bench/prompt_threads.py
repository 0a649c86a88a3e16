"""Does reading prompts on more threads than decoding pay? ``prompt_threads`` 1 vs N.

    OMP_WAIT_POLICY=PASSIVE python -m bench.prompt_threads --threads 1 --prompt-threads 2

Two engines over one loaded embedded model (engine options as ``configs/local.yaml`` runs
them, ``torch_threads`` ``--threads``), one reading prompts on ``--threads`` and one on
``--prompt-threads``, take the same requests in alternating order, so a neighbour's load hits
both alike:

- cold: a ~1,500-token FIM prompt, time to first token (the whole prompt read);
- new line: the same prompt with one new last line (the prefix cache holds the rest);
- decode: 64 greedy tokens after a short prompt, tok/s after the first token (decode steps
  run on ``--threads`` in both engines: this row shows the switch costs them nothing).

Each prompt is new to both engines (a per-round salt). Prints the medians per engine and the
ratio baseline / candidate. Set OMP_WAIT_POLICY=PASSIVE as configs/local.yaml does: it is
what makes a second thread cost a decode step more than it saves.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import time
import uuid

from bench.common import cpu_flags
from bench.fim import CODE, long_prompts
from serve_app.engine.engine import LLMEngine
from serve_app.engine.protocol import GenerationRequest, SamplingParams
from serve_app.engine_config import EngineConfig
from serve_app.models.loader import load_model
from serve_app.prompts.fim import build_fim_prompt, fim_format_for

DECODE_TOKENS = 64


async def timed(engine: LLMEngine, prompt: list[int], max_tokens: int) -> tuple[float, float]:
    """Seconds to the first streamed chunk, and tok/s of the tokens after it."""
    params = SamplingParams(max_tokens=max_tokens)
    request = GenerationRequest(uuid.uuid4().hex, prompt, params, "bench")
    started = time.perf_counter()
    first, tokens = None, 0
    async for chunk in engine.generate(request):
        first = first or time.perf_counter()
        tokens = chunk.completion_tokens or tokens
    assert first is not None
    return first - started, (tokens - 1) / max(time.perf_counter() - first, 1e-9)


async def run(args: argparse.Namespace) -> None:
    # eos ignored: every decode makes exactly DECODE_TOKENS tokens
    loaded = dataclasses.replace(load_model(args.source, threads=args.threads), eos_token_ids=[])
    tokenizer = loaded.tokenizer
    fmt = fim_format_for(tokenizer, loaded.model_type)

    def fim(prefix: str) -> list[int]:
        return build_fim_prompt(fmt, tokenizer, prefix, "\n")

    counts = (args.threads, args.prompt_threads)
    engines = {}
    for count in counts:  # each engine's loop reads its thread count before the next starts
        engines[count] = LLMEngine(
            loaded, EngineConfig(torch_threads=args.threads, prompt_threads=count)
        )
        await timed(engines[count], fim(CODE), 2)
    cases = ("cold", "new line", "decode")
    figures: dict[int, dict[str, list[float]]] = {n: {c: [] for c in cases} for n in counts}
    for round_ in range(args.rounds):
        for count in counts if round_ % 2 == 0 else counts[::-1]:
            engine, salt = engines[count], uuid.uuid4().hex[:8]
            cold, warm = long_prompts(tokenizer, args.long_tokens, salt)
            figures[count]["cold"].append((await timed(engine, fim(cold), 1))[0])
            figures[count]["new line"].append((await timed(engine, fim(warm), 1))[0])
            short = fim(f"# run {salt}\n" + CODE)
            figures[count]["decode"].append((await timed(engine, short, DECODE_TOKENS))[1])
    for engine in engines.values():
        engine.shutdown()
    report(args, figures)


def report(args: argparse.Namespace, figures: dict[int, dict[str, list[float]]]) -> None:
    base, candidate = args.threads, args.prompt_threads
    print(f"model {args.source}; torch_threads {base}; {args.rounds} rounds, medians")
    print(f"CPU: {cpu_flags()}; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'unset')}")
    print(f"| case | prompt_threads {base} | prompt_threads {candidate} | speed-up |")
    print("| --- | --- | --- | --- |")
    for case, label, unit in (
        ("cold", f"first token, {args.long_tokens}-token prompt, cold", "s"),
        ("new line", "first token, the same prompt + a new line", "s"),
        ("decode", f"decode, {DECODE_TOKENS} tokens", "tok/s"),
    ):
        one = statistics.median(figures[base][case])
        other = statistics.median(figures[candidate][case])
        ratio = other / one if unit == "tok/s" else one / other
        print(f"| {label} | {one:.2f} {unit} | {other:.2f} {unit} | {ratio:.2f}x |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="embedded:qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompt-threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--long-tokens", type=int, default=1500)
    args = parser.parse_args()
    if args.prompt_threads == args.threads:
        parser.error("--prompt-threads must differ from --threads")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
