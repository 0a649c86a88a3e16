"""The runner's linear layers: dense or int8 for prefill chunks, q4, int8 or int4 for decode.

Two forms of one matrix: a decode step multiplies a few rows by every weight (bound by the bytes
read), a prefill chunk hundreds (bound by compute, where torch's int4 CPU kernel is slower than
a dense GEMM; figures: git history).

int4 (``torch.ops.aten._weight_int4pack_mm_for_cpu``): asymmetric, one (scale, zero) pair per 32
inputs, ``w = (q - 8) * scale + zero``; activations cast to bf16 (fp32 hits a far slower path).

int8 (fbgemm's ``torch.ops.quantized.linear_dynamic``): symmetric weights per output channel,
activations on one scale and zero point per call, so a row's result would depend on what else
is batched (large activations coarsen the other rows). So each row is divided by its own largest
magnitude and multiplied back after, and one constant input row (+1 and -1 in its first two
columns, output dropped) pins the call's range to [-1, 1]: per-token quantization, the same
alone or in any batch. A row, not two columns: fbgemm pads K to its blocks (K + 2: the 1.5B's
packs a quarter larger). On AVX2 fbgemm suits the ISA (VPMADDUBSW) where torch's int4 kernel
converts to bf16 in software, so int8 decodes faster than int4 (both beat fp32); on AVX512-BF16
with VNNI they step alike and int8 follows fp32 far more closely (``builder`` has the figures),
so int4 is only the fallback where torch has no int8 engine. fbgemm's packs are opaque and
private to the process: the int8 values are saved once (``builder``) and packed by each replica.

q4 (``weights_q4``, the runner's own C kernel: 5 bits per weight, integer multiplies) takes the
decode steps where it builds (faster than int8), int8 keeping prompts. Dense weights are the HF
module's own tensors (no copy) unless the CPU computes bf16 natively (AVX512-BF16 or AMX), where
a bf16 copy reads prompts much faster than fp32.
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F

from serve_app.runner.native_matmul import NativeMatmul

INT4_GROUP = 32


def int4_supported(out_features: int, in_features: int) -> bool:
    """The kernel packs rows in blocks of 16 and needs whole groups along the input."""
    return (
        in_features % INT4_GROUP == 0
        and out_features % 16 == 0
        and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")
    )


def quantize_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(packed, scales_and_zeros)`` for ``weight`` ``[N, K]`` (min/max affine per group);
    ``scales_and_zeros`` is ``[K / group, N, 2]`` bf16, the layout the kernel expects."""
    n, k = weight.shape
    groups = weight.detach().float().reshape(n, k // INT4_GROUP, INT4_GROUP)
    low = groups.amin(-1, keepdim=True)
    high = groups.amax(-1, keepdim=True)
    scale = ((high - low) / 15).clamp(min=1e-8)
    q = ((groups - low) / scale).round().clamp(0, 15).to(torch.int32).reshape(n, k)
    zero = low + 8 * scale
    scales_and_zeros = torch.cat([scale, zero], dim=-1).transpose(0, 1).contiguous()
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    return packed, scales_and_zeros.to(torch.bfloat16)


def int8_supported() -> bool:
    return hasattr(torch.ops.quantized, "linear_dynamic") and any(
        engine in torch.backends.quantized.supported_engines for engine in ("x86", "fbgemm")
    )


def quantize_int8(weight: torch.Tensor) -> torch.ScriptObject:
    """fbgemm's packed form of ``weight`` ``[N, K]``: ``prepack_int8(*int8_values(weight))``."""
    return prepack_int8(*int8_values(weight))


def int8_values(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scales)``: ``weight`` ``[N, K]`` as int8, symmetric with one fp64 scale per row."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / 127).clamp(min=1e-8).double()
    q = (w / scales.unsqueeze(1).float()).round().clamp(-127, 127).to(torch.int8)
    return q, scales


def prepack_int8(q: torch.Tensor, scales: torch.Tensor) -> torch.ScriptObject:
    """fbgemm's packed form of ``int8_values``' output (no bias: ``int8_linear`` adds it). The
    pack is fbgemm's own copy: ``q`` may be a mapped file that is released afterwards."""
    zeros = torch.zeros(q.shape[0], dtype=torch.long)
    with warnings.catch_warnings():  # quantized tensors are deprecated in favour of torchao
        warnings.simplefilter("ignore")
        weight = torch._make_per_channel_quantized_tensor(q, scales, zeros, 0)
        return torch.ops.quantized.linear_prepack(weight, None)


# fbgemm's activation grid for a call pinned to [-1, 1] with reduce_range (scale 2/127, zero
# point 64): k * STEP, k = round-half-even(x / STEP), -64..64 for |x| <= 1.
ACTIVATION_STEP = 2 / 127


@torch.no_grad()  # fbgemm's kernel has no gradient; the buffer's out= ops refuse autograd
def int8_linear(
    x: torch.Tensor,
    packed: torch.ScriptObject,
    bias: torch.Tensor | None,
    precise: bool = False,
    smooth: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(x * smooth) @ W.T + bias`` through fbgemm with per-row activation scales (module doc):
    a row's result does not depend on the other rows. ``precise``: a second pass over what the
    first pass's rounding dropped (~14-bit activations instead of 7, weights still int8), as
    more rows of the same call so the weights are read once (a decode row costs little more, a
    prompt chunk twice). 7 bits are coarse for the MLP's down projection, whose input rows peak
    at tens of times their RMS: an eighth-digit change (attention summed in another order beside
    other questions, a prefix read in two chunks) flips enough roundings to move a decision's
    ``noul`` far; ``precise`` holds it to a few thousandths. fbgemm's input (scaled rows,
    remainders, pin row) is written in place into one buffer, not ``torch.cat``'d: the same
    bits, fewer temporaries (faster prompts where a process's main thread runs the runner, its
    malloc arena trimming and regrowing around them)."""
    rows, width = x.shape
    count = 2 * rows if precise else rows
    pinned = torch.empty(count + 1, width)
    scaled = pinned[:rows]
    if smooth is None:
        scaled.copy_(x)
    else:
        torch.mul(x, smooth, out=scaled)
    # abs().amax(), not vector_norm(inf): the same values, far faster on prompt chunks.
    peak = scaled.abs().amax(dim=1, keepdim=True).clamp_(min=1e-30)
    scaled.div_(peak)
    if precise:
        # If fbgemm rounded an element otherwise (a tie), that element keeps one-pass error.
        remainder = pinned[rows:count]
        torch.div(scaled, ACTIVATION_STEP, out=remainder).round_().mul_(ACTIVATION_STEP)
        torch.sub(scaled, remainder, out=remainder).div_(ACTIVATION_STEP / 2)
    pinned[count] = _pin_row(width)
    y = torch.ops.quantized.linear_dynamic(pinned, packed, True)
    y = y[:rows].add_(y[rows:count], alpha=ACTIVATION_STEP / 2) if precise else y[:rows]
    return y.mul_(peak) if bias is None else torch.addcmul(bias, y, peak)


@functools.cache
def _pin_row(width: int) -> torch.Tensor:
    """fbgemm's call range pinned to exactly [-1, 1] by one constant input row."""
    row = torch.zeros(width)
    row[:2] = torch.tensor([1.0, -1.0])
    return row


def dequantize_int4_reference(weight: torch.Tensor) -> torch.Tensor:
    """What ``quantize_int4`` keeps of ``weight``, as fp32 (for tests and error reports)."""
    eye = torch.eye(weight.shape[1], dtype=torch.bfloat16)
    packed, sz = quantize_int4(weight)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, packed, INT4_GROUP, sz).float().t()


class Linear:
    """``y = x @ W.T + b``, ``W`` maybe several matrices stacked on the output axis (q/k/v and
    gate/up: one kernel call per decode step).

    ``parts``: the dense ``(weight, bias)`` pieces, often the HF parameters (no copy); ``q4``:
    the C kernel and its pack (``weights_q4``), decode steps only; ``q8``: the C kernel and its
    pack (``weights_q8``), the 8-bit weights where it runs (in place of ``int8``); ``int4``:
    ``(packed, scales_and_zeros)``; ``int8``: fbgemm's pack (``quantize_int8``) of the
    stacked matrix times ``1 / smooth`` per input column where ``smooth`` is given
    (``smoothing``: the int8 call then multiplies its input by it). The quantized forms add
    ``quantized_bias``.
    """

    def __init__(
        self,
        parts: list[tuple[torch.Tensor, torch.Tensor | None]],
        int4: tuple[torch.Tensor, torch.Tensor] | None = None,
        int8: torch.ScriptObject | None = None,
        precise: bool = False,
        smooth: torch.Tensor | None = None,
        q4: tuple[NativeMatmul, torch.Tensor] | None = None,
        q8: tuple[NativeMatmul, torch.Tensor] | None = None,
    ) -> None:
        self.parts = parts
        self.int4 = int4
        self.int8 = int8
        self.q4 = q4
        self.q8 = q8
        self.precise = precise  # int8: see ``int8_linear``
        self.smooth = smooth
        self.out_features = sum(w.shape[0] for w, _ in parts)
        biases = [b for _, b in parts]
        self.quantized_bias = None if biases[0] is None else torch.cat(biases).float()

    def __call__(self, x: torch.Tensor, quantized: bool, decode: bool = False) -> torch.Tensor:
        """``x`` is ``[rows, in]`` fp32; the result is ``[rows, out]`` fp32. ``quantized``: use
        the q8, int8 or int4 copy when there is one (q4 where it has no 8-bit one), else the
        dense weights; ``decode`` (a decode step's rows, quantized): the q4 copy first where
        there is one."""
        eight_bit = self.q8 is not None or self.int8 is not None
        if self.q4 is not None and (decode or (quantized and not eight_bit)):
            kernel, packed = self.q4
            y = kernel.q4(x, packed, self.out_features)
            return y if self.quantized_bias is None else y.add_(self.quantized_bias)
        if quantized and self.q8 is not None:
            kernel, packed = self.q8
            y = kernel.q8(x, packed, self.out_features)
            return y if self.quantized_bias is None else y.add_(self.quantized_bias)
        if quantized and self.int8 is not None:
            return int8_linear(x, self.int8, self.quantized_bias, self.precise, self.smooth)
        if quantized and self.int4 is not None:
            packed, sz = self.int4
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(
                x.to(torch.bfloat16), packed, INT4_GROUP, sz
            )
            y = y.float()
            return y if self.quantized_bias is None else y.add_(self.quantized_bias)
        dtype = self.parts[0][0].dtype
        xd = x.to(dtype)
        outs = [F.linear(xd, w, b) for w, b in self.parts]
        y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        return y.float()


def stacked(parts: list[tuple[torch.Tensor, torch.Tensor | None]]) -> torch.Tensor:
    """The parts' weights as one ``[sum(N), K]`` matrix (what int4 quantizes)."""
    weights = [w for w, _ in parts]
    return weights[0] if len(weights) == 1 else torch.cat(weights, dim=0)
