"""Prompt chunks of several requests read in one forward (``RunnerBackend.prompt_batch``).

On a GPU the runner reads every prefilling request's chunk in one forward; on CPU one per
forward (its aligned attention keeps a position's bits independent of how a prompt was cut).
These tests turn the batched read on for the tiny model on CPU and check what it must keep:
each request's text (rows in any slots, prompts longer than a step's budget, requests joining
while others decode), and the prefix cache: a request that starts like one being read waits a
step and reads only the rest.
"""

from __future__ import annotations

import asyncio

from serve_app.engine.engine import LLMEngine
from serve_app.engine.prefill import SHARED_PREFIX_TOKENS
from serve_app.engine.protocol import generate_text
from tests.conftest import engine_config
from tests.runner_support import PROMPTS, encode, greedy


def generate(loaded, config, prompt_batch: int, prompts: list[list[int]]) -> tuple:
    """Every prompt at once through an engine reading ``prompt_batch`` chunks per forward:
    the texts, the cached prompt tokens of each, and the engine."""
    engine = LLMEngine(loaded, config)
    engine.backend.prompt_batch = prompt_batch
    try:

        async def main():
            requests = [greedy(f"r{i}", p, 12 + 3 * i) for i, p in enumerate(prompts)]
            return await asyncio.gather(*(generate_text(engine, r) for r in requests))

        results = asyncio.run(asyncio.wait_for(main(), timeout=120))
    finally:
        engine.shutdown()
    return [text for text, _ in results], [usage.cached_tokens for _, usage in results], engine


def test_one_forward_for_several_prompts_gives_each_its_own_text(loaded) -> None:
    """Six prompts, some longer than a step's 24-token budget, so chunks of different
    requests at different offsets share forwards; slots are taken from the top, so the rows
    are not slots 0.. in order."""
    config = engine_config(max_batch_size=8, prefill_chunk_tokens=24, prefix_cache_mb=0)
    prompts = [encode(loaded, text) for text in PROMPTS]
    alone, _, _ = generate(loaded, config, 1, prompts)
    batched, _, engine = generate(loaded, config, 8, prompts)
    assert batched == alone
    assert engine.stats().prefill_tokens == sum(len(p) for p in prompts)


def test_a_prompt_that_starts_like_one_being_read_waits_for_the_cache(loaded) -> None:
    """Two requests over one long shared prefix (a decision's state) sent together: the
    second is not read beside the first, but a step later, from the prefix cache."""
    shared = (encode(loaded, PROMPTS[4]) * 40)[: SHARED_PREFIX_TOKENS + 40]
    prompts = [shared + encode(loaded, " a"), shared + encode(loaded, " b")]
    config = engine_config(max_batch_size=8, prefill_chunk_tokens=512)
    alone, _, _ = generate(loaded, config, 1, prompts)
    batched, cached, _ = generate(loaded, config, 8, prompts)
    assert batched == alone
    assert cached[0] == 0 and cached[1] >= len(shared) - 1
