"""FIM benchmark against a running service, with a naive baseline measured in the same run.

    make run                      # in one terminal (or serve run configs/local.yaml)
    .venv/bin/python bench/fim.py --key $SERVE_APP_API_KEY

Service figures: single-stream decode tok/s and time to first token (TTFT); aggregate tok/s at
concurrency 1, 4, 8; TTFT of a 1,000-token prompt cold and with a 900-token cached prefix.
Baseline: the same prompts through ``model.generate`` one request at a time in this process,
with the same number of torch threads as the service's FIM replica (--threads).
"""

from __future__ import annotations

import asyncio
import time

from bench.common import base_parser, session, stream_fim, table

CODE = """import math
from dataclasses import dataclass


@dataclass
class Vector:
    x: float
    y: float

    def length(self) -> float:
        return math.hypot(self.x, self.y)

    def scaled(self, factor: float) -> "Vector":
        return Vector(self.x * factor, self.y * factor)


def dot(a: Vector, b: Vector) -> float:
"""


def fim_body(model: str, prefix: str, max_tokens: int) -> dict:
    # stop=[] so every request generates exactly max_tokens: comparable token counts.
    return {
        "model": model,
        "prompt": prefix,
        "suffix": "\n",
        "max_tokens": max_tokens,
        "temperature": 0,
        "stop": [],
        "presence_penalty": 0.0,
    }


def long_prefix(tokenizer, tokens: int, salt: str) -> str:
    """A code prefix of exactly ``tokens`` tokens, unique per ``salt``."""
    lines, i = [f"# {salt}\n"], 0
    while len(tokenizer.encode("".join(lines))) < tokens:
        lines.append(f"def helper_{salt}_{i}(value):\n    return value * {i} + {i % 7}\n\n")
        i += 1
    ids = tokenizer.encode("".join(lines))[:tokens]
    return tokenizer.decode(ids)


async def service_figures(args, tokenizer) -> dict[str, float]:
    figures: dict[str, float] = {}
    async with session(args.key) as http:
        await stream_fim(http, args.url, fim_body(args.model, CODE, 4))  # warm-up
        single = await stream_fim(http, args.url, fim_body(args.model, CODE + "    ", 64))
        figures["ttft_s"] = single.ttft_s
        figures["decode_tok_s"] = (single.completion_tokens - 1) / (single.total_s - single.ttft_s)
        for concurrency in (1, 4, 8):
            bodies = [
                fim_body(args.model, f"# request {i}\n" + CODE, 32) for i in range(concurrency)
            ]
            start = time.perf_counter()
            results = await asyncio.gather(*(stream_fim(http, args.url, b) for b in bodies))
            wall = time.perf_counter() - start
            figures[f"agg_tok_s_c{concurrency}"] = sum(r.completion_tokens for r in results) / wall
        cold_prefix = long_prefix(tokenizer, 1000, "cold")
        cold = await stream_fim(http, args.url, fim_body(args.model, cold_prefix, 1))
        figures["ttft_1000_cold_s"] = cold.ttft_s
        warm_prefix = tokenizer.decode(tokenizer.encode(cold_prefix)[:900]) + long_prefix(
            tokenizer, 100, "warm"
        )
        warm = await stream_fim(http, args.url, fim_body(args.model, warm_prefix, 1))
        figures["ttft_1000_warm_s"] = warm.ttft_s
        figures["warm_cached_tokens"] = warm.cached_tokens
    return figures


def baseline_figures(args, loaded) -> dict[str, float]:
    """Naive serving: one ``model.generate`` call per request, requests one after another."""
    import torch

    from serve_app.engine.prompts.fim import build_fim_prompt, fim_format_for

    fmt = fim_format_for(loaded.tokenizer, loaded.model_type)

    def generate(prefix: str, max_tokens: int) -> tuple[float, int]:
        ids = torch.tensor([build_fim_prompt(fmt, loaded.tokenizer, prefix, "\n")])
        start = time.perf_counter()
        with torch.inference_mode():
            out = loaded.model.generate(
                ids,
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                attention_mask=torch.ones_like(ids),
            )
        return time.perf_counter() - start, out.shape[1] - ids.shape[1]

    figures: dict[str, float] = {}
    generate(CODE, 4)
    first, _ = generate(CODE + "    ", 1)
    total, produced = generate(CODE + "    ", 64)
    figures["ttft_s"] = first
    figures["decode_tok_s"] = (produced - 1) / max(total - first, 1e-9)
    for concurrency in (1, 4, 8):
        start = time.perf_counter()
        produced = sum(generate(f"# request {i}\n" + CODE, 32)[1] for i in range(concurrency))
        figures[f"agg_tok_s_c{concurrency}"] = produced / (time.perf_counter() - start)
    cold_prefix = long_prefix(loaded.tokenizer, 1000, "cold")
    figures["ttft_1000_cold_s"] = generate(cold_prefix, 1)[0]
    figures["ttft_1000_warm_s"] = figures["ttft_1000_cold_s"]  # no cache: same cost again
    figures["warm_cached_tokens"] = 0
    return figures


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--threads", type=int, default=1, help="baseline torch threads")
    parser.add_argument("--source", default="embedded:qwen2.5-coder-0.5b")
    args = parser.parse_args()

    from serve_app.engine.loader import load_model

    loaded = load_model(args.source, threads=args.threads)
    service = asyncio.run(service_figures(args, loaded.tokenizer))
    baseline = baseline_figures(args, loaded)
    rows = [["metric", "service", "naive baseline", "service / baseline"]]
    for name in service:
        ratio = f"{service[name] / baseline[name]:.2f}x" if baseline[name] else "-"
        rows.append([name, f"{service[name]:.2f}", f"{baseline[name]:.2f}", ratio])
    print(table(rows))


if __name__ == "__main__":
    main()
