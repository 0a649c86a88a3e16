"""The runner's own 4-bit kernel (``weights_q4``, ``kernels/q4.c``): it computes exactly the
math it documents on every path the CPU has, its rows do not depend on their batch, and a
runner on ``weights: q4`` decodes and reads prompts on it (``prompt_weights: decode``: prompts
on 8 bits) and falls back where it cannot."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from serve_app.models.loader import LoadedModel
from serve_app.runner import builder, native, weights_q4
from serve_app.runner.builder import build_runner, configured_runner, decode_weights
from serve_app.runner.native_matmul import NativeMatmul
from tests.conftest import engine_config
from tests.runner_support import PROMPTS, encode, generate_all, greedy

# The kernels' own math runs wherever they build (a CPU without AVX2 on the portable path); a
# runner uses them only where a SIMD path is there (``needs_simd``).
pytestmark = pytest.mark.skipif(
    native.library_reason() is not None, reason=f"C kernels: {native.library_reason()}"
)
needs_simd = pytest.mark.skipif(
    native.unavailable_reason() is not None, reason=f"C kernels: {native.unavailable_reason()}"
)
ISAS = [isa for isa in (0, 1, 2) if isa <= NativeMatmul().isa]  # 0: portable C


def reference(x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    """q4.c's documented math in float64: the scale term on activations rounded to int8 per
    32 inputs, the minimum's term on their exact sums."""
    k = x.shape[1]
    scales_only = packed.clone()
    scales_only[..., -2 * weights_q4.TILE :] = 0  # the minimums, zeroed
    scaled = weights_q4.dequantize(scales_only, n, k).double()
    minimums = weights_q4.dequantize(packed, n, k).double() - scaled
    groups = x.double().reshape(x.shape[0], -1, weights_q4.GROUP)
    peak = groups.abs().amax(-1, keepdim=True)
    rounded = (groups * 127 / peak.clamp(min=1e-30)).round() * peak / 127
    return rounded.reshape(x.shape) @ scaled.t() + x.double() @ minimums.t()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(("n", "k", "rows"), [(16, 32, 1), (48, 96, 3), (64, 160, 6)])
def test_kernel_computes_its_documented_math(isa: int, n: int, k: int, rows: int) -> None:
    generator = torch.Generator().manual_seed(n + k + rows)
    weight = torch.randn(n, k, generator=generator) * 0.05
    x = torch.randn(rows, k, generator=generator) * 3
    x[0, :32] = 0  # an all-zero group: scale 0, no division by it
    packed = weights_q4.quantize(weight)
    y = NativeMatmul(isa=isa).q4(x, packed, n)
    expected = reference(x, packed, n)
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5)


def test_quantization_is_within_half_a_step_and_refits_lower_the_error() -> None:
    """From each group's range every weight is within half a step (fp16 scales round a little
    too); the least-squares refits then lower the squared error of the whole matrix."""
    weight = torch.randn(64, 256, generator=torch.Generator().manual_seed(3))
    plain = weights_q4.dequantize(weights_q4.quantize(weight, refits=0), 64, 256)
    groups = weight.reshape(64, 8, 32)
    step = (groups.amax(-1) - groups.amin(-1)) / 15
    assert ((plain - weight).abs().reshape(64, 8, 32).amax(-1) <= step * 0.5 + 1e-3).all()
    refit = weights_q4.dequantize(weights_q4.quantize(weight), 64, 256)
    assert ((refit - weight) ** 2).sum() < 0.95 * ((plain - weight) ** 2).sum()


def test_shapes_the_kernel_cannot_take_are_refused() -> None:
    assert not weights_q4.supported(24, 64) and not weights_q4.supported(32, 48)
    with pytest.raises(ValueError, match="q4 needs"):
        weights_q4.quantize(torch.zeros(24, 64))


def q4_numbers(loaded: LoadedModel) -> LoadedModel:
    """A copy of the HF model whose layers' linear weights are what q4 keeps of them."""
    model = copy.deepcopy(loaded.model)
    with torch.no_grad():
        for module in model.model.layers.modules():
            if isinstance(module, torch.nn.Linear):
                n, k = module.weight.shape
                packed = weights_q4.quantize(module.weight)
                module.weight.copy_(weights_q4.dequantize(packed, n, k))
    return dataclasses.replace(loaded, model=model)


@needs_simd
def test_decode_steps_run_on_q4_and_prompts_do_not(loaded) -> None:
    """A decode pass computes the model whose weights are q4's (up to int8 activations, far
    closer than that model is to fp32); a prompt chunk the int8 weights (its numbers differ)."""
    runner = build_runner(loaded.model, weights="q4", prompt_weights="decode")
    assert runner.decode_weights == "q4"
    prompt = encode(loaded, PROMPTS[1])[:12]
    with torch.inference_mode():
        decoded = runner.forward(runner.new_cache(1, 16, 4096), 0, [prompt], [0], decode=True)
        expected = q4_numbers(loaded).model(torch.tensor([prompt])).logits[0]
        fp32 = loaded.model(torch.tensor([prompt])).logits[0]
    drift = (expected - fp32).abs().max()
    # The tiny model's head (vocab not a multiple of 16) stays int8: its rounding is the rest.
    assert (decoded - expected).abs().max() < drift / 3
    assert all(layer.qkv.q4 is not None and layer.down.q4 is not None for layer in runner.layers)


@needs_simd
def test_greedy_output_is_the_same_alone_and_batched(loaded) -> None:
    prompts = [encode(loaded, t) for t in PROMPTS]
    requests = [greedy(f"r{i}", p, 12) for i, p in enumerate(prompts)]
    config = engine_config(weights="q4", prompt_weights="auto")
    together, engine = generate_all(loaded, config, requests)
    alone = [generate_all(loaded, config, [r])[0][0] for r in requests]
    assert together == alone and all(together)
    assert engine.stats().backend == "RunnerBackend"


@needs_simd
def test_the_decision_scorer_holds_only_the_weights_its_prompts_read(loaded) -> None:
    expected = {"auto": "q4", "q4": "q4", "decode": "int8", "dense": "dense"}
    for prompts, weights in expected.items():
        config = engine_config(weights="q4", prompt_weights=prompts).for_scoring(0)
        runner = configured_runner(loaded, config, "scorer")
        assert runner is not None and runner.decode_weights == weights, prompts


@needs_simd
@pytest.mark.parametrize("prompts", ["auto", "q4"])
def test_prompts_on_q4_read_the_decode_weights_and_map_no_8bit_layers(loaded, prompts) -> None:
    """``prompt_weights: q4`` (and ``auto``): a prompt computes the model whose layers are q4's
    (as a decode pass does; one copy of the layers for both), the head alone keeps 8 bits, and
    the decision scorer reads its prompts on q4 too instead of an 8-bit copy."""
    runner = build_runner(loaded.model, weights="q4", prompt_weights=prompts)
    assert all(layer.qkv.q8 is None and layer.qkv.int8 is None for layer in runner.layers)
    prompt = encode(loaded, PROMPTS[1])[:12]
    with torch.inference_mode():
        read = runner.forward(runner.new_cache(1, 16, 4096), 0, [prompt], [0], decode=False)
        expected = q4_numbers(loaded).model(torch.tensor([prompt])).logits[0, -1]
        fp32 = loaded.model(torch.tensor([prompt])).logits[0, -1]
    # Position 0 is read on the dense weights (``first_token``), the rest on q4's.
    assert (read[0] - expected).abs().max() < (expected - fp32).abs().max() / 3
    scorer = configured_runner(
        loaded, engine_config(weights="q4", prompt_weights=prompts).for_scoring(0), "scorer"
    )
    assert scorer is not None and scorer.decode_weights == "q4"
    assert all(layer.down.q4 is not None and layer.down.q8 is None for layer in scorer.layers)


def test_prompts_on_q4_without_q4_decode_weights_stay_on_8_bits() -> None:
    assert builder.prompt_bits("q4", "int8") == builder.prompt_bits("auto", "int8") == 8
    assert builder.prompt_bits("q4", "q4") == builder.prompt_bits("auto", "q4") == 4
    assert builder.prompt_bits("decode", "q4") == 8


def test_without_a_compiler_q4_falls_back_to_int8(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("CC", "no-such-compiler")
    assert "no C compiler" in (native.unavailable_reason(str(tmp_path)) or "")
    assert decode_weights("q4") == "int8" and decode_weights("auto") == "int8"


def test_a_cpu_without_avx2_keeps_torchs_kernels(monkeypatch) -> None:
    """The library loads there (its portable path), but the runner does not decode on it."""
    portable = native.Native(native.load().library, 0)
    monkeypatch.setattr(native, "load", lambda build_dir=None: portable)
    assert "portable C path only" in (native.unavailable_reason() or "")
    assert decode_weights("q4") == "int8" and decode_weights("auto") == "int8"


def test_without_torchs_int8_engine_auto_is_int4_not_q4(monkeypatch) -> None:
    """q4 reads prompts on int8: with the kernels built but no int8 engine, neither runs."""
    monkeypatch.setattr(builder, "int8_supported", lambda: False)
    assert decode_weights("auto") == decode_weights("q4") == decode_weights("int8") == "int4"


@needs_simd
def test_drafts_verified_together_get_the_numbers_each_gets_alone(loaded) -> None:
    """Speculation's exactness: a row of 4 tokens (a token and 3 drafts) in one decode pass,
    beside another request, gives bit for bit the logits of 4 single-token steps alone."""
    runner = build_runner(loaded.model, weights="q4", prompt_weights="decode")
    assert runner.native is not None
    a, b = encode(loaded, PROMPTS[0]), encode(loaded, PROMPTS[2])
    drafts = [5, 9, 14, 3]
    with torch.inference_mode():
        cache = runner.new_cache(2, 64, 4096)
        runner.forward(cache, 0, [a], [0], decode=False)
        runner.forward(cache, 1, [b], [0], decode=False)
        together = runner.forward(cache, 0, [drafts, [7]], [len(a), len(b)], decode=True)
        alone = [
            runner.forward(cache, 0, [[token]], [len(a) + i], decode=True)[0]
            for i, token in enumerate(drafts)
        ]
    assert torch.equal(together[:4], torch.stack(alone))


@needs_simd
def test_native_decode_attention_computes_what_torch_does(loaded) -> None:
    """The C attention (``kernels/attention.c``) against torch's, on dense weights (nothing
    rounds after it): the same logits up to float rounding (its exp is a polynomial)."""
    prompt = encode(loaded, PROMPTS[1])
    logits = []
    for kernels in (native.load(), None):
        runner = build_runner(loaded.model, weights="dense")
        runner.native = kernels
        with torch.inference_mode():
            cache = runner.new_cache(2, 64, 4096)
            runner.forward(cache, 0, [prompt, prompt[:9]], [0, 0], decode=False)
            step = [[5, 6, 7], [8]]
            logits.append(runner.forward(cache, 0, step, [len(prompt), 9], decode=True))
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)


@needs_simd
def test_q4_packs_are_made_once_and_mapped_by_later_replicas(loaded, tmp_path) -> None:
    first = build_runner(loaded.model, weights="q4", cache_dir=tmp_path)
    assert len(list(tmp_path.glob("runner-q4-*.pt"))) == 1
    second = build_runner(loaded.model, weights="q4", cache_dir=tmp_path)
    x = torch.randn(2, loaded.model.config.hidden_size)
    assert torch.equal(first.layers[0].qkv(x, True, True), second.layers[0].qkv(x, True, True))
