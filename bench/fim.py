"""FIM benchmark against a running service, with a naive baseline measured in the same run.

    make run                      # in one terminal (or serve run configs/local.yaml)
    .venv/bin/python bench/fim.py --key $SERVE_APP_API_KEY

Service figures: single-stream decode tok/s and time to first token (TTFT); aggregate tok/s at
concurrency 1, 4, 8; TTFT of a 1,000-token prompt cold and with a 900-token cached prefix.
Baseline: the same prompts through ``model.generate`` one request at a time in this process,
with the same number of torch threads as the service's FIM replica (--threads).

llama.cpp: with ``--llama-url`` the same workload also goes to a running ``llama-server`` on
the embedded model's own GGUF with the same threads (``/work/shared/tools/build-llama-server``
builds it; e.g. ``llama-server -m model.gguf -t 1 -np 8 --port 8080``), and the table gets its
column and the service / llama.cpp ratios (for times, below 1 is better; for tok/s, above).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable

import aiohttp

from bench.common import StreamResult, base_parser, session, stream_fim, table

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


Stream = Callable[[aiohttp.ClientSession, str, int], Awaitable[StreamResult]]


def service_stream(args) -> Stream:
    """One FIM request to this service (``/v1/fim/completions``)."""

    def stream(http: aiohttp.ClientSession, prefix: str, max_tokens: int):
        return stream_fim(http, args.url, fim_body(args.model, prefix, max_tokens))

    return stream


def llama_stream(url: str) -> Stream:
    """The same request to llama.cpp's ``llama-server`` (``/infill``): greedy, exactly
    ``max_tokens`` tokens (eos ignored), its prompt cache on (its default)."""

    async def stream(http: aiohttp.ClientSession, prefix: str, max_tokens: int) -> StreamResult:
        body = {
            "input_prefix": prefix,
            "input_suffix": "\n",
            "n_predict": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "cache_prompt": True,
            "stream": True,
        }
        start = time.perf_counter()
        ttft, tokens, cached = None, 0, 0
        async with http.post(f"{url.rstrip('/')}/infill", json=body) as response:
            response.raise_for_status()
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("content") and ttft is None:
                    ttft = time.perf_counter() - start
                if chunk.get("stop"):
                    tokens = chunk.get("tokens_predicted", tokens)
                    cached = chunk.get("tokens_cached", 0) - tokens
        total = time.perf_counter() - start
        return StreamResult(ttft if ttft is not None else total, total, tokens, max(cached, 0))

    return stream


async def server_figures(key: str | None, stream: Stream, tokenizer) -> dict[str, float]:
    """The FIM workload against one server: the same requests for the service and llama.cpp."""
    figures: dict[str, float] = {}
    async with session(key) as http:
        await stream(http, CODE, 4)  # warm-up
        single = await stream(http, CODE + "    ", 64)
        figures["ttft_s"] = single.ttft_s
        figures["decode_tok_s"] = (single.completion_tokens - 1) / (single.total_s - single.ttft_s)
        for concurrency in (1, 4, 8):
            prefixes = [f"# request {i}\n" + CODE for i in range(concurrency)]
            start = time.perf_counter()
            results = await asyncio.gather(*(stream(http, p, 32) for p in prefixes))
            wall = time.perf_counter() - start
            figures[f"agg_tok_s_c{concurrency}"] = sum(r.completion_tokens for r in results) / wall
        cold_prefix = long_prefix(tokenizer, 1000, "cold")
        cold = await stream(http, cold_prefix, 1)
        figures["ttft_1000_cold_s"] = cold.ttft_s
        warm_prefix = tokenizer.decode(tokenizer.encode(cold_prefix)[:900]) + long_prefix(
            tokenizer, 100, "warm"
        )
        warm = await stream(http, warm_prefix, 1)
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
    parser.add_argument(
        "--llama-url",
        help="a running llama-server on the same GGUF and thread count (e.g. "
        "http://127.0.0.1:8080): adds its column and the ratios, measured in this run",
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip the naive baseline")
    args = parser.parse_args()

    from serve_app.engine.loader import load_model

    loaded = load_model(args.source, threads=args.threads)
    columns = {
        "service": asyncio.run(server_figures(args.key, service_stream(args), loaded.tokenizer))
    }
    if args.llama_url:
        columns["llama.cpp"] = asyncio.run(
            server_figures(None, llama_stream(args.llama_url), loaded.tokenizer)
        )
    if not args.no_baseline:
        columns["naive baseline"] = baseline_figures(args, loaded)
    others = [name for name in columns if name != "service"]
    rows = [["metric", *columns, *(f"service / {name}" for name in others)]]
    service = columns["service"]
    for metric in service:
        ratios = [
            f"{service[metric] / columns[name][metric]:.2f}x" if columns[name][metric] else "-"
            for name in others
        ]
        rows.append([metric, *(f"{c[metric]:.2f}" for c in columns.values()), *ratios])
    print(table(rows))


if __name__ == "__main__":
    main()
