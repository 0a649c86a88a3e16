"""The engine's own runner on the tiny model: the default backend, dense output identical to
the HF model through joins and leaves, prefix-cache reuse exact, a request's tokens the
same alone and batched, bf16 prefill, slots freed.

Quantized weights: test_runner_quantized; preparing and saving them: test_runner_prepare;
speculation: test_runner_speculation; off the CPU: test_runner_device.
"""

from __future__ import annotations

import pytest
import torch

from serve_app.engine.engine import LLMEngine
from serve_app.engine.prefix_cache import PrefixCache
from serve_app.models.loader import LoadedModel
from serve_app.runner.builder import build_runner
from tests.conftest import engine_config
from tests.runner_support import PROMPTS, encode, generate_all, greedy


def reference(loaded: LoadedModel, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding through the HF model, the whole sequence at every step."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(loaded.model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def test_runner_is_the_default_backend_and_hf_stays_selectable(loaded) -> None:
    for config, backend in (
        (engine_config(), "RunnerBackend"),
        (engine_config(runner="hf"), "HFBackend"),
    ):
        engine = LLMEngine(loaded, config)
        assert engine.stats().backend == backend
        engine.shutdown()


def test_dense_runner_matches_hf_through_joins_and_leaves(loaded) -> None:
    """Six requests of different lengths through three slots: rows join, leave and are
    compacted while others decode; every output equals the HF model's greedy output."""
    prompts = [encode(loaded, t) for t in PROMPTS]
    lengths = [5, 30, 12, 20, 8, 25]
    requests = [
        greedy(f"r{i}", p, n) for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
    ]
    texts, _ = generate_all(
        loaded, engine_config(max_batch_size=3, prefill_chunk_tokens=16), requests
    )
    for text, prompt, n in zip(texts, prompts, lengths, strict=True):
        assert text == loaded.tokenizer.decode(
            reference(loaded, prompt, n), skip_special_tokens=True
        )


def test_prefix_hit_reproduces_cold_logits(loaded) -> None:
    """KV copied out of a slot into the prefix cache and back into another slot gives the same
    logits for the rest of the prompt as reading it cold."""
    runner = build_runner(loaded.model, weights="dense")
    cache = runner.new_cache(3, 16, 4096)
    prompt = encode(loaded, PROMPTS[4])
    with torch.inference_mode():
        cold = runner.forward(cache, 0, [prompt], [0], decode=True)
        prefix = PrefixCache()
        prefix.insert(prompt[:20], cache.read(0, 20), "test")
        hit, kv = prefix.lookup(prompt, "test")
        assert hit == 20
        cache.load(2, kv)
        warm = runner.forward(cache, 2, [prompt[20:]], [20], decode=True)
    torch.testing.assert_close(warm, cold[20:], rtol=0, atol=1e-4)


@pytest.mark.parametrize("weights", ["int8", "int4", "dense"])
def test_a_request_decodes_the_same_alone_and_batched(loaded, weights) -> None:
    """Concurrent requests share every decode step; each one's tokens are those it gets alone."""
    prompts = [encode(loaded, t) for t in PROMPTS]
    requests = [greedy(f"r{i}", p, 24) for i, p in enumerate(prompts)]
    config = engine_config(weights=weights, prefix_cache_mb=0)
    batched, engine = generate_all(loaded, config, requests)
    assert engine.stats().peak_decode_batch == len(prompts)
    alone = [generate_all(loaded, config, [r])[0][0] for r in requests]
    assert batched == alone


def test_bf16_prefill_runs_where_asked(loaded) -> None:
    """``prefill_dtype=bfloat16`` (chosen automatically on AVX512-BF16/AMX CPUs) serves too; its
    first tokens match fp32 on this model."""
    prompts = [encode(loaded, t) for t in PROMPTS[:3]]
    requests = [greedy(f"r{i}", p, 1) for i, p in enumerate(prompts)]
    bf16, engine = generate_all(loaded, engine_config(prefill_dtype="bfloat16"), requests)
    fp32, _ = generate_all(loaded, engine_config(prefill_dtype="float32"), requests)
    assert engine.stats().backend == "RunnerBackend"
    assert sum(a == b for a, b in zip(bf16, fp32, strict=True)) >= 2


def test_slots_are_freed_whatever_ends_a_request(loaded) -> None:
    """Requests ending at their first token (max_tokens=1), at a stop sequence or normally,
    three times more than there are slots: every one gets a slot and finishes."""
    prompts = [encode(loaded, t) for t in PROMPTS] * 4
    requests = [greedy(f"r{i}", p, 1 + (i % 3) * 5) for i, p in enumerate(prompts)]
    texts, engine = generate_all(loaded, engine_config(max_batch_size=2), requests)
    assert len(texts) == len(requests)
    assert engine.stats().requests_finished == len(requests)
