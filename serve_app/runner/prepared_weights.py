"""What the runner runs on: a model's weights prepared once (``builder.prepare_weights``).

Plain frozen values, apart from the runner (``qwen2``) and the preparation (``builder``), so
each imports them one way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from serve_app.runner.native import Native
from serve_app.runner.weights import Linear

# A position-0 entry (``Qwen2Runner.first_token``): each layer's (keys, values), the hidden state.
FirstEntry = tuple[tuple[tuple[torch.Tensor, torch.Tensor], ...], torch.Tensor]


@dataclass(frozen=True)
class Layer:
    input_norm: torch.Tensor
    qkv: Linear
    o: Linear
    post_norm: torch.Tensor
    gate_up: Linear
    down: Linear


@dataclass(frozen=True)
class WeightChoice:
    """Which weights a runner reads, resolved for the model's device and this CPU."""

    decode: str  # "q4", "int8", "int4" or "dense": never "auto"
    quantized_prompts: bool  # prompts on the decode weights (position 0 on dense ones)
    dense_dtype: torch.dtype
    precise: tuple[str, ...] = ()  # ``LINEARS`` whose fbgemm activations are rounded twice
    int8_kernel: str = "fbgemm"  # "q8" (the runner's own) or "fbgemm": never "auto"
    prompt_bits: int = 8  # 4: quantized prompts read the q4 decode weights (the head: 8 bits)


@dataclass(frozen=True)
class PreparedWeights:
    """A model's weights as a runner reads them (``prepare_weights``); never changed after."""

    choice: WeightChoice
    layers: tuple[Layer, ...]
    lm_head: Linear
    native: Native | None  # the runner's C kernels, where they build: decode attention
    first_tokens: Mapping[tuple[str, int], FirstEntry] = field(default_factory=dict)
