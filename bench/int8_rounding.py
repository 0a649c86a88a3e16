"""Which int8 linears should round their activations twice? Faithfulness against the cost.

    python -m bench.int8_rounding --threads 1

The embedded model's int8 runner as the service builds it on AVX2 (smoothed, prompts on the
int8 weights, position 0 dense), with ``int8_linear``'s ``precise`` (a second rounding of
what the first dropped, ~14-bit activations instead of 7) on a set of linear kinds per row:
none, ``builder.PRECISE_WHEN_GENERATING`` (the service's generating runner), and every kind
(the decision scorer's). Per set, against the dense fp32 weights on the same text:

- KL(dense || int8) of the next-token distribution and how often the top token is the same,
  over ``--tokens`` positions of each of six standard-library modules (code no one here wrote),
  read as a prompt is;
- the time to read a 1,024-token prompt (4 chunks of 256) and one decode step's, medians of
  ``--rounds`` runs, the sets interleaved so a neighbour's load hits them alike.

Ratios are against the first set (none) in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import sysconfig
import time
from pathlib import Path

import torch

from bench.common import cpu_flags, table
from serve_app.models.loader import load_model
from serve_app.runner.builder import LINEARS, PRECISE_WHEN_GENERATING, build_runner
from serve_app.runner.qwen2 import Qwen2Runner
from serve_app.runner.smoothing import calibration_ids

MODULES = ["csv.py", "tokenize.py", "argparse.py", "json/decoder.py", "dataclasses.py", "pprint.py"]
SETS = {"none": (), "generating": PRECISE_WHEN_GENERATING, "every": LINEARS}


def next_token_logits(runner: Qwen2Runner, cache, ids: list[int]) -> torch.Tensor:
    """Logits after each of ``ids[1:]`` given what precedes it, read as the service reads a
    prompt on this runner (position 0 on its own path where prompts are quantized)."""
    if runner.quantized_prompts:
        runner.forward(cache, 0, [ids[:1]], [0], decode=False)
        return runner.forward(cache, 0, [ids[1:]], [1], decode=True)
    return runner.forward(cache, 0, [ids], [0], decode=True)[1:]


def faithfulness(runner, dense, cache, texts: list[list[int]]) -> tuple[float, float]:
    kl = same = positions = 0.0
    for ids in texts:
        ref = next_token_logits(dense, cache, ids).log_softmax(-1)
        got = next_token_logits(runner, cache, ids).log_softmax(-1)
        kl += (ref.exp() * (ref - got)).sum().item()
        same += (ref.argmax(-1) == got.argmax(-1)).sum().item()
        positions += len(got)
    return kl / positions, same / positions


def timings(runner: Qwen2Runner, cache, ids: list[int]) -> tuple[float, float]:
    """(seconds to read ids[:1024], seconds per decode step after it)."""
    start = time.perf_counter()
    runner.forward(cache, 0, [ids[:1]], [0], decode=False)
    for s in range(1, 1024, 256):
        runner.forward(cache, 0, [ids[s : s + 256]], [s], decode=False)
    prompt = time.perf_counter() - start
    start = time.perf_counter()
    for k in range(16):
        runner.forward(cache, 0, [[ids[1024 + k]]], [1024 + k], decode=True)
    return prompt, (time.perf_counter() - start) / 16


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", default="embedded:qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=512, help="positions per module")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)
    loaded = load_model(args.source, threads=args.threads)
    tok = loaded.tokenizer
    dense = build_runner(loaded.model, weights="dense")
    runners = {
        name: build_runner(
            loaded.model,
            weights="int8",
            prompt_weights="decode",
            cache_dir=loaded.location,
            precise_activations=kinds,
            calibration=calibration_ids(tok),
        )
        for name, kinds in SETS.items()
    }
    root = Path(sysconfig.get_paths()["stdlib"])
    modules = [tok((root / name).read_text())["input_ids"] for name in MODULES]
    texts = [ids[2000 : 2000 + args.tokens] for ids in modules]  # past the license headers
    cache = dense.new_cache(1, 2048, loaded.max_position_embeddings)
    figures = {}
    for name, runner in runners.items():
        figures[name] = faithfulness(runner, dense, cache, texts)
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in SETS}
    for _ in range(args.rounds):
        for name, runner in runners.items():
            times[name].append(timings(runner, cache, modules[2]))
    rows = [["twice rounded", "KL", "same top token", "1,024-token prompt s", "decode step ms"]]
    base = None
    for name, kinds in SETS.items():
        prompt = statistics.median(t[0] for t in times[name])
        step = statistics.median(t[1] for t in times[name])
        base = base or (prompt, step)
        kl, same = figures[name]
        rows.append(
            [
                f"{name} ({', '.join(kinds) or '-'})",
                f"{kl:.4f}",
                f"{same:.1%}",
                f"{prompt:.2f} ({prompt / base[0]:.2f}x)",
                f"{step * 1e3:.1f} ({step / base[1]:.2f}x)",
            ]
        )
    print(f"{args.source}, {len(texts)} stdlib modules x {args.tokens} positions, dense fp32 as")
    print(f"reference; {args.threads} thread(s), {args.rounds} rounds; CPU: {cpu_flags()}")
    print(table(rows))


if __name__ == "__main__":
    main()
