"""What both of the runner's quantized matmuls (``native_matmul``: q4 and q8) promise on every
path this CPU has: the portable C path (what a CPU without AVX2 runs) agrees with each SIMD
path, and a row's result depends neither on its batch nor on the threads sharing the call."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from serve_app.runner import native, weights_q4, weights_q8
from serve_app.runner.native_matmul import NativeMatmul

pytestmark = pytest.mark.skipif(
    native.library_reason() is not None, reason=f"C kernels: {native.library_reason()}"
)
ISAS = [isa for isa in (0, 1, 2) if native.library_reason() is None and isa <= NativeMatmul().isa]
FORMATS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], str]] = {
    "q4": (weights_q4.quantize, "q4"),
    "q8": (weights_q8.quantize, "q8"),
}


def matmul(kernel: NativeMatmul, form: str) -> Callable[..., torch.Tensor]:
    return getattr(kernel, FORMATS[form][1])


@pytest.mark.parametrize("form", FORMATS)
@pytest.mark.parametrize("isa", ISAS[1:])
def test_every_simd_path_agrees_with_the_portable_one(form: str, isa: int) -> None:
    """On a decode row, a register tile's worth and a ragged prompt chunk: the same integer
    dots, only the order of a group's float sum differs."""
    generator = torch.Generator().manual_seed(11)
    packed = FORMATS[form][0](torch.randn(96, 320, generator=generator) * 0.05)
    portable, simd = matmul(NativeMatmul(isa=0), form), matmul(NativeMatmul(isa=isa), form)
    for rows in (1, 4, 19):
        x = torch.randn(rows, 320, generator=generator) * 2
        torch.testing.assert_close(simd(x, packed, 96), portable(x, packed, 96))


@pytest.mark.parametrize("form", FORMATS)
@pytest.mark.parametrize("isa", ISAS)
def test_a_rows_result_depends_on_neither_its_batch_nor_the_threads(form: str, isa: int) -> None:
    generator = torch.Generator().manual_seed(13)
    packed = FORMATS[form][0](torch.randn(80, 64, generator=generator))
    x = torch.randn(21, 64, generator=generator)
    run = matmul(NativeMatmul(isa=isa), form)
    alone = torch.cat([run(row[None], packed, 80) for row in x])
    for threads in (1, 2, 3, 8):  # 8 > the 5 tiles: some threads get none
        assert torch.equal(run(x, packed, 80, threads=threads), alone)
