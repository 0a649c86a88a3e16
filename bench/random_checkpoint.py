"""A checkpoint folder of a Qwen2.5-Coder shape with random weights and a real tokenizer.

    python -m bench.random_checkpoint --shape 7b --tokenizer QWEN_MODEL_DIR --out /tmp/random-7b

For timing the service's real request paths on a GPU with no model download (the weights are
bench.gpu's, so the answers are noise): any config can then name the folder as a model's
``source``, e.g. ``bench.next_edit --config configs/prod.yaml --source /tmp/random-7b``. The
tokenizer's files (tokenizer.json, its config, the chat template) are copied from
``--tokenizer``; Qwen2.5-Coder's sizes share one tokenizer.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch

from bench.gpu import SHAPES, random_model

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def write_checkpoint(shape: str, tokenizer: Path, out: Path, device: str) -> None:
    model = random_model(shape, device, torch.bfloat16)
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tokenizer / name).exists():
            shutil.copy(tokenizer / name, out / name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="7b", help=f"of {sorted(SHAPES)}")
    parser.add_argument("--tokenizer", type=Path, required=True, help="a folder with Qwen's")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    write_checkpoint(args.shape, args.tokenizer, args.out, args.device)
    print(f"{args.out}: random {args.shape} weights, tokenizer of {args.tokenizer}")


if __name__ == "__main__":
    main()
