"""One model replica's memory and start time per 8-bit kernel, each in a fresh process.

    python -m bench.replica_memory [--config configs/local.yaml] [--role fim]
        [--kernels fbgemm,q8]

For each ``engine.int8_kernel`` of ``--kernels``, a fresh process first prepares the role's
weight files (as ``make run``'s ``serve_app.prepare weights`` step does), then another fresh
process starts the role's engine as a replica does (``LLMEngine.from_config`` on the Serve
config's first application: its model and engine settings for the role), reads one chat turn
holding ~500 tokens of a standard-library file (a prompt opening with a special token, as every
service's prompt does) and decodes up to 16 tokens after it, and reports its start seconds,
peak RSS, and PSS and RSS after the request. PSS splits a page shared with other processes
among them (the weight files every replica maps); RSS counts it whole. ``bench.memory``
measures a whole running graph the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

from bench.common import cpu_flags, table

PROMPT_FILE = "csv.py"


def child(config_path: str, role: str, kernel: str, prepare_only: bool) -> dict:
    from serve_app.config import serve_file_configs
    from serve_app.engine.engine import LLMEngine
    from serve_app.engine.protocol import GenerationRequest, SamplingParams, generate_text

    config = serve_file_configs(config_path)[0]
    engine_settings = config.engine.model_copy(update={"int8_kernel": kernel})
    config = config.model_copy(update={"engine": engine_settings})
    started = time.perf_counter()
    engine = LLMEngine.from_config(config, role)
    took = time.perf_counter() - started
    if prepare_only:
        engine.shutdown()
        return {}
    text = (Path(sysconfig.get_paths()["stdlib"]) / PROMPT_FILE).read_text()[:2000]
    turn = [{"role": "user", "content": text}]
    chat = engine.tokenizer.apply_chat_template(turn, add_generation_prompt=True, tokenize=False)
    ids = engine.tokenizer.encode(chat, add_special_tokens=False)
    params = SamplingParams(max_tokens=16)
    request = GenerationRequest("memory", ids, params, "bench-memory", role)
    asyncio.run(generate_text(engine, request))
    rollup = {
        line.split(":")[0]: int(line.split()[1])
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]
    }
    engine.shutdown()
    gib = 1024 * 1024
    return {
        "start_s": took,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / gib,
        "pss_gib": rollup["Pss"] / gib,
        "rss_gib": rollup["Rss"] / gib,
    }


def measure(config_path: str, role: str, kernel: str, prepare_only: bool = False) -> dict:
    command = [sys.executable, "-m", "bench.replica_memory", "--child", config_path, role, kernel]
    if prepare_only:
        command.append("--prepare-only")
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="configs/local.yaml", help="a Serve config file")
    parser.add_argument("--role", default="fim", choices=("fim", "edit", "decisions"))
    parser.add_argument("--kernels", default="fbgemm,q8", help="engine.int8_kernel values")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)  # CONFIG ROLE KERNEL
    parser.add_argument("--prepare-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(*args.child, args.prepare_only)))
        return
    print(f"CPU: {cpu_flags()}")
    rows = [["int8_kernel", "start s", "peak RSS GiB", "PSS GiB", "RSS GiB", "PSS x first"]]
    first = None
    for kernel in args.kernels.split(","):
        measure(args.config, args.role, kernel, prepare_only=True)
        got = measure(args.config, args.role, kernel)
        first = first or got
        rows.append([
            kernel, f"{got['start_s']:.1f}", f"{got['peak_rss_gib']:.2f}",
            f"{got['pss_gib']:.2f}", f"{got['rss_gib']:.2f}",
            f"{got['pss_gib'] / first['pss_gib']:.2f}",
        ])  # fmt: skip
    print(f"{args.role} replica of {args.config}, one fresh process per row")
    print(table(rows))


if __name__ == "__main__":
    main()
