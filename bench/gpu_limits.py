"""Physical limits for bench.gpu's figures: what the card can move and compute, measured in the
same run, and what a model's decode step and prompt must move and compute.

- **Decode** is bound by memory: each step reads every weight once (the LM head included; the
  input embedding's one row is nothing) and each row's KV so far. The limit is those bytes
  over the card's measured copy bandwidth (bytes read plus bytes written by a large
  device-to-device copy, as a copy kernel sees them).
- **A prompt** is bound by arithmetic: two FLOPs per weight per prompt token for the decoder
  layers' linears, the LM head for the last token only, and causal attention's QK and PV
  products (each query over the columns up to its own). The floor is that over the card's
  measured bf16 matrix rate (an 8192-cube product, as KINDS.md's figure).

Both ceilings are measured, not the datasheet's, so a share of 100% is reachable in principle.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Callable
from typing import Any

import torch

# Bytes the copy moves, each way, and the matrix product's side: large enough that launch
# overhead and L2 (50-60 MB on an H100/H200) do not count; a small size on the CPU (--smoke).
COPY_BYTES = {"cuda": 2 << 30, "cpu": 64 << 20}
MATMUL_SIDE = {"cuda": 8192, "cpu": 512}


@dataclasses.dataclass(frozen=True)
class Card:
    copy_bytes_per_s: float  # read + written
    matmul_flops_per_s: float  # bf16 (fp32 on the CPU's smoke run)


@dataclasses.dataclass(frozen=True)
class ModelCost:
    weight_bytes: int  # read once per decode step
    kv_bytes_per_column: int  # one position's keys and values, every layer, the cache's dtype
    linear_params: int  # the decoder layers' linear weights (two FLOPs each per token)
    head_params: int  # the LM head's (the last prompt token only)
    attention_width: int  # layers * heads * head_dim: QK and PV are 2 FLOPs each per element

    def decode_tps(self, card: Card, streams: int, context: int) -> float:
        """Tokens/s at the bandwidth limit: ``streams`` rows, each over ``context`` columns."""
        step_bytes = self.weight_bytes + streams * context * self.kv_bytes_per_column
        return streams * card.copy_bytes_per_s / step_bytes

    def prompt_seconds(self, card: Card, tokens: int) -> float:
        """The FLOP floor of reading a ``tokens``-long prompt and sampling its first token."""
        linear = 2 * tokens * self.linear_params + 2 * self.head_params
        attention = 2 * 2 * self.attention_width * tokens * (tokens + 1) // 2
        return (linear + attention) / card.matmul_flops_per_s


def model_cost(model: Any, kv_dtype: torch.dtype) -> ModelCost:
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    tied = head.data_ptr() == embed.data_ptr()
    every = sum(p.numel() * p.element_size() for p in model.parameters())
    # Untied: the input embedding's matrix is not read by a step (one row per token is).
    weight_bytes = every if tied else every - embed.numel() * embed.element_size()
    layers = model.model.layers
    linear = sum(m.weight.numel() for m in layers.modules() if isinstance(m, torch.nn.Linear))
    kv_width = config.num_key_value_heads * head_dim
    element = torch.empty((), dtype=kv_dtype).element_size()
    return ModelCost(
        weight_bytes=weight_bytes,
        kv_bytes_per_column=config.num_hidden_layers * 2 * kv_width * element,
        linear_params=linear,
        head_params=head.numel(),
        attention_width=config.num_hidden_layers * config.num_attention_heads * head_dim,
    )


def mean_seconds(work: Callable[[], Any], device: str, repeats: int) -> float:
    """The mean time of ``work`` after two warm-ups, synchronized on a GPU."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    for _ in range(2):
        work()
    sync()
    started = time.perf_counter()
    for _ in range(repeats):
        work()
    sync()
    return (time.perf_counter() - started) / repeats


def measure_card(device: str) -> Card:
    kind = "cuda" if device.startswith("cuda") else "cpu"
    count = COPY_BYTES[kind]
    source = torch.empty(count, dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    copy = mean_seconds(functools.partial(target.copy_, source), device, 10)
    del source, target
    side = MATMUL_SIDE[kind]
    dtype = torch.bfloat16 if kind == "cuda" else torch.float32
    a = torch.randn(side, side, device=device, dtype=dtype)
    b = torch.randn(side, side, device=device, dtype=dtype)
    product = mean_seconds(functools.partial(torch.matmul, a, b), device, 10)
    return Card(copy_bytes_per_s=2 * count / copy, matmul_flops_per_s=2 * side**3 / product)
