"""How often a next-edit adapter prefers the expected edit to keeping the region, by its own
likelihoods, on the miner's held-out edits: what DPO against the no-op answer
(``train --objective dpo``) moves, read directly rather than through greedy answers.

    PYTHONPATH=$PWD .venv/bin/python -m bench.edit_preference --adapters none,EXPORTED,...

For each edit example of ``--data`` (the first ``--cases`` of at most ``--max-tokens``), the
answer log-probability of the expected region and of the region unchanged, each in the
adapter's layout (its training.json's style): how many prefer the edit, and the median margin
(nats). ``none`` is the untuned model, in ``chat_split``. Each row is measured in the same run,
on the same examples; the first row is the baseline the others are set against.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from bench.common import ROOT, cpu_flags, table
from serve_app.models.loader import TRAINING_RECORD
from training import train
from training.edits import EditExample
from training.losses import sequence_log_probs, token_losses
from training.preference import preference_pairs


def margins(
    model: torch.nn.Module, examples: list[EditExample], tokenizer: Any, style: str, limit: int
) -> list[float]:
    """Per edit example: log p(expected region) - log p(region unchanged)."""
    chosen, rejected = preference_pairs(examples, tokenizer, style, limit)
    model.eval()
    found = []
    with torch.no_grad():
        for index, pair in rejected.items():
            losses, _, rows = token_losses(model, [chosen[index], pair], "cpu")
            edit, keep = sequence_log_probs(losses, rows, 2).tolist()
            found.append(edit - keep)
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--adapters", default="none,adapters/next-edit-0.5b")
    parser.add_argument("--data", type=Path, default=ROOT / "data/next_edit/validation.jsonl")
    parser.add_argument("--cases", type=int, default=36)
    parser.add_argument("--max-tokens", type=int, default=1024)
    args = parser.parse_args(argv)
    examples = [e for e in train.load_examples(args.data) if e.kind == "edit"][: args.cases]
    tokenizer = train.load_tokenizer(train.DEFAULT_MODEL)
    base = train.load_base(train.DEFAULT_MODEL, "cpu", train.train_dtype("cpu"))
    print(f"CPU: {cpu_flags()}\n{len(examples)} edit examples of {args.data}")
    rows = [["adapter (exported)", "style", "prefers the edit", "median margin (nats)"]]
    for name in args.adapters.split(","):
        model, style = train.with_lora(base, 16, 8), "chat_split"
        if name != "none":
            record = json.loads((Path(name) / TRAINING_RECORD).read_text())
            model = train.with_lora(base, record["rank"], record["layers"])
            train.load_adapter_weights(model, Path(name))
            style = record["style"]
        found = margins(model, examples, tokenizer, style, args.max_tokens)
        base = model.unload()  # the base model's own weights again for the next adapter
        prefer = sum(margin > 0 for margin in found)
        rows.append([name, style, f"{prefer}/{len(found)}", f"{statistics.median(found):.2f}"])
    print(table(rows))


if __name__ == "__main__":
    main()
