"""Ship a trained adapter: what ``training.train`` wrote, made ready to serve and commit.

    python -m training.export data/adapters/next-edit adapters/next-edit-0.5b

Into the destination go peft's two files (the weights in bf16: half the size, and a LoRA's
product is far above bf16's rounding) with the base named as a config names it (the trainer's
``--model``, e.g. ``embedded:qwen2.5-coder-0.5b``, which ``runner.lora`` checks against the
model it is loaded on), and the training record (``training.json``).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from serve_app.models.loader import TRAINING_RECORD as RECORD
from serve_app.runner.lora import CONFIG_FILE, WEIGHTS_FILE


def export(trained: Path, destination: Path) -> Path:
    """``trained``'s finished adapter (``adapter/``) in ``destination``, replacing it whole."""
    record = json.loads((trained / RECORD).read_text())
    files = {RECORD: json.dumps(record, indent=1) + "\n"}
    return write_adapter(trained / "adapter", destination, record["base_model"], files)


def write_adapter(source: Path, destination: Path, base_model: str, files: dict[str, str]) -> Path:
    """peft's adapter in ``source`` written to ``destination`` as it ships: the weights in
    bf16, the base named as a config names it, with ``files`` (name: text) beside them;
    written whole, then renamed into place, so a run killed mid-write leaves the old one."""
    from safetensors.torch import load_file, save_file

    partial = destination.with_name(destination.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    weights = load_file(str(source / WEIGHTS_FILE))
    save_file(
        {key: tensor.to(torch.bfloat16).contiguous() for key, tensor in weights.items()},
        str(partial / WEIGHTS_FILE),
    )
    config = json.loads((source / CONFIG_FILE).read_text())
    config["base_model_name_or_path"] = base_model
    (partial / CONFIG_FILE).write_text(json.dumps(config, indent=1, sort_keys=True) + "\n")
    for name, text in files.items():
        (partial / name).write_text(text)
    shutil.rmtree(destination, ignore_errors=True)
    partial.rename(destination)
    return destination


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trained", type=Path, help="training.train's --out")
    parser.add_argument("destination", type=Path)
    args = parser.parse_args(argv)
    print(export(args.trained, args.destination))


if __name__ == "__main__":
    main()
