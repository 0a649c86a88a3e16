"""The runner's int4 and int8 weights: the kernels against their dequantized matrices, rows
independent of their batch, and which passes run on them (decode, small prompt chunks,
prompts with position 0 kept dense) against the dense runner and the HF model.
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from serve_app.models.loader import LoadedModel
from serve_app.runner.builder import build_runner
from serve_app.runner.weights import (
    INT4_GROUP,
    Linear,
    dequantize_int4_reference,
    int4_supported,
    int8_values,
    quantize_int4,
    quantize_int8,
)
from tests.conftest import engine_config
from tests.runner_support import PROMPTS, encode, generate_all, greedy


def test_int4_kernel_computes_the_dequantized_matrix() -> None:
    weight = torch.randn(48, 4 * INT4_GROUP, generator=torch.Generator().manual_seed(1))
    packed, scales = quantize_int4(weight)
    dequantized = dequantize_int4_reference(weight)
    assert (dequantized - weight).abs().max() <= (weight.abs().max() * 2 / 15)  # half a step
    x = torch.randn(3, 4 * INT4_GROUP).bfloat16()
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, INT4_GROUP, scales).float()
    expected = x.float() @ dequantized.t()
    # bf16 output: within a couple of bf16 steps (1/128 relative) of the largest value.
    torch.testing.assert_close(y, expected, rtol=0, atol=float(expected.abs().max()) / 64)


def int4_numbers(loaded: LoadedModel) -> LoadedModel:
    """A copy of the HF model whose layers' linear weights are what int4 keeps of them (the
    tiny model's 399-row lm_head does not fit the kernel's 16-row blocks: it stays dense)."""
    assert not int4_supported(loaded.model.config.vocab_size, INT4_GROUP)
    model = copy.deepcopy(loaded.model)
    with torch.no_grad():
        for module in model.model.layers.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(dequantize_int4_reference(module.weight))
    return dataclasses.replace(loaded, model=model)


def test_int4_decode_computes_its_dequantized_weights(loaded) -> None:
    """Decode forwards run on int4: their logits are those of the model whose
    weights are int4's dequantized values, up to bf16 activations, which is ~20x closer than
    that model is to the fp32 one; the greedy picks agree."""
    runner = build_runner(loaded.model, weights="int4")
    cache = runner.new_cache(1, 16, 4096)
    prompt = encode(loaded, PROMPTS[1])[:12]
    with torch.inference_mode():
        logits = runner.forward(cache, 0, [prompt], [0], decode=True)
        expected = int4_numbers(loaded).model(torch.tensor([prompt])).logits[0]
        fp32 = loaded.model(torch.tensor([prompt])).logits[0]
    drift = (expected - fp32).abs().max()
    assert (logits - expected).abs().max() < drift / 10
    assert torch.equal(logits.argmax(-1), expected.argmax(-1))


def test_int4_engine_output_against_fp32(loaded) -> None:
    """Reports how many greedy outputs int4 keeps identical to fp32 on this random model
    (std 0.3 weights amplify quantization; ``bench.decode_kernels --kernels int8,int4`` measures
    the 0.5B's faithfulness)."""
    prompts = [encode(loaded, t) for t in PROMPTS]
    requests = [greedy(f"r{i}", p, 16) for i, p in enumerate(prompts)]
    int4, engine = generate_all(loaded, engine_config(weights="int4"), requests)
    dense, _ = generate_all(loaded, engine_config(weights="dense"), requests)
    same = sum(a == b for a, b in zip(int4, dense, strict=True))
    print(f"tiny model: {same}/{len(prompts)} int4 greedy outputs identical to fp32")
    assert engine.stats().backend == "RunnerBackend" and all(int4)


def test_int8_linear_is_close_to_dense() -> None:
    """fbgemm's int8 linear: per-channel int8 weights and per-call uint8 activations keep a
    matrix product within ~2% of its largest value (the tiny model amplifies it;
    bench.decode_kernels measures the 0.5B)."""
    generator = torch.Generator().manual_seed(2)
    weight = torch.randn(64, 96, generator=generator)
    bias = torch.randn(64, generator=generator)
    x = torch.randn(3, 96, generator=generator)
    y = Linear([(weight, bias)], int8=quantize_int8(weight))(x, True)
    expected = x @ weight.t() + bias
    assert y.dtype == torch.float32 and y.shape == expected.shape
    assert (y - expected).abs().max() < expected.abs().max() * 0.02


def test_int8_rows_do_not_depend_on_the_rest_of_the_call() -> None:
    """Each row is quantized on its own scale: a row's result is bit-identical alone and next
    to a row with 30x its activations, and that row does not coarsen it."""
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(64, 96, generator=generator)
    bias = torch.randn(64, generator=generator)
    linear = Linear([(weight, bias)], int8=quantize_int8(weight))
    x = torch.randn(4, 96, generator=generator)
    x[2] *= 30
    batched = linear(x, True)
    alone = torch.cat([linear(x[i : i + 1], True) for i in range(4)])
    assert torch.equal(batched, alone)
    expected = x[0] @ weight.t() + bias
    assert (batched[0] - expected).abs().max() < expected.abs().max() * 0.02


def test_precise_int8_leaves_under_a_thirtieth_of_the_activation_rounding_error() -> None:
    """Rows peaking at 40x their RMS (the down projection's input): one 7-bit rounding leaves
    a typical element a few levels; the second pass over what it dropped leaves the weights'
    rounding alone, and still works per row."""
    generator = torch.Generator().manual_seed(5)
    weight = torch.randn(64, 512, generator=generator)
    x = torch.randn(6, 512, generator=generator)
    x[:, 7] = 40 * x.pow(2).mean(1).sqrt()
    values, scales = int8_values(weight)
    exact = x @ (values.float() * scales.unsqueeze(1).float()).t()  # the int8 weights, fp32 math
    packed = quantize_int8(weight)
    one, two = (Linear([(weight, None)], int8=packed, precise=p)(x, True) for p in (False, True))
    assert (two - exact).abs().max() < (one - exact).abs().max() / 30
    alone = torch.cat(
        [Linear([(weight, None)], int8=packed, precise=True)(x[i : i + 1], True) for i in range(6)]
    )
    assert torch.equal(two, alone)


def kv_of(cache, length: int) -> torch.Tensor:
    """Every layer's keys and values of slot 0's first ``length`` positions, as one tensor."""
    return torch.cat([torch.cat([k, v]).flatten() for k, v in cache.read(0, length)])


def test_int8_engine_decodes_on_int8_and_prefills_dense(loaded) -> None:
    """weights="int8": decode steps run fbgemm's int8 linears, prompts the dense weights, so a
    prefill writes exactly the dense runner's KV and a decode step's logits stay close. Both
    read their logits through the int8 head (it feeds no KV)."""
    dense = build_runner(loaded.model, weights="dense")
    int8 = build_runner(loaded.model, weights="int8", int8_kernel="fbgemm")
    assert int8.layers[0].qkv.int8 is not None and dense.layers[0].qkv.int8 is None
    prompt = encode(loaded, PROMPTS[1])[:12]
    with torch.inference_mode():
        caches = [runner.new_cache(1, 16, 4096) for runner in (dense, int8)]
        prefill = [
            r.forward(c, 0, [prompt], [0], decode=False)
            for r, c in zip((dense, int8), caches, strict=True)
        ]
        kv = [kv_of(c, len(prompt)) for c in caches]
        step = [
            r.forward(c, 0, [[5]], [12], decode=True)
            for r, c in zip((dense, int8), caches, strict=True)
        ]
    torch.testing.assert_close(kv[1], kv[0], rtol=0, atol=0)
    assert (prefill[1] - prefill[0]).abs().max() < prefill[0].abs().max() * 0.1
    assert not torch.equal(step[1], step[0])
    assert (step[1] - step[0]).abs().max() < step[0].abs().max() * 0.1
    requests = [greedy("r0", prompt, 8)]
    texts, engine = generate_all(loaded, engine_config(weights="int8"), requests)
    assert engine.stats().backend == "RunnerBackend" and all(texts)


def test_a_small_prompt_chunk_runs_on_the_decode_weights(loaded) -> None:
    """A prompt chunk of at most ``small_prefill_tokens`` tokens after the prompt's start (the
    tail after a prefix-cache hit) runs on int8 like a decode step, since on dense weights it
    would cost a decode step's time: its KV is what a decode pass over the same tokens writes.
    A longer chunk, a chunk holding position 0 (whose outsized activations int8 flattens:
    ``Qwen2Runner.first_token``), or any chunk with the threshold at 0 writes the dense KV
    exactly."""
    small = build_runner(loaded.model, weights="int8", small_prefill_tokens=8)
    plain = build_runner(loaded.model, weights="int8")
    prompt = encode(loaded, PROMPTS[1])[:16]
    for start, end in ((4, 10), (4, 16), (0, 6)):
        with torch.inference_mode():
            caches = [runner.new_cache(1, 16, 4096) for runner in (small, plain, small)]
            for cache in caches:  # the same dense prefix in every cache
                if start:
                    plain.forward(cache, 0, [prompt[:start]], [0], decode=False)
            chunk = [prompt[start:end]]
            small.forward(caches[0], 0, chunk, [start], decode=False)
            plain.forward(caches[1], 0, chunk, [start], decode=False)
            small.forward(caches[2], 0, chunk, [start], decode=True)  # on the int8 weights
        ran, dense, decoded = (kv_of(c, end) for c in caches)
        if start > 0 and end - start <= 8:
            torch.testing.assert_close(ran, decoded, rtol=1e-4, atol=1e-4)
            assert (ran - dense).abs().max() > 1e-3
        else:
            torch.testing.assert_close(ran, dense, rtol=0, atol=0)
    config = engine_config(weights="int8", small_prefill_tokens=8)
    texts, engine = generate_all(loaded, config, [greedy("r0", prompt[:6], 8)])
    assert engine.stats().backend == "RunnerBackend" and all(texts)


def test_prompts_on_the_decode_weights_keep_position_zero_dense(loaded, monkeypatch) -> None:
    """prompt_weights="decode": position 0 is the dense runner's exactly (computed once per
    token id and kept), every later position is what a decode pass over the same tokens
    writes (int8, so not the dense KV), whatever the chunking; a one-token prompt reads its
    logits from the kept entry; the kept entries are bounded."""
    from serve_app.runner import qwen2

    dense = build_runner(loaded.model, weights="dense")
    quantized = build_runner(loaded.model, weights="int8", prompt_weights="decode")
    assert quantized.quantized_prompts and not dense.quantized_prompts
    prompt = encode(loaded, PROMPTS[1])[:16]
    with torch.inference_mode():
        whole, chunked, decoded, ref = (quantized.new_cache(1, 16, 4096) for _ in range(4))
        logits = quantized.forward(whole, 0, [prompt], [0], decode=False)
        for start, end in ((0, 5), (5, 16)):  # the second reads the kept position 0
            chunk_logits = quantized.forward(chunked, 0, [prompt[start:end]], [start], decode=False)
        dense.forward(ref, 0, [prompt], [0], decode=False)
        dense.forward(decoded, 0, [prompt[:1]], [0], decode=False)
        quantized.forward(decoded, 0, [prompt[1:]], [1], decode=True)
        assert list(quantized.first_tokens) == [("", prompt[0])]
        one = [quantized.forward(c, 0, [prompt[:1]], [0], decode=False) for c in (whole, ref)]
    torch.testing.assert_close(kv_of(whole, 1), kv_of(ref, 1), rtol=0, atol=0)
    torch.testing.assert_close(kv_of(whole, 16), kv_of(decoded, 16), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(kv_of(chunked, 16), kv_of(whole, 16), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(chunk_logits, logits, rtol=1e-4, atol=1e-4)
    assert (kv_of(whole, 16) - kv_of(ref, 16)).abs().max() > 1e-3  # the rest ran on int8
    torch.testing.assert_close(one[0], one[1], rtol=0, atol=0)

    monkeypatch.setattr(qwen2, "FIRST_TOKENS_KEPT", 3)
    with torch.inference_mode():
        for token in (7, 8, 9, 7, 10):
            quantized.forward(ref, 0, [[token, 11]], [0], decode=False)
    assert [token for _, token in quantized.first_tokens] == [9, 7, 10]
    config = engine_config(weights="int8", prompt_weights="decode")
    texts, engine = generate_all(loaded, config, [greedy("r0", prompt, 8)])
    assert engine.stats().backend == "RunnerBackend" and all(texts)
