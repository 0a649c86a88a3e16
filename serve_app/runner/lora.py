"""LoRA adapters applied per request in the runner: one base model, several adapters.

As in vLLM's and Ray Serve LLM's multi-LoRA serving, a request names an adapter and only its own
tokens get ``x @ A @ B`` added to the base linears' output: requests with different adapters, or
none, share one batch and one copy of the weights (not a merged copy and a second engine).

The adapter is a peft folder (``save_pretrained``'s ``adapter_config.json`` and
``adapter_model.safetensors``), fused as the runner fuses its linears: q/k/v's A matrices side by
side and B matrices block diagonal, likewise gate/up, so each fused linear adds one delta. All is
checked against the base model at engine start (``AdapterError`` names the file): a malformed
folder, or one for another model, never reaches a request.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# Defined beside adapter_path, which raises it too (a builtin adapter that is not there).
from serve_app.models.loader import AdapterError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# The runner's fused linears and, in output order, the HF modules each stacks.
FUSED = {
    "qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "o": ("self_attn.o_proj",),
    "gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "down": ("mlp.down_proj",),
}
MODULES = {module.rsplit(".", 1)[1]: module for parts in FUSED.values() for module in parts}
# peft options that change what an adapter computes beyond x @ A @ B * scale: refused.
UNSUPPORTED = (
    "use_dora",
    "modules_to_save",
    "rank_pattern",
    "alpha_pattern",
    "lora_bias",
    "fan_in_fan_out",
    "layer_replication",
    "use_qalora",
    "alora_invocation_tokens",
    "arrow_config",
    "kasa_config",
    "monteclora_config",
)
# An adapter that names its base this way (``training.export`` writes it) is checked against
# the folder the model was loaded from: the same shapes do not make the same model.
EMBEDDED_BASE = "embedded:"


@dataclass(frozen=True)
class LoraDelta:
    """One fused linear's low-rank update: ``x @ a @ b`` (``a`` ``[in, r]``, ``b`` ``[r, out]``
    with the adapter's scale folded in)."""

    a: torch.Tensor
    b: torch.Tensor

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x @ self.a) @ self.b


@dataclass(frozen=True)
class LoraAdapter:
    """An adapter fused for the runner: ``deltas[(layer, fused linear)]``."""

    name: str
    path: Path
    deltas: Mapping[tuple[int, str], LoraDelta]


def load_adapter(name: str, path: Path, model: Any, device: torch.device) -> LoraAdapter:
    """``path``'s adapter, checked against ``model`` (an HF Qwen2 module) and fused."""
    config = _read_config(path)
    _check_base(path, config, model)
    rank, alpha = int(config.get("r", 0)), float(config.get("lora_alpha", 0))
    if rank <= 0:
        raise AdapterError(path, f"rank r={config.get('r')!r} is not a positive integer")
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    weights = _read_weights(path)
    modules = _modules_of(model)
    found: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for key, a in weights.items():
        if ".lora_B." in key:
            continue
        target, layer, module = _target(path, key, modules)
        b = weights.get(key.replace(".lora_A.", ".lora_B."))
        if b is None:
            raise AdapterError(path, f"{key} has no lora_B")
        weight = target.weight
        if a.shape != (rank, weight.shape[1]) or b.shape != (weight.shape[0], rank):
            raise AdapterError(
                path,
                f"{key}: A {tuple(a.shape)} and B {tuple(b.shape)} do not fit the base model's "
                f"{tuple(weight.shape)} at rank {rank}: an adapter of another model",
            )
        found[(layer, module)] = (a, b)
    if not found:
        raise AdapterError(path, f"no lora_A/lora_B weights in {WEIGHTS_FILE}")
    deltas = {
        (layer, fused): _fuse(found, modules, layer, parts, scale, device)
        for layer in sorted({layer for layer, _ in found})
        for fused, parts in FUSED.items()
        if any((layer, part) in found for part in parts)
    }
    return LoraAdapter(name=name, path=path, deltas=deltas)


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = json.loads((path / CONFIG_FILE).read_text())
    except (OSError, ValueError) as error:
        raise AdapterError(path, f"cannot read {CONFIG_FILE}: {error}") from None
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(path, f"{CONFIG_FILE} is not a LoRA adapter's config")
    unsupported = [key for key in UNSUPPORTED if config.get(key)]
    if config.get("bias", "none") != "none":
        unsupported.append("bias")
    if unsupported:
        raise AdapterError(path, f"unsupported LoRA options: {', '.join(unsupported)}")
    return config


def _check_base(path: Path, config: dict[str, Any], model: Any) -> None:
    base = str(config.get("base_model_name_or_path") or "")
    loaded_from = Path(str(getattr(model.config, "_name_or_path", ""))).name
    if base.startswith(EMBEDDED_BASE) and base.removeprefix(EMBEDDED_BASE) != loaded_from:
        raise AdapterError(path, f"built for {base}, not the model in {loaded_from!r}")


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        weights = load_file(str(path / WEIGHTS_FILE))
    except (OSError, SafetensorError) as error:
        raise AdapterError(path, f"cannot read {WEIGHTS_FILE}: {error}") from None
    return {key: tensor.float() for key, tensor in weights.items()}


def _modules_of(model: Any) -> dict[tuple[int, str], Any]:
    return {
        (index, module): layer.get_submodule(module)
        for index, layer in enumerate(model.model.layers)
        for module in MODULES.values()
    }


def _target(path: Path, key: str, modules: Mapping[tuple[int, str], Any]) -> tuple[Any, int, str]:
    """The base module a ``...layers.N.<module>.lora_A.weight`` key adapts."""
    head, _, tail = key.partition(".lora_A.")
    parts = head.split(".")
    try:
        at = parts.index("layers")
        layer, module = int(parts[at + 1]), MODULES[parts[-1]]
    except (ValueError, IndexError, KeyError):
        raise AdapterError(path, f"{key} adapts no decoder linear the runner has") from None
    if tail != "weight" or (layer, module) not in modules:
        raise AdapterError(path, f"{key} adapts no layer of the base model: another model")
    return modules[(layer, module)], layer, module


def _fuse(
    found: Mapping[tuple[int, str], tuple[torch.Tensor, torch.Tensor]],
    modules: Mapping[tuple[int, str], Any],
    layer: int,
    parts: Sequence[str],
    scale: float,
    device: torch.device,
) -> LoraDelta:
    """One fused linear's delta: the parts' A side by side, their B block diagonal (a part
    the adapter leaves alone contributes rank 0)."""
    a_blocks, b_blocks = [], []
    for part in parts:
        out_features, in_features = modules[(layer, part)].weight.shape
        a, b = found.get((layer, part), (torch.zeros(0, in_features), torch.zeros(out_features, 0)))
        a_blocks.append(a.t())
        b_blocks.append(b.t() * scale)
    a = torch.cat(a_blocks, dim=1).contiguous().to(device)
    b = torch.block_diag(*b_blocks).contiguous().to(device)
    return LoraDelta(a=a, b=b)


class LoraBatch:
    """Which of a pass's flattened tokens get which adapter: ``groups`` of (adapter, token
    indices), indices None where every token of the pass has that adapter."""

    def __init__(self, groups: Sequence[tuple[LoraAdapter, torch.Tensor | None]]) -> None:
        self.groups = groups

    @classmethod
    def of_rows(
        cls, adapters: Sequence[LoraAdapter | None], row_of: torch.Tensor
    ) -> LoraBatch | None:
        """``adapters[b]``: row ``b``'s adapter or None; ``row_of``: each token's row."""
        named = {id(a): a for a in adapters if a is not None}
        if not named:
            return None
        if len(named) == 1 and all(a is not None for a in adapters):
            return cls([(next(iter(named.values())), None)])
        groups = []
        for adapter in named.values():
            rows = [b for b, a in enumerate(adapters) if a is adapter]
            wanted = torch.tensor(rows, device=row_of.device)
            groups.append((adapter, torch.isin(row_of, wanted).nonzero().flatten()))
        return cls(groups)

    def add(self, y: torch.Tensor, x: torch.Tensor, layer: int, fused: str) -> torch.Tensor:
        """``y`` (the base linear's output for input ``x``) plus each group's delta."""
        for adapter, tokens in self.groups:
            delta = adapter.deltas.get((layer, fused))
            if delta is None:
                continue
            y = y + delta(x) if tokens is None else y.index_add(0, tokens, delta(x[tokens]))
        return y
