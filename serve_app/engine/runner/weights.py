"""The runner's linear layers: dense or int8 for prefill chunks, q4, int8 or int4 for decode.

Why two forms of the same matrix: a decode step multiplies a few rows by every weight, so it is
bound by the bytes of weights read; int4 reads 1/8 of fp32. A prefill chunk multiplies hundreds
of rows, so it is bound by compute, where torch's int4 CPU kernel is slower than a dense GEMM.
Measured on this AVX2 box, one thread, Qwen2.5-0.5B shapes (git history): the 24 layers'
linears cost ~100 ms per decode step in fp32 and ~60 ms in int4; a 256-row chunk costs 2.6 s
in fp32 and 10 s through the int4 kernel.

int4 goes through ``torch.ops.aten._weight_int4pack_mm_for_cpu``: asymmetric 4-bit with one
(scale, zero) pair per 32 input weights, ``w = (q - 8) * scale + zero``. The kernel takes bf16
activations (fp32 activations hit a scalar path, ~8x slower than fp32 GEMM), so inputs are cast
to bf16 and outputs back to fp32.

int8 goes through fbgemm's dynamic linear (``torch.ops.quantized.linear_dynamic``): symmetric
int8 weights per output channel, activations quantized per call with one scale and zero point
for the whole call. Left alone that makes a row's result depend on the other rows of the call
(a row with large activations coarsens every other row's) and so on what else is batched. So
each row is divided by its own largest magnitude first and multiplied back after, and one
constant input row (+1 and -1 in its first two columns, its output dropped) pins the call's
range to [-1, 1] whatever the rows: every row gets the full int8 range on its own scale
(per-token quantization), and its result is the same alone or in any batch. A row, not two
columns: fbgemm pads K to its blocks, and K + 2 made the 1.5B's packs 1.86 GB instead of 1.49
GB per replica (the 0.5B's: no difference), for the same numbers and step time.

On AVX2 fbgemm's kernel is made for this ISA (VPMADDUBSW), where torch's int4 kernel converts
to bf16 in software: measured on this box, one thread, the 0.5B's decode linears take ~32 ms per
step in int8, ~80 ms in int4 and ~125 ms in fp32 (git history). On AVX512-BF16 with VNNI the
two kernels step about as fast, and int8 follows fp32 far more closely (``prepare`` has the
figures), so int4 is only the fallback where torch has no int8 engine. fbgemm's packed form is
opaque and private to the process, so the int8 values are saved once (``prepare``) and packed
by each replica at start.

q4 (``weights_q4``, the runner's own C kernel) reads 5 bits per weight where int8 reads 8,
and multiplies as integers like fbgemm: where it builds it takes the decode steps, int8 keeping
prompts (decode: 1.6-1.9x int8's tok/s, ``prepare`` has the figures).

Dense weights are the HF module's own tensors (no copy) unless the CPU computes bf16 natively
(AVX512-BF16 or AMX), where a bf16 copy reads prompts ~2x faster (AVX512-BF16 with VNNI, one
thread, 1,024 tokens: 5.1 s against 9.9 s in fp32).
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F

from serve_app.engine.runner.weights_q4 import Q4Kernel

INT4_GROUP = 32


def int4_supported(out_features: int, in_features: int) -> bool:
    """The kernel packs rows in blocks of 16 and needs whole groups along the input."""
    return (
        in_features % INT4_GROUP == 0
        and out_features % 16 == 0
        and hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")
    )


def quantize_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(packed, scales_and_zeros)`` for ``weight`` ``[N, K]`` (min/max affine per group).

    ``scales_and_zeros`` is ``[K / group, N, 2]`` bf16, the layout the kernel expects.
    """
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
    """``(x * smooth) @ W.T + bias`` through fbgemm with per-row activation scales (see the
    module doc): the result of a row does not depend on the other rows.

    ``precise``: a second pass over what the first pass's activation rounding dropped, so the
    activations carry ~14 bits instead of 7 (the weights stay int8). Both go in one kernel call,
    the remainders as more rows: the weights are read once, so a decode step's row costs ~1.2x
    one rounding (0.30 against 0.25 ms at 4,864 x 896, one AVX2 core), a prompt chunk 2x.
    7 bits are coarse for the MLP's down projection, whose input rows peak at 20-57x their RMS
    on the 0.5B: a typical element lands on one of a few levels, and a perturbation in the
    eighth digit (attention summed in another order because other questions share the pass, a
    prefix read in two chunks instead of one) flips enough roundings to move a decision's
    ``noul`` from 0.45 to 0.70. With the second call the same questions agree within 0.002
    (0.0013-0.0018 over six requests on the 0.5B).

    fbgemm's input (the scaled rows, the remainders, the pin row) is written into one buffer
    in place, without ``torch.cat``'s copies: the same bits, and fewer temporaries (1.6x on
    prompts where a process's main thread runs the runner, whose malloc arena trimmed and
    regrew around them; unchanged in the engine's own thread: git history).
    """
    rows, width = x.shape
    count = 2 * rows if precise else rows
    pinned = torch.empty(count + 1, width)
    scaled = pinned[:rows]
    if smooth is None:
        scaled.copy_(x)
    else:
        torch.mul(x, smooth, out=scaled)
    # abs().amax(), not vector_norm(inf): the same values, 12x faster on a 256-row prompt chunk
    # (0.8 -> 0.06 ms at 896 columns, 4.0 -> 0.35 ms at 4,864), ~7% of reading a prompt.
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
    """``y = x @ W.T + b``, where ``W`` may be several matrices stacked on the output axis.

    ``parts`` are the dense ``(weight, bias)`` pieces, often the HF parameters themselves (no
    copy); ``q4`` is the runner's own 4-bit kernel and its pack (``weights_q4``), for decode
    steps only; ``int4`` is ``(packed, scales_and_zeros)`` and ``int8`` fbgemm's packed form
    (``quantize_int8``) of the stacked matrix, times ``1 / smooth`` per input column where
    ``smooth`` is given (``smoothing.py``: the int8 call then multiplies its input by it);
    both add ``quantized_bias``, the stacked bias. q/k/v and gate/up are stacked so a decode
    step makes one kernel call.
    """

    def __init__(
        self,
        parts: list[tuple[torch.Tensor, torch.Tensor | None]],
        int4: tuple[torch.Tensor, torch.Tensor] | None = None,
        int8: torch.ScriptObject | None = None,
        precise: bool = False,
        smooth: torch.Tensor | None = None,
        q4: tuple[Q4Kernel, torch.Tensor] | None = None,
    ) -> None:
        self.parts = parts
        self.int4 = int4
        self.int8 = int8
        self.q4 = q4
        self.precise = precise  # int8: see ``int8_linear``
        self.smooth = smooth
        self.out_features = sum(w.shape[0] for w, _ in parts)
        biases = [b for _, b in parts]
        self.quantized_bias = None if biases[0] is None else torch.cat(biases).float()

    def __call__(self, x: torch.Tensor, quantized: bool, decode: bool = False) -> torch.Tensor:
        """``x`` is ``[rows, in]`` fp32; the result is ``[rows, out]`` fp32. ``quantized``: use
        the int4 or int8 copy when there is one, else the dense weights; ``decode`` (a decode
        step's rows, quantized): the q4 copy first where there is one."""
        if decode and self.q4 is not None:
            kernel, packed = self.q4
            y = kernel.matmul(x, packed, self.out_features)
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
