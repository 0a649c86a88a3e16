"""Which examples a run learns from: the miner's examples read back, the mix a run draws from
them (edits, the same edits caught mid-typing or with the cursor where the last edit ended,
no-change ones up to a share), and each one's tokens as the service would read it."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from training.edits import (
    EditExample,
    context_support,
    history_cursor_example,
    typing_example,
)
from training.render import TrainingPair, training_pair


def load_examples(path: Path) -> list[EditExample]:
    examples = []
    for line in path.read_text().splitlines():
        raw = json.loads(line)
        raw["cursor"] = tuple(raw["cursor"])
        raw["snippets"] = [tuple(snippet) for snippet in raw["snippets"]]
        examples.append(EditExample(**raw))
    return examples


def training_mix(
    examples: list[EditExample],
    share: float,
    min_support: float,
    rng: random.Random,
    typing: float = 0.0,
    history_cursor: float = 0.0,
) -> list[EditExample]:
    """The edit examples whose new text the prompt shows at least ``min_support`` of
    (``training.edits.context_support``), a ``typing`` share of them again as caught halfway
    through typing (``training.edits.typing_example``), and no-change ones drawn to make at
    most ``share`` of the whole: the miner keeps them all, the mix a model learns from is
    chosen here."""
    edits = [
        example
        for example in examples
        if example.kind == "edit" and context_support(example, example.expected) >= min_support
    ]
    typed = [typing_example(e, rng) for e in rng.sample(edits, round(len(edits) * typing))]
    if history_cursor:
        picked = rng.sample(edits, round(len(edits) * history_cursor))
        typed += [history_cursor_example(example) for example in picked]
    edits += [example for example in typed if example is not None]
    quiet = [example for example in examples if example.kind != "edit"]
    wanted = round(len(edits) * share / (1 - share)) if share < 1 else len(quiet)
    return edits + rng.sample(quiet, min(wanted, len(quiet)))


def encode_all(
    examples: list[EditExample], tokenizer: Any, style: str, max_tokens: int
) -> list[TrainingPair]:
    """Each example's tokens; those over ``max_tokens``, or that ``style`` cannot show
    (``training_pair``), are left out."""
    pairs = []
    for example in examples:
        pair = training_pair(example, example.expected, tokenizer, style)
        if pair is not None and len(pair.ids) <= max_tokens:
            pairs.append(pair)
    return pairs
