"""The runner's 4-bit weight format (``kernels/q4.c``): decode-step linears at llama.cpp's speed.

A decode step's time is the bytes of weights read (see ``weights``). torch's CPU kernels read
8 bits per weight (fbgemm int8) or convert 4-bit groups to bf16 in software (int4); ``q4.c``
does what llama.cpp does: 4-bit weights (asymmetric, an fp16 scale and minimum per 32 inputs:
5 bits per weight in all) times activations rounded to int8 per 32 inputs, multiplied as
integers (``native_matmul.NativeMatmul.q4``).
"""

from __future__ import annotations

import torch

TILE = 16
GROUP = 32
BLOCK = TILE * GROUP // 2 + TILE * 4  # nibbles, then fp16 scales and minimums (q4.c)


def supported(out_features: int, in_features: int) -> bool:
    return out_features % TILE == 0 and in_features % GROUP == 0


def quantize(weight: torch.Tensor, refits: int = 2) -> torch.Tensor:
    """``weight`` ``[N, K]`` in ``q4.c``'s layout: ``[N / 16, K / 32, BLOCK]`` uint8.

    Per row and group of 32 inputs ``w = d * q + mn``, ``q`` in 0..15: from the group's range,
    ``refits`` times ``d`` and ``mn`` refit by least squares to the chosen levels, and the
    levels chosen again (llama.cpp's k-quants search instead). ``d`` and ``mn`` are rounded to
    fp16 before the last choice, so ``q`` is the nearest level to what the kernel computes."""
    n, k = weight.shape
    if not supported(n, k):
        raise ValueError(f"q4 needs out % {TILE} == 0 and in % {GROUP} == 0, got {n} x {k}")
    groups = weight.detach().float().reshape(n, k // GROUP, GROUP)
    low = groups.amin(-1)
    scale = ((groups.amax(-1) - low) / 15).clamp(min=2**-24)
    for _ in range(refits):
        q = _levels(groups, scale, low)
        scale, low = _least_squares(groups, q, scale, low)
    low, scale = low.half(), scale.clamp(min=2**-24).half()
    q = _levels(groups, scale.float(), low.float()).to(torch.uint8)
    tiles, g = n // TILE, k // GROUP
    # [tile, row, group, c, half, j] -> [tile, group, c, row, j, half]: byte 4r + j of chunk c
    # holds q[r][8c + j] (low nibble) and q[r][8c + 4 + j] (high).
    q = q.reshape(tiles, TILE, g, 4, 2, 4).permute(0, 2, 3, 1, 5, 4)
    nibbles = (q[..., 0] | (q[..., 1] << 4)).reshape(tiles, g, TILE * GROUP // 2)

    def per_tile(values: torch.Tensor) -> torch.Tensor:  # [N, G] fp16 -> [tiles, G, 32] bytes
        return values.reshape(tiles, TILE, g).transpose(1, 2).contiguous().view(torch.uint8)

    return torch.cat([nibbles, per_tile(scale), per_tile(low)], dim=-1).contiguous()


def _levels(groups: torch.Tensor, scale: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    return ((groups - low.unsqueeze(-1)) / scale.unsqueeze(-1)).round().clamp(0, 15)


def _least_squares(
    groups: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, low: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(d, mn)`` of each group that minimise ``sum (w - d q - mn)^2`` for levels ``q``;
    a group whose levels are all equal (or whose fit turns ``d`` non-positive) keeps its own."""
    q_mean, w_mean = q.mean(-1, keepdim=True), groups.mean(-1, keepdim=True)
    spread = ((q - q_mean) ** 2).sum(-1)
    fitted = ((q - q_mean) * (groups - w_mean)).sum(-1) / spread.clamp(min=1e-12)
    usable = (spread > 0) & (fitted > 2**-24)
    scale = torch.where(usable, fitted, scale)
    low = torch.where(usable, w_mean.squeeze(-1) - fitted * q_mean.squeeze(-1), low)
    return scale, low


def dequantize(packed: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """What ``quantize`` keeps of the matrix, ``[N, K]`` fp32 (for tests and error reports)."""
    tiles, g = out_features // TILE, in_features // GROUP
    nibbles = packed[..., : TILE * GROUP // 2].reshape(tiles, g, 4, TILE, 4)
    q = torch.stack([nibbles & 15, nibbles >> 4], dim=-1)  # [tile, group, c, row, j, half]
    q = q.permute(0, 3, 1, 2, 5, 4).reshape(out_features, in_features).float()

    def per_row(offset: int) -> torch.Tensor:
        values = packed[..., offset : offset + 2 * TILE].contiguous().view(torch.float16)
        return values.transpose(1, 2).reshape(out_features, g).float()

    scale, low = per_row(TILE * GROUP // 2), per_row(TILE * GROUP // 2 + 2 * TILE)
    q = q.reshape(out_features, g, GROUP)
    return (q * scale.unsqueeze(-1) + low.unsqueeze(-1)).reshape(out_features, in_features)
