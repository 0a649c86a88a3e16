"""Shared bits of the benchmarks: a bounded HTTP client against a running service."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

DEFAULT_URL = "http://127.0.0.1:8000"
ROOT = Path(__file__).resolve().parents[1]
LOCAL_CONFIG = "configs/local.yaml"

# The vector extensions that decide which kernels the engine picks (weights.py, threads.py).
KERNEL_FLAGS = (
    "avx", "avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni",
    "amx_bf16", "amx_tile",
)  # fmt: skip


def cpu_flags() -> str:
    """The CPU a benchmark ran on, as every benchmark prints it: model name, CPU count and
    each kernel-deciding flag present or ``no-`` (``lscpu``'s flags, read from /proc)."""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"{platform.processor() or platform.machine()}; {os.cpu_count()} CPUs"
    name = next((line.split(":", 1)[1].strip() for line in info if "model name" in line), "?")
    flags = next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), [])
    shown = " ".join(flag if flag in flags else f"no-{flag}" for flag in KERNEL_FLAGS)
    return f"{name}; {os.cpu_count()} CPUs; {shown}"


def base_parser(description: str, role: str) -> argparse.ArgumentParser:
    """The options of a benchmark against a running service whose requests go to ``role``'s
    deployment (``fim``, ``edit`` or ``decisions``)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--url", default=os.environ.get("SERVE_APP_URL", DEFAULT_URL))
    parser.add_argument("--key", default=os.environ.get("SERVE_APP_API_KEY"))
    parser.add_argument(
        "--model", default=local_role_model(role), help=f"default: {LOCAL_CONFIG}'s {role} model"
    )
    return parser


def local_role_model(role: str) -> str:
    """The model ``configs/local.yaml`` (what ``make run`` serves) names for ``role``."""
    from serve_app.config import serve_file_configs

    (config,) = serve_file_configs(ROOT / LOCAL_CONFIG)
    return getattr(config.roles, role)


@dataclass
class StreamResult:
    ttft_s: float
    total_s: float
    completion_tokens: int
    cached_tokens: int = 0
    text: str = ""
    events: list[str] = field(default_factory=list)


async def stream_fim(session: aiohttp.ClientSession, url: str, body: dict) -> StreamResult:
    """One streamed FIM request: time to first content byte, total time, usage."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    ttft = None
    usage: dict = {}
    text = []
    async with session.post(f"{url}/v1/fim/completions", json=body) as response:
        response.raise_for_status()
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices", []):
                if choice["text"] and ttft is None:
                    ttft = time.perf_counter() - start
                text.append(choice["text"])
    total = time.perf_counter() - start
    return StreamResult(
        ttft_s=ttft if ttft is not None else total,
        total_s=total,
        completion_tokens=usage.get("completion_tokens", 0),
        cached_tokens=usage.get("cached_input_tokens", 0),
        text="".join(text),
    )


def session(key: str | None, timeout_s: float = 600) -> aiohttp.ClientSession:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=timeout_s))


def percentile(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def table(rows: list[list[str]]) -> str:
    """A Markdown table (first row is the header), ready to paste into README.md."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join([line(rows[0]), line(["-" * w for w in widths])] + [line(r) for r in rows[1:]])
