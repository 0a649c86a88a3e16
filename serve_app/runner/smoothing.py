"""Smoothing before int8: each linear's input channels rescaled so int8 rows lose less.

fbgemm rounds each activation row to 7 bits on one scale (``weights.int8_linear``), and Qwen's
linears see a few channels tens of times larger than the rest in every token, so the rest land
on a handful of levels. SmoothQuant (Xiao et al. 2023) moves part of that range into the
weights, which int8 rounds per output row and barely notice: ``x @ W.T == (x / s) @ (W * s).T``
with, per input channel j, ``s_j = peak|x_j| ** ALPHA / peak|W_:j| ** (1 - ALPHA)``; the
weights are quantized as ``W * s`` once, and a call multiplies its rows by ``1 / s``. The peaks
come from reading ``data/calibration.txt`` on the dense weights when the int8 weights are made
(the text is part of their file's format: changing it needs a new version). ALPHA 0.5 won back
most of what int8 prompts lost on FIM first lines (``bench.fim_quality``; docs/benchmarks.md,
"Figures behind the defaults"). fbgemm's int8 only: the runner's q8 (``weights_q8``) rounds
activations per 32 inputs, so an outlier channel coarsens its own group, not the row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

CALIBRATION = Path(__file__).with_name("data") / "calibration.txt"
# Tokens of the calibration text read (its whole length for the embedded models' tokenizer).
CALIBRATION_TOKENS = 2048
CHUNK = 512  # tokens per forward while measuring
ALPHA = 0.5
# Bounds on s: a channel that never fires, or a weight column of zeros, must not scale its
# partner by orders of magnitude.
LIMITS = (1e-3, 1e3)


def calibration_ids(tokenizer: Any) -> list[int]:
    """The calibration text as ``tokenizer``'s ids (at most ``CALIBRATION_TOKENS``); none
    without a tokenizer (int8 then stays unsmoothed)."""
    if tokenizer is None:
        return []
    return list(tokenizer.encode(CALIBRATION.read_text()))[:CALIBRATION_TOKENS]


def input_peaks(model: Any, ids: list[int]) -> dict[str, torch.Tensor]:
    """The largest magnitude each input channel of each linear reaches while ``model`` reads
    ``ids``, by the runner's linear names (``layers.<i>.<qkv|o|gate_up|down>``, ``lm_head``).
    q/k/v and gate/up read the same input: their first part's is measured."""
    peaks: dict[str, torch.Tensor] = {}

    def hook(name: str) -> Any:
        def record(_module: Any, inputs: tuple[torch.Tensor, ...]) -> None:
            x = inputs[0].detach().float()
            peak = x.reshape(-1, x.shape[-1]).abs().amax(0)
            peaks[name] = torch.maximum(peaks[name], peak) if name in peaks else peak

        return record

    modules = {"lm_head": model.lm_head}
    for index, layer in enumerate(model.model.layers):
        modules |= {
            f"layers.{index}.qkv": layer.self_attn.q_proj,
            f"layers.{index}.o": layer.self_attn.o_proj,
            f"layers.{index}.gate_up": layer.mlp.gate_proj,
            f"layers.{index}.down": layer.mlp.down_proj,
        }
    handles = [module.register_forward_pre_hook(hook(name)) for name, module in modules.items()]
    try:
        with torch.inference_mode():
            for start in range(0, len(ids), CHUNK):
                model(input_ids=torch.tensor([ids[start : start + CHUNK]]), use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    return peaks


def smoothing(peak: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``s`` (``[K]``) for a linear whose input channels reach ``peak`` and whose stacked
    weight is ``weight`` ``[N, K]``."""
    columns = weight.detach().float().abs().amax(0).clamp(min=1e-8)
    s = peak.float().clamp(min=1e-8) ** ALPHA / columns ** (1 - ALPHA)
    return s.clamp(*LIMITS)
