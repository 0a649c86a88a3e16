"""FIM benchmark against a running service, with a naive baseline measured in the same run.

    make run                      # in one terminal (or serve run configs/local.yaml)
    .venv/bin/python bench/fim.py --key $SERVE_APP_API_KEY

Service figures: single-stream decode tok/s and time to first token (TTFT), medians of five
requests one after the other (``SINGLE_TAILS``); aggregate tok/s of
4 and 8 concurrent streams (64 tokens each); TTFT of a 1,500-token prompt cold, then of the same
prompt with a new last line (its prefix cached). Every prompt carries a per-run salt, so "cold"
is cold against a server that has run this benchmark before.
Baseline: the same prompts through ``model.generate`` one request at a time in this process,
with the same number of torch threads as the service's FIM replica (--threads);
``--no-baseline`` skips it (and loads only the tokenizer).

llama.cpp: with ``--llama-url`` the same workload also goes to a running ``llama-server`` on
the embedded model's own GGUF with the same threads (``/work/shared/tools/build-llama-server``
builds it; e.g. ``llama-server -m model.gguf -t 1 -c 32768 -np 8 --port 8090``), and the table
gets its column and the service / llama.cpp ratios (for times, below 1 is better; for tok/s,
above). docs/benchmarks.md has the whole side-by-side recipe.
"""

from __future__ import annotations

import asyncio
import json
import statistics
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
        # A fresh connection per request: llama-server drops a kept-alive connection after
        # a stream, and aiohttp's next request on it fails with "Cannot write request body".
        headers = {"Connection": "close"}
        async with http.post(f"{url.rstrip('/')}/infill", json=body, headers=headers) as response:
            response.raise_for_status()
            async for raw in response.content:
                line = raw.decode().strip()
                if not line.startswith("data: "):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("content") and ttft is None:
                    ttft = time.perf_counter() - start
                if chunk.get("stop"):
                    # timings.cache_n: prompt tokens reused from the slot's cache
                    tokens = chunk.get("tokens_predicted", tokens)
                    cached = chunk.get("timings", {}).get("cache_n", 0)
        total = time.perf_counter() - start
        return StreamResult(ttft if ttft is not None else total, total, tokens, cached)

    return stream


# Row labels in print order: the engine issue's table. Times (s): lower is better; tok/s: higher.
ROWS = {
    "ttft_s": "time to first token, short prompt (s, median of 5)",
    "decode_tok_s": "single stream, 64 tokens, decode (tok/s, median of 5)",
    "agg_tok_s_c4": "4 concurrent streams, 64 tokens each, aggregate (tok/s)",
    "agg_tok_s_c8": "8 concurrent streams, 64 tokens each, aggregate (tok/s)",
    "ttft_long_cold_s": "time to first token, {long}-token prompt, cold (s)",
    "ttft_long_warm_s": "same prompt with a new last line, prefix cached (s)",
    "warm_cached_tokens": "prompt tokens reported cached in that request",
}


# What a single stream completes, one request each: one request's speed depends on its text
# (how often its continuation repeats the prompt, with speculation on), so the figure is the
# median of five.
SINGLE_TAILS = ("    ", "    return ", "\n\ndef ", "\n\nclass ", "\n\nif ")


def long_prompts(tokenizer, tokens: int, salt: str) -> tuple[str, str]:
    """A cold prompt of ``tokens`` tokens and the same prompt with one new last line: what an
    editor sends after the user types a line at the end of a long file."""
    cold = long_prefix(tokenizer, tokens, salt)
    cut = cold.rfind("\n") + 1  # end on a complete line, then type a new one
    return cold[:cut], cold[:cut] + f"result_{salt} = helper_{salt}_0(42)\n"


async def server_figures(
    key: str | None, stream: Stream, tokenizer, long_tokens: int, salt: str
) -> dict[str, float]:
    """The FIM workload against one server: the same requests for the service and llama.cpp.
    ``salt`` makes every prompt new to the server, so "cold" is cold on a warm server too."""
    figures: dict[str, float] = {}
    code = f"# run {salt}\n" + CODE
    async with session(key) as http:
        await stream(http, code, 4)  # warm-up
        singles = [await stream(http, code + tail, 64) for tail in SINGLE_TAILS]
        figures["ttft_s"] = statistics.median(r.ttft_s for r in singles)
        figures["decode_tok_s"] = statistics.median(
            (r.completion_tokens - 1) / (r.total_s - r.ttft_s) for r in singles
        )
        for concurrency in (4, 8):
            prefixes = [f"# request {i}\n" + code for i in range(concurrency)]
            start = time.perf_counter()
            results = await asyncio.gather(*(stream(http, p, 64) for p in prefixes))
            wall = time.perf_counter() - start
            figures[f"agg_tok_s_c{concurrency}"] = sum(r.completion_tokens for r in results) / wall
        cold_prompt, warm_prompt = long_prompts(tokenizer, long_tokens, salt)
        figures["ttft_long_cold_s"] = (await stream(http, cold_prompt, 1)).ttft_s
        warm = await stream(http, warm_prompt, 1)
        figures["ttft_long_warm_s"] = warm.ttft_s
        figures["warm_cached_tokens"] = warm.cached_tokens
    return figures


def baseline_figures(args, loaded, salt: str) -> dict[str, float]:
    """Naive serving: one ``model.generate`` call per request, requests one after another."""
    import torch

    from serve_app.prompts.fim import build_fim_prompt, fim_format_for

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
    code = f"# run {salt}\n" + CODE
    generate(code, 4)
    first, _ = generate(code + "    ", 1)
    total, produced = generate(code + "    ", 64)
    figures["ttft_s"] = first
    figures["decode_tok_s"] = (produced - 1) / max(total - first, 1e-9)
    for concurrency in (4, 8):
        start = time.perf_counter()
        produced = sum(generate(f"# request {i}\n" + code, 64)[1] for i in range(concurrency))
        figures[f"agg_tok_s_c{concurrency}"] = produced / (time.perf_counter() - start)
    cold_prompt, _ = long_prompts(loaded.tokenizer, args.long_tokens, salt)
    figures["ttft_long_cold_s"] = generate(cold_prompt, 1)[0]
    figures["ttft_long_warm_s"] = figures["ttft_long_cold_s"]  # no cache: same cost again
    figures["warm_cached_tokens"] = 0
    return figures


def ratio(ours: float, theirs: float) -> str:
    return f"{ours / theirs:.2f}x" if theirs else "-"


def main() -> None:
    parser = base_parser(__doc__, "fim")
    parser.add_argument("--threads", type=int, default=1, help="baseline torch threads")
    parser.add_argument("--source", default="embedded:qwen2.5-coder-0.5b")
    parser.add_argument(
        "--llama-url",
        help="a running llama-server on the same GGUF and thread count (e.g. "
        "http://127.0.0.1:8080): adds its column and the ratios, measured in this run",
    )
    parser.add_argument("--no-baseline", action="store_true", help="skip the naive baseline")
    parser.add_argument(
        "--long-tokens",
        type=int,
        default=1500,
        help="the long prompt's size; llama-server's /infill keeps at most 3/4 of its batch "
        "(1,536 tokens by default) of a prefix, so stay below that",
    )
    args = parser.parse_args()
    salt = f"{time.time_ns() % 10**9:09d}"

    if args.no_baseline:  # the tokenizer alone: no 2.5 GB of fp32 weights in this process
        from transformers import AutoTokenizer

        from serve_app.models.loader import resolve_source

        loaded, tokenizer = None, AutoTokenizer.from_pretrained(resolve_source(args.source))
    else:
        from serve_app.models.loader import load_model

        loaded = load_model(args.source, threads=args.threads)
        tokenizer = loaded.tokenizer

    def figures(key: str | None, stream: Stream) -> dict[str, float]:
        return asyncio.run(server_figures(key, stream, tokenizer, args.long_tokens, salt))

    columns = {"service": figures(args.key, service_stream(args))}
    if args.llama_url:
        columns["llama.cpp"] = figures(None, llama_stream(args.llama_url))
    if loaded is not None:
        columns["naive baseline"] = baseline_figures(args, loaded, salt)
    others = [name for name in columns if name != "service"]
    rows = [["metric", *columns, *(f"service / {name}" for name in others)]]
    service = columns["service"]
    for metric, label in ROWS.items():
        rows.append(
            [
                label.format(long=f"{args.long_tokens:,}"),
                *(f"{c[metric]:.2f}" for c in columns.values()),
                *(ratio(service[metric], columns[name][metric]) for name in others),
            ]
        )
    print(table(rows))


if __name__ == "__main__":
    main()
