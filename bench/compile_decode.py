"""Does ``torch.compile`` pay on the runner's decode step? Eager vs compiled, one run.

    python -m bench.compile_decode --threads 1 --steps 64

Builds the runner (int4 decode weights, as ``configs/local.yaml``) over the embedded model,
reads a short prompt into two KV slots (eager), then decodes ``--steps`` greedy tokens one step
at a time through ``Qwen2Runner.forward`` (``decode=True``, one row: the single-stream case):
eager in one slot and ``torch.compile(forward, dynamic=True)`` in the other, step by step in
alternating order, so a neighbour's load hits both alike. Reports single-stream tok/s of each,
the compile time (the compiled forward's first calls) and whether both decoded the same tokens.
The service does not use this: nothing here changes the runner.

``--random SHAPE --device cuda``: bench.gpu's random bf16 model of that shape (dense weights)
on a GPU instead, where the eager step is bound by kernel launches; ``--mode reduce-overhead``
asks torch.compile for CUDA graphs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from bench.common import table
from serve_app.models.loader import load_model
from serve_app.runner.builder import build_runner

PROMPT = "def fibonacci(n):\n    "


class Stream:
    """One greedy single-row decode in its own KV slot, stepped by ``step``."""

    def __init__(self, runner, step: Callable, cache, slot: int, prompt: list[int]) -> None:
        self.step, self.cache, self.slot = step, cache, slot
        logits = runner.forward(cache, slot, [prompt], [0], decode=False)  # eager prefill
        self.tokens, self.position = [int(logits[-1].argmax())], len(prompt)

    def advance(self) -> float:
        """One decode step; returns its seconds."""
        start = time.perf_counter()
        logits = self.step(self.cache, self.slot, [[self.tokens[-1]]], [self.position], decode=True)
        seconds = time.perf_counter() - start
        self.tokens.append(int(logits[-1].argmax()))
        self.position += 1
        return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--source", default="embedded:qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--warm-steps", type=int, default=4, help="compiled steps not timed")
    parser.add_argument("--mode", default=None, help="torch.compile mode (default: default)")
    parser.add_argument("--random", default=None, help="a bench.gpu shape, random weights")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    if args.random:
        from bench.gpu import loaded_model

        loaded = loaded_model(args.random, args.device, torch.bfloat16)
        runner = build_runner(loaded.model, weights="dense", dense_dtype=torch.bfloat16)
        prompt = list(range(100, 100 + len(PROMPT)))
        weights = "dense bf16"
    else:
        loaded = load_model(args.source, threads=args.threads)
        runner = build_runner(loaded.model, weights="int4", cache_dir=loaded.location)
        prompt = loaded.tokenizer.encode(PROMPT)
        weights = "int4"
    cache = runner.new_cache(2, 256, 4096)
    # The forward builds its index tensors from Python lists (repeat_interleave over them has a
    # data-dependent shape): let dynamo trace those instead of refusing.
    torch._dynamo.config.capture_dynamic_output_shape_ops = True
    torch._dynamo.config.capture_scalar_outputs = True
    compiled = torch.compile(runner.forward, dynamic=True, mode=args.mode)
    with torch.inference_mode():
        eager = Stream(runner, runner.forward, cache, 0, prompt)
        fast = Stream(runner, compiled, cache, 1, prompt)
        warm = [fast.advance() for _ in range(args.warm_steps)]
        for _ in range(args.warm_steps):
            eager.advance()
        times: dict[str, list[float]] = {"eager": [], "compiled": []}
        for i in range(args.steps):  # interleaved, order alternating: drift hits both alike
            pair = [("eager", eager), ("compiled", fast)][:: 1 if i % 2 else -1]
            for name, stream in pair:
                times[name].append(stream.advance())

    def tok_s(seconds: list[float]) -> float:
        return len(seconds) / sum(seconds)

    base = tok_s(times["eager"])
    print(f"{args.random or args.source} on {args.device}, mode {args.mode or 'default'}")
    rows = [[f"decode, 1 row, {weights} weights", "tok/s", "median step ms", "vs eager"]]
    for name, seconds in times.items():
        median = statistics.median(seconds) * 1000
        rows.append(
            [name, f"{tok_s(seconds):.2f}", f"{median:.1f}", f"{tok_s(seconds) / base:.2f}x"]
        )
    print(table(rows))
    print(
        f"compile: {sum(warm):.1f} s for the first {args.warm_steps} compiled steps (slowest "
        f"{max(warm):.1f} s); same tokens as eager: {fast.tokens == eager.tokens}"
    )


if __name__ == "__main__":
    main()
