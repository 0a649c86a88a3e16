"""What each lever of a CPU training run buys on this machine: a few steps of each recipe on
the same examples in the same order, the seconds a step and the ratio to the full gradient.

    python -m training.levers --data data/next_edit --style chat_span --typing 0.5

Arguments after the options are passed to every run (``training.train``'s). The examples are
encoded once and shared; each recipe trains in a folder of its own, so nothing resumes.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

from serve_app.runner.builder import cpu_flags
from training import train

# Each lever on top of the one before (docs/next_edit.md, "Training on a 2-core CPU").
LEVERS = {
    "r 16, all blocks, full gradient": ["--rank", "16", "--layers", "0"],
    "--detach-prompt": ["--rank", "16", "--layers", "0", "--detach-prompt"],
    "--detach-prompt --layers 8": ["--rank", "16", "--layers", "8", "--detach-prompt"],
    "--detach-prompt --layers 8 --rank 8": ["--rank", "8", "--layers", "8", "--detach-prompt"],
}


def seconds_a_step(common: list[str], lever: list[str], folder: Path, pairs: Path) -> float:
    """The mean seconds of a step of ``common + lever``, trained in ``folder`` on ``pairs``."""
    folder.mkdir(parents=True)
    shutil.copy(pairs, folder / train.PAIRS_FILE)
    record = train.run(train.parse_args([*common, *lever, "--out", str(folder)]))
    return record["seconds"] / record["steps"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2)
    args, passed = parser.parse_known_args(argv)
    common = ["--data", args.data, "--steps", str(args.steps), "--batch", str(args.batch),
              "--eval-examples", "0", "--save-every", "1000", "--warmup", "1", *passed]  # fmt: skip
    print(f"CPU: {' '.join(sorted(cpu_flags() & {'avx2', 'avx512f', 'avx512_bf16', 'amx_bf16'}))}")
    with tempfile.TemporaryDirectory() as scratch:
        encoded = Path(scratch) / "encoded"
        train.run(train.parse_args([*common, "--out", str(encoded), "--encode-only"]))
        pairs = encoded / train.PAIRS_FILE
        timings = {
            name: seconds_a_step(common, lever, Path(scratch) / str(index), pairs)
            for index, (name, lever) in enumerate(LEVERS.items())
        }
    full = next(iter(timings.values()))
    print("| recipe | s a step | x full gradient |\n| --- | --- | --- |")
    for name, seconds in timings.items():
        print(f"| {name} | {seconds:.1f} | {full / max(seconds, 1e-9):.2f}x |")


if __name__ == "__main__":
    main()
