"""The runner's decode and prompt speed per kernel, against llama.cpp on the same GGUF, one run.

    python -m bench.decode_kernels --model qwen2.5-coder-1.5b --kernels q4:fbgemm,q4:q8 \\
        [--threads 2] [--llama-url http://127.0.0.1:8091]

A kernel is ``WEIGHTS[:INT8_KERNEL]`` (``EngineConfig.weights`` and ``int8_kernel``: the
8-bit weights prompts are read on). To measure an AVX2-only CPU's kernels on an AVX-512 one,
set ``RUNNER_KERNEL_ISA=avx2`` (the runner's C kernels), ``FBGEMM_ENABLE_INSTRUCTIONS=AVX2``
(fbgemm's) and ``ATEN_CPU_CAPABILITY=avx2`` (torch's) in the environment.

Start llama-server on the model's own GGUF (``bench/llama_side_by_side.sh`` says how to
assemble it) with one thread, as a replica decodes: ``llama-server -m MODEL.gguf -t 1 -c 4096
-np 1 --port 8091``. Then, for each of ``--prompts`` standard-library files (code no one here
wrote), its first 2,000 characters (~500 tokens) as the prompt, in this process, on
``--threads`` torch threads (1: as a replica decodes; 2: as it reads prompts):

- prompt tok/s: the runner reads the prompt cold in 256-token chunks (as the engine does);
  llama.cpp's ``/completion`` with ``cache_prompt: false`` (its own ``timings``);
- decode tok/s: 128 greedy tokens after it, one row per step (a single stream); llama.cpp's
  ``n_predict: 128``, ``ignore_eos``;
- faithfulness of the decode weights (the thing a faster kernel could cost): the file's next
  ``--tokens`` tokens fed one decode step at a time on each kernel and on the dense fp32
  weights, KL(dense || kernel) of the next-token distribution and how often the top token is
  the same. Prompts are read on the same int8 weights by every kernel but dense.

Medians over the prompts, and the median over prompts of each kernel's ratio to llama.cpp's
and to the first kernel's on the same prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sysconfig
import time
import urllib.request
from pathlib import Path

import torch

from bench.common import cpu_flags, table
from serve_app.engine_config import EngineConfig
from serve_app.models.loader import load_model
from serve_app.runner import native
from serve_app.runner.builder import configured_runner

FILES = ["csv.py", "argparse.py", "tokenize.py", "dataclasses.py", "pprint.py"]
CHUNK = 256
DECODE_TOKENS = 128


def prompt_texts(count: int) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return [(root / name).read_text()[:2000] for name in FILES[:count]]


def read_prompt(runner, cache, ids: list[int]) -> torch.Tensor:
    logits = None
    for start in range(0, len(ids), CHUNK):
        logits = runner.forward(cache, 0, [ids[start : start + CHUNK]], [start], decode=False)
    return logits


def speed(runner, ids: list[int]) -> tuple[float, float]:
    """(prompt tok/s, decode tok/s) of one cold prompt and 128 greedy tokens after it."""
    cache = runner.new_cache(1, len(ids) + DECODE_TOKENS, len(ids) + DECODE_TOKENS)
    started = time.perf_counter()
    logits = read_prompt(runner, cache, ids)
    prompt = len(ids) / (time.perf_counter() - started)
    token = int(logits[-1].argmax())
    started = time.perf_counter()
    for step in range(DECODE_TOKENS):
        logits = runner.forward(cache, 0, [[token]], [len(ids) + step], decode=True)
        token = int(logits[-1].argmax())
    return prompt, DECODE_TOKENS / (time.perf_counter() - started)


def forced_logits(runner, ids: list[int], prompt: int) -> torch.Tensor:
    """Log-probabilities after each of ``ids[prompt:]``, fed one decode step at a time."""
    cache = runner.new_cache(1, len(ids), len(ids))
    read_prompt(runner, cache, ids[:prompt])
    out = []
    for position in range(prompt, len(ids)):
        logits = runner.forward(cache, 0, [[ids[position]]], [position], decode=True)
        out.append(torch.log_softmax(logits[-1].double(), -1))
    return torch.stack(out)


def kernel_config(kernel: str) -> EngineConfig:
    weights, _, int8_kernel = kernel.partition(":")
    return EngineConfig(weights=weights, int8_kernel=int8_kernel or "auto")


def llama_rates(url: str, text: str) -> tuple[float, float]:
    body = {"prompt": text, "n_predict": DECODE_TOKENS, "temperature": 0,
            "cache_prompt": False, "ignore_eos": True}  # fmt: skip
    headers = {"Content-Type": "application/json"}
    endpoint = url.rstrip("/") + "/completion"
    request = urllib.request.Request(endpoint, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(request, timeout=600) as response:
        timings = json.load(response)["timings"]
    return timings["prompt_per_second"], timings["predicted_per_second"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument(
        "--kernels", default="int8,q4", help="WEIGHTS[:INT8_KERNEL], comma-separated"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch's intra-op threads")
    parser.add_argument("--prompts", type=int, default=5, help=f"files, at most {len(FILES)}")
    parser.add_argument("--tokens", type=int, default=64, help="forced tokens per file (KL)")
    parser.add_argument("--llama-url", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    isa = os.environ.get(native.ISA_CAP_VARIABLE, "best")
    print(f"CPU: {cpu_flags()}; torch threads {args.threads}; C kernels: {isa}; "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}")  # fmt: skip
    loaded = load_model(f"embedded:{args.model}", threads=args.threads)
    texts = prompt_texts(args.prompts)
    prompts = [loaded.tokenizer.encode(text) for text in texts]
    kernels = args.kernels.split(",")
    runners = {k: configured_runner(loaded, kernel_config(k), "bench") for k in kernels}
    dense = configured_runner(
        loaded, EngineConfig(weights="dense", prefill_dtype="float32"), "bench"
    )

    rates: dict[str, list[tuple[float, float]]] = {k: [] for k in kernels}
    if args.llama_url:
        rates["llama.cpp"] = []
    for text, ids in zip(texts, prompts, strict=True):
        for kernel in kernels:  # interleaved, so a neighbour's load hits every column alike
            rates[kernel].append(speed(runners[kernel], ids))
        if args.llama_url:
            rates["llama.cpp"].append(llama_rates(args.llama_url, text))
        print(f"  {len(ids)}-token prompt: " + ", ".join(
            f"{name} {r[-1][0]:.1f}/{r[-1][1]:.2f}" for name, r in rates.items()
        ), flush=True)  # fmt: skip

    faithful: dict[str, tuple[float, float]] = {}
    reference = [forced_logits(dense, ids, len(ids) - args.tokens) for ids in prompts]
    for kernel in kernels:
        kls, same = [], []
        for ids, ref in zip(prompts, reference, strict=True):
            got = forced_logits(runners[kernel], ids, len(ids) - args.tokens)
            kls.append(float((ref.exp() * (ref - got)).sum(-1).mean()))
            same.append(float((ref.argmax(-1) == got.argmax(-1)).double().mean()))
        faithful[kernel] = (statistics.mean(kls), statistics.mean(same))

    def ratio(name: str, base: str) -> str:  # the median of per-prompt ratios: a box whose
        # load drifts between prompts moves both columns of one prompt alike
        pairs = list(zip(rates[name], rates[base], strict=True))
        prompt = statistics.median(a[0] / b[0] for a, b in pairs)
        return f"{prompt:.2f} / {statistics.median(a[1] / b[1] for a, b in pairs):.2f}"

    rows = [["decode weights", "prompt tok/s", "decode tok/s", f"x {kernels[0]}", "x llama.cpp",
             "KL vs fp32", "same top token"]]  # fmt: skip
    for name, r in rates.items():
        kl, same = faithful.get(name, (None, None))
        rows.append([
            name, f"{statistics.median(p for p, _ in r):.1f}",
            f"{statistics.median(d for _, d in r):.2f}", ratio(name, kernels[0]),
            ratio(name, "llama.cpp") if args.llama_url else "",
            f"{kl:.4f}" if kl is not None else "", f"{same:.1%}" if same is not None else "",
        ])  # fmt: skip
    print(f"{args.model}, {len(prompts)} prompts: medians, and medians of per-prompt ratios "
          "(prompt / decode)")  # fmt: skip
    print(table(rows))


if __name__ == "__main__":
    main()
