"""``bench/edit.py --in-process``: the edit prompt on in-process engines, speculation on/off.

Kept apart from ``bench/edit.py`` so the HTTP benchmark does not import torch.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from typing import Any

from serve_app.engine.engine import LLMEngine
from serve_app.engine.protocol import GenerationRequest, SamplingParams, generate_text
from serve_app.engine_config import NO_SPECULATION, EngineConfig
from serve_app.models.loader import load_model
from serve_app.prompts.next_edit import fit_to_context, parse_edit_prompt
from tests.fixtures.edit import EXAMPLE_EDIT_CONTENT


def _configs(args: Any) -> dict[str, EngineConfig]:
    spec = NO_SPECULATION.model_copy(update={"edit": args.draft_tokens, "max_batch": 16})
    plain = {"weights": args.weights, "speculation": NO_SPECULATION}
    return {
        "hf (today)": EngineConfig(runner="hf"),
        f"runner {args.weights}": EngineConfig(**plain),
        f"runner {args.weights} + spec": EngineConfig(**{**plain, "speculation": spec}),
    }


def _time_requests(engine: LLMEngine, prompt_ids: list[int], args: Any) -> tuple[list, str]:
    """Cold first, then ``repeats`` with the prompt in the prefix cache; returns latencies."""
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    latencies, text = [], ""
    for i in range(args.repeats + 1):
        request = GenerationRequest(f"e{i}", list(prompt_ids), params, "bench", route="edit")
        start = time.perf_counter()
        text, _ = asyncio.run(generate_text(engine, request))
        latencies.append(time.perf_counter() - start)
    return latencies, text


def run_in_process(args: Any) -> list[list[str]]:
    loaded = load_model(args.source, threads=args.threads)
    context_length = loaded.max_position_embeddings
    _, prompt_ids = fit_to_context(
        parse_edit_prompt(EXAMPLE_EDIT_CONTENT),
        loaded.tokenizer,
        max_prompt_tokens=context_length - args.max_tokens,
        context_length=context_length,
    )
    rows = [
        [
            "engine",
            "cold s",
            "repeat p50 s",
            "vs hf",
            "acceptance",
            "output tok",
            "same text as row above",
        ]
    ]
    base, previous = None, None
    for name, config in _configs(args).items():
        engine = LLMEngine(loaded, config)
        try:
            latencies, text = _time_requests(engine, prompt_ids, args)
            stats = engine.stats()
        finally:
            engine.shutdown()
        repeat = statistics.median(latencies[1:]) if args.repeats else latencies[0]
        base = base or repeat
        accepted = f"{stats.draft_acceptance:.0%}" if stats.draft_tokens else "-"
        tokens = len(loaded.tokenizer.encode(text))
        rows.append(
            [
                name,
                f"{latencies[0]:.2f}",
                f"{repeat:.2f}",
                f"{base / repeat:.2f}x",
                accepted,
                str(tokens),
                "-" if previous is None else ("yes" if text == previous else "no"),
            ]
        )
        previous = text
        print(f"{name}: done ({len(prompt_ids)}-token prompt)", flush=True)
    return rows
