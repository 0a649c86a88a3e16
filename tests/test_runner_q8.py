"""The runner's 8-bit prompt kernel (``weights_q8``, ``kernels/q8.c``): it computes exactly the
math it documents on every path the CPU has (portable C included), a row's result depends
neither on its batch nor on the threads sharing the call, and a runner reads prompts on it
from one mapped file."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from serve_app.runner import native, weights_q8
from serve_app.runner.builder import build_runner
from serve_app.runner.native_matmul import NativeMatmul
from tests.runner_support import PROMPTS, encode

pytestmark = pytest.mark.skipif(
    native.library_reason() is not None, reason=f"C kernels: {native.library_reason()}"
)
ISAS = [isa for isa in (0, 1, 2) if native.library_reason() is None and isa <= NativeMatmul().isa]


def reference(x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    """q8.c's documented math in float64: activations rounded to int8 per 32 inputs."""
    weight = weights_q8.dequantize(packed, n, x.shape[1]).double()
    groups = x.double().reshape(x.shape[0], -1, 32)
    peak = groups.abs().amax(-1, keepdim=True)
    rounded = (groups * 127 / peak.clamp(min=1e-30)).round() * peak / 127
    return rounded.reshape(x.shape) @ weight.t()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(("n", "k", "rows"), [(16, 32, 1), (48, 96, 3), (64, 160, 6), (32, 64, 21)])
def test_kernel_computes_its_documented_math(isa: int, n: int, k: int, rows: int) -> None:
    generator = torch.Generator().manual_seed(n + k + rows)
    weight = torch.randn(n, k, generator=generator) * 0.05
    weight[3, :32] = 0  # an all-zero weight group
    x = torch.randn(rows, k, generator=generator) * 3
    x[0, :32] = 0  # an all-zero activation group: scale 0, no division by it
    packed = weights_q8.quantize(weight)
    y = NativeMatmul(isa=isa).q8(x, packed, n)
    torch.testing.assert_close(y.double(), reference(x, packed, n), rtol=1e-5, atol=1e-5)


def test_weights_are_within_half_a_step_of_their_groups_scale() -> None:
    weight = torch.randn(32, 128, generator=torch.Generator().manual_seed(23))
    kept = weights_q8.dequantize(weights_q8.quantize(weight), 32, 128)
    step = weight.reshape(32, 4, 32).abs().amax(-1, keepdim=True) / 127
    assert ((kept - weight).reshape(32, 4, 32).abs() <= step * 0.5 + 1e-3 * step).all()


def test_shapes_the_kernel_cannot_take_are_refused() -> None:
    with pytest.raises(ValueError, match="q8 needs"):
        weights_q8.quantize(torch.zeros(24, 64))


def test_the_kernels_path_can_be_capped_for_a_comparison(monkeypatch) -> None:
    """$RUNNER_KERNEL_ISA measures an AVX2-only CPU's kernels on an AVX-512 one; the portable
    path is never used by a runner (``unavailable_reason``); a name it does not know fails."""
    best = native.load().isa
    monkeypatch.setenv(native.ISA_CAP_VARIABLE, "avx2")
    assert native.load().isa == min(best, 1) and NativeMatmul().isa == min(best, 1)
    monkeypatch.setenv(native.ISA_CAP_VARIABLE, "scalar")
    assert native.load().isa == 0 and "portable C" in (native.unavailable_reason() or "")
    monkeypatch.setenv(native.ISA_CAP_VARIABLE, "neon")
    with pytest.raises(native.KernelUnavailable, match="use one of"):
        native.load()


needs_simd = pytest.mark.skipif(
    native.unavailable_reason() is not None, reason=f"C kernels: {native.unavailable_reason()}"
)


@needs_simd
def test_a_runner_reads_prompts_on_q8_from_one_mapped_file(loaded, tmp_path) -> None:
    """auto on a CPU the kernels run on: the layers' 8-bit weights are q8 (no fbgemm pack, a
    private copy per replica), from a file later replicas map: shared pages. A prompt read on
    them stays close to the dense weights' logits."""
    runners = [
        build_runner(loaded.model, weights="q4", prompt_weights="decode", cache_dir=tmp_path)
        for _ in range(2)  # the first saves the file, the second maps it
    ]
    (saved,) = tmp_path.glob("runner-q8-v1-*.pt")
    assert str(saved) in Path("/proc/self/maps").read_text()
    layer = runners[1].layers[0]
    assert layer.down.q8 is not None and layer.down.int8 is None and layer.qkv.q8 is not None
    dense = build_runner(loaded.model, weights="dense")
    prompt = encode(loaded, PROMPTS[1])[:24]
    with torch.inference_mode():
        got, want = (
            r.forward(r.new_cache(1, 32, 4096), 0, [prompt], [0], decode=False)
            for r in (runners[1], dense)
        )
    assert (got - want).abs().max() < want.abs().max() * 0.05


def test_q8_asked_for_where_the_kernels_cannot_run_is_fbgemm(monkeypatch, caplog) -> None:
    """A CPU without AVX2 (the portable path only) reads its 8-bit weights on fbgemm, auto or
    asked for, with a warning when asked for."""
    from serve_app.runner import builder

    portable = native.Native(native.load().library, 0)
    monkeypatch.setattr(native, "load", lambda build_dir=None: portable)
    assert builder.resolved_int8_kernel("auto") == "fbgemm"
    assert builder.resolved_int8_kernel("q8") == "fbgemm"
    assert "q8 weights unavailable" in caplog.text
    assert builder.resolved_int8_kernel("fbgemm") == "fbgemm"
