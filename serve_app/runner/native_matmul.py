"""The runner's own quantized matmuls (``kernels/q4.c``, ``kernels/q8.c``), one entry for both.

Weights in the runner's formats (``weights_q4``: 4-bit decode weights; ``weights_q8``: 8-bit
prompt weights), activations rounded to int8 per 32 inputs inside the call, integer multiplies
on AVX512-VNNI where the CPU has it, else AVX2, else portable C (tests; the runner keeps
torch's kernels there, as without a compiler: ``native.unavailable_reason``). ``native`` builds
and loads the library. A call of many rows (a prompt chunk) shares its output tiles among
torch's intra-op threads; the result is the same for any count.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from serve_app.runner.native import ISA_NAMES, KernelUnavailable, load

# Calls of at least this many rows share their tiles among threads: a thread costs tens of
# microseconds to start, a decode step's call of a few rows less than that of work per thread.
PARALLEL_ROWS = 16


class NativeMatmul:
    """``isa``: force a path the CPU has (0 portable C, 1 AVX2, 2 AVX512-VNNI; tests and
    benchmarks), else the best one."""

    def __init__(self, build_dir: str | None = None, isa: int | None = None) -> None:
        native = load(build_dir)
        if isa is not None and not 0 <= isa <= native.isa:
            raise KernelUnavailable(f"this CPU runs up to {ISA_NAMES[native.isa]}, not {isa}")
        self.library = native.library
        self.isa = native.isa if isa is None else isa

    @property
    def isa_name(self) -> str:
        return ISA_NAMES[self.isa]

    def q4(
        self, x: torch.Tensor, packed: torch.Tensor, out_features: int, threads: int | None = None
    ) -> torch.Tensor:
        """``x`` ``[rows, in]`` times a ``weights_q4`` pack of ``[out, in]``, transposed: fp32."""
        return self._call(self.library.q4_matmul, x, packed, out_features, threads)

    def q8(
        self, x: torch.Tensor, packed: torch.Tensor, out_features: int, threads: int | None = None
    ) -> torch.Tensor:
        """``x`` ``[rows, in]`` times a ``weights_q8`` pack of ``[out, in]``, transposed: fp32."""
        return self._call(self.library.q8_matmul, x, packed, out_features, threads)

    def _call(
        self,
        function: Callable[..., int],
        x: torch.Tensor,
        packed: torch.Tensor,
        out_features: int,
        threads: int | None,
    ) -> torch.Tensor:
        """``threads``: how many share the call (default: torch's intra-op threads from
        ``PARALLEL_ROWS`` rows on, else one)."""
        x = x.float().contiguous()
        rows, in_features = x.shape
        if threads is None:
            threads = torch.get_num_threads() if rows >= PARALLEL_ROWS else 1
        y = torch.empty(rows, out_features)
        status = function(
            packed.data_ptr(), out_features, in_features, x.data_ptr(), rows, y.data_ptr(),
            self.isa, threads,
        )  # fmt: skip
        if status != 0:
            raise MemoryError("quantized matmul: out of memory for the activations' int8 copy")
        return y
