"""The runner's 8-bit weight format (``kernels/q8.c``): prompt chunks and scores, rounded once.

llama.cpp's Q8_0: symmetric int8 per row and 32 inputs, one fp16 scale each (8.5 bits per
weight), times activations rounded to int8 per 32 inputs (``native_matmul``). Scales on both
sides follow 32 inputs, not a whole row as fbgemm's int8 does, so one rounding keeps a
prompt's numbers as close as fbgemm's two passes (``weights.int8_linear``'s ``precise``).
"""

from __future__ import annotations

import torch

from serve_app.runner.weights_q4 import GROUP, TILE, supported

BLOCK = TILE * GROUP + TILE * 2  # weights + 128, then fp16 scales (q8.c)

__all__ = ["BLOCK", "supported", "quantize", "dequantize"]


def quantize(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``[N, K]`` in ``q8.c``'s layout: ``[N / 16, K / 32, BLOCK]`` uint8. The
    scale is rounded to fp16 before the values are chosen, so each is the nearest level to
    what the kernel computes."""
    n, k = weight.shape
    if not supported(n, k):
        raise ValueError(f"q8 needs out % {TILE} == 0 and in % {GROUP} == 0, got {n} x {k}")
    groups = weight.detach().float().reshape(n, k // GROUP, GROUP)
    scale = (groups.abs().amax(-1) / 127).clamp(min=2**-24).half()
    q = (groups / scale.float().unsqueeze(-1)).round().clamp(-127, 127).to(torch.int16) + 128
    tiles, g = n // TILE, k // GROUP
    # [tile, row, group, c, j] -> [tile, group, c, row, j]: byte 4r + j of chunk c is q[r][4c + j]
    q = q.to(torch.uint8).reshape(tiles, TILE, g, GROUP // 4, 4).permute(0, 2, 3, 1, 4)
    values = q.reshape(tiles, g, TILE * GROUP)
    scales = scale.reshape(tiles, TILE, g).transpose(1, 2).contiguous().view(torch.uint8)
    return torch.cat([values, scales], dim=-1).contiguous()


def dequantize(packed: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """What ``quantize`` keeps of the matrix, ``[N, K]`` fp32 (for tests and error reports)."""
    tiles, g = out_features // TILE, in_features // GROUP
    values = packed[..., : TILE * GROUP].reshape(tiles, g, GROUP // 4, TILE, 4)
    q = values.permute(0, 3, 1, 2, 4).reshape(out_features, g, GROUP).float() - 128
    scales = packed[..., TILE * GROUP :].contiguous().view(torch.float16)
    scale = scales.transpose(1, 2).reshape(out_features, g).float()
    return (q * scale.unsqueeze(-1)).reshape(out_features, in_features)
