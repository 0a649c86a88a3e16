"""The static decode step that a CUDA GPU captures as a graph (``runner.graphs``).

A graph cannot be captured on CPU, so these tests run the same static step eagerly
(``DecodeGraphs(capture=False)``) in a real engine and check what the capture adds to the
eager step: rows padded to a bucket with their keys/values written into the spare slot,
short rows of a verify step padded to the longest, attention over the cache's whole
allocation, graphs dropped when the cache reallocates. The GPU itself is checked by
``bench.gpu`` (graphs against eager in the same run).
"""

from __future__ import annotations

import asyncio

import torch

from serve_app.engine.engine import LLMEngine
from serve_app.engine.protocol import generate_text
from serve_app.runner.graphs import DecodeGraphs
from tests.conftest import engine_config, speculating
from tests.runner_support import PROMPTS, encode, greedy


def requests(loaded, route: str = "") -> list:
    """Every prompt at once, of different lengths and answer lengths: rows join and leave,
    so the bucket a step is padded to changes from step to step."""
    return [
        greedy(f"r{i}", encode(loaded, text), 24 + 5 * i, route=route)
        for i, text in enumerate(PROMPTS)
    ]


def generate(loaded, config, static: bool, route: str = "") -> tuple[list[str], LLMEngine]:
    """Each request's text from an engine whose decode steps run eagerly, or (``static``)
    as the captured step would; and the engine."""
    engine = LLMEngine(loaded, config)
    if static:
        engine.backend.runner.graphs = DecodeGraphs(capture=False)
    try:

        async def main():
            batch = requests(loaded, route)
            return await asyncio.gather(*(generate_text(engine, r) for r in batch))

        results = asyncio.run(asyncio.wait_for(main(), timeout=120))
    finally:
        engine.shutdown()
    return [text for text, _ in results], engine


def test_the_static_step_gives_the_eager_steps_text(loaded) -> None:
    config = engine_config(max_batch_size=8)
    eager, _ = generate(loaded, config, static=False)
    static, engine = generate(loaded, config, static=True)
    assert static == eager
    shapes = set(engine.backend.runner.graphs.steps)
    assert {(1, 1), (2, 1), (4, 1), (8, 1)} <= shapes  # six rows padded to 8, then fewer


def test_verify_steps_run_on_the_static_step(loaded) -> None:
    """With prompt lookup, steps that verify drafts feed several tokens in some rows (rows
    without drafts padded to the longest): the text is the eager engine's."""
    config = engine_config(max_batch_size=8, speculation=speculating(edit=4))
    eager, _ = generate(loaded, config, static=False, route="edit")
    static, engine = generate(loaded, config, static=True, route="edit")
    assert static == eager
    assert engine.stats().draft_tokens > 0
    assert any(span > 1 for _, span in engine.backend.runner.graphs.steps)


def test_padding_rows_write_only_the_spare_slot(loaded) -> None:
    """Three rows padded to four, spans padded to two: the fourth row's keys/values land in
    the spare slot, and slot 3, which a prompt being read may own, keeps its columns; the
    logits are those of the real tokens only, in order."""
    engine = LLMEngine(loaded, engine_config(max_batch_size=8))
    try:
        runner, cache = engine.backend.runner, engine.backend.cache
        graphs = DecodeGraphs(capture=False)
        cache.ensure(16)
        marker = torch.full_like(cache.keys[0][3], 7.0)
        for keys in cache.keys:
            keys[3] = marker
        with torch.inference_mode():
            logits = graphs.decode(runner, cache, [[5], [6, 8], [7]], [2, 4, 9])
        assert logits.shape == (4, runner.vocab_size)
        assert list(cache.graphs) == [(4, 2)]
        assert all(torch.equal(keys[3], marker) for keys in cache.keys)
        assert cache.keys[0][cache.slots - 1, :, 0].abs().sum() > 0  # the padding row's
    finally:
        engine.shutdown()


def test_graphs_of_an_earlier_allocation_are_dropped(loaded) -> None:
    """A graph holds the cache's tensors by address: when the cache grows, the graphs over
    its old tensors go with them, and the step is captured again over the new ones."""
    engine = LLMEngine(loaded, engine_config(max_batch_size=4))
    try:
        runner, cache = engine.backend.runner, engine.backend.cache
        graphs = DecodeGraphs(capture=False)
        with torch.inference_mode():
            graphs.decode(runner, cache, [[5], [6]], [3, 3])
            old = cache.graphs[(2, 1)]
            graphs.decode(runner, cache, [[5]], [cache.capacity + 10])  # grows the cache
            assert list(cache.graphs) == [(1, 1)]
            graphs.decode(runner, cache, [[5], [6]], [3, 3])
        assert cache.graphs[(2, 1)] is not old
    finally:
        engine.shutdown()


def test_a_step_with_no_bucket_runs_eagerly() -> None:
    assert DecodeGraphs.bucket(3, 1, 9) == 4
    assert DecodeGraphs.bucket(8, 1, 9) == 8
    assert DecodeGraphs.bucket(9, 1, 9) is None
    assert DecodeGraphs.bucket(5, 1, 6) is None  # 8 rows would read past the spare slot
    assert DecodeGraphs.bucket(9, 17, 65) == 12
    assert DecodeGraphs.bucket(16, 17, 65) is None  # 16 x 17 tokens: past MAX_TOKENS
