"""Building a ``Qwen2Runner`` from a loaded HF model: kernel choice, int4 packing, disk cache.

Which weights run where is decided here, at run time, from what the CPU computes natively:

- prefill chunks: the HF parameters as they are (fp32) on CPUs without bf16 compute (AVX2,
  plain AVX-512), a bf16 copy where the CPU has AVX512-BF16 or AMX (~2x faster GEMM there);
  a chunk of at most ``small_prefill_tokens`` tokens runs on the decode weights instead
  (``Qwen2Runner.forward`` says why);
- decode steps (few rows): int4 groupwise when ``weights="int4"``, fbgemm int8 per channel
  when ``weights="int8"``, else the dense weights; ``weights="auto"`` takes int4 where the CPU
  computes bf16 natively (the int4 kernel's activations) and int8 elsewhere (AVX2: int8 decodes
  1.7x faster than int4 there, see weights.py).

int4 packing takes a few seconds per 0.5B parameters, so packed weights are saved once next to
the converted model (``runner-int4-g32-<fingerprint>.pt``) and later replicas load them with
``mmap``: every replica on the machine shares the same page-cache copy.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from serve_app.engine.runner.qwen2 import Layer, Qwen2Runner
from serve_app.engine.runner.weights import (
    INT4_GROUP,
    Linear,
    int4_supported,
    int8_supported,
    quantize_int4,
    quantize_int8,
    stacked,
)

logger = logging.getLogger(__name__)

WEIGHTS = ("auto", "int4", "int8", "dense")


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_bf16_compute() -> bool:
    """AVX512-BF16 or AMX: bf16 GEMMs beat fp32 there; elsewhere bf16 is emulated and slower."""
    flags = cpu_flags()
    return bool({"avx512_bf16", "amx_bf16"} & flags) or torch.backends.cpu.get_cpu_capability() in (
        "AMX",
    )


def prefill_dtype(requested: str = "auto") -> torch.dtype:
    if requested == "auto":
        return torch.bfloat16 if cpu_has_bf16_compute() else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[requested]


def decode_weights(requested: str) -> str:
    """The decode weights ``requested`` means on this CPU (``auto`` resolved; ``int8`` where
    torch has no fbgemm/x86 quantized engine falls back to int4, with a warning)."""
    if requested == "int8" and not int8_supported():
        logger.warning("runner: int8 decode weights need torch's fbgemm/x86 engine; using int4")
        return "int4"
    if requested != "auto":
        return requested
    if cpu_has_bf16_compute() or not int8_supported():
        return "int4"
    return "int8"


def build_runner(
    model: Any,
    *,
    weights: str = "int4",
    dense_dtype: torch.dtype = torch.float32,
    cache_dir: str | Path | None = None,
    small_prefill_tokens: int = 0,
) -> Qwen2Runner:
    """A runner over ``model``'s weights; int4 packs are read from / saved to ``cache_dir``.
    ``small_prefill_tokens``: see ``Qwen2Runner.forward``."""
    if weights not in WEIGHTS:
        raise ValueError(f"unknown runner weights {weights!r}; use one of {WEIGHTS}")
    weights = decode_weights(weights)
    hf_layers = model.model.layers
    parts = [_layer_parts(layer, dense_dtype) for layer in hf_layers]
    head = [(_dense(model.lm_head.weight, dense_dtype), None)]
    packs: dict[str, torch.Tensor] = {}
    if weights == "int4":
        packs = _int4_packs(model, parts, head, cache_dir)
    int8 = weights == "int8"

    def linear(p: list, name: str) -> Linear:
        return Linear(p, _pack(packs, name), _int8(p) if int8 else None)

    layers = []
    for index, (norm_in, qkv, o, norm_post, gate_up, down) in enumerate(parts):
        linears = {"qkv": qkv, "o": o, "gate_up": gate_up, "down": down}
        built = {name: linear(p, f"layers.{index}.{name}") for name, p in linears.items()}
        layers.append(
            Layer(norm_in, built["qkv"], built["o"], norm_post, built["gate_up"], built["down"])
        )
    return Qwen2Runner(model, layers, linear(head, "lm_head"), small_prefill_tokens)


def _int8(parts: list[tuple[torch.Tensor, torch.Tensor | None]]) -> torch.ScriptObject:
    return quantize_int8(stacked([(w.float(), b) for w, b in parts]))


def _dense(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    t = t.detach()
    return t if t.dtype == dtype else t.to(dtype)


def _layer_parts(layer: Any, dtype: torch.dtype) -> tuple:
    attn, mlp = layer.self_attn, layer.mlp

    def part(linear: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        bias = None if linear.bias is None else _dense(linear.bias, dtype)
        return _dense(linear.weight, dtype), bias

    return (
        layer.input_layernorm.weight.detach(),
        [part(attn.q_proj), part(attn.k_proj), part(attn.v_proj)],
        [part(attn.o_proj)],
        layer.post_attention_layernorm.weight.detach(),
        [part(mlp.gate_proj), part(mlp.up_proj)],
        [part(mlp.down_proj)],
    )


def _pack(packs: dict[str, torch.Tensor], name: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    if f"{name}.packed" not in packs:
        return None
    return packs[f"{name}.packed"], packs[f"{name}.scales"]


def _int4_packs(model: Any, parts: list[tuple], head: list, cache_dir: str | Path | None) -> dict:
    matrices: dict[str, list] = {}
    for index, (_, qkv, o, _, gate_up, down) in enumerate(parts):
        for name, p in (("qkv", qkv), ("o", o), ("gate_up", gate_up), ("down", down)):
            matrices[f"layers.{index}.{name}"] = p
    matrices["lm_head"] = head
    matrices = {
        k: v
        for k, v in matrices.items()
        if int4_supported(sum(w.shape[0] for w, _ in v), v[0][0].shape[1])
    }
    path = _pack_path(model, cache_dir)
    if path is None:
        return _pack_all(matrices)
    # One packer per machine: replicas starting together wait for the first one's file.
    with open(path.with_name(f"{path.name}.lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if path.exists():
                try:
                    packs = torch.load(path, mmap=True, weights_only=True)
                    logger.info("runner: int4 weights mapped from %s", path)
                    return packs
                except Exception:
                    logger.warning("runner: unreadable %s; packing again", path, exc_info=True)
            tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
            torch.save(_pack_all(matrices), tmp)
            os.replace(tmp, path)
            logger.info("runner: int4 weights saved to %s", path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return torch.load(path, mmap=True, weights_only=True)  # pages shared with other replicas


def _pack_all(matrices: dict[str, list]) -> dict[str, torch.Tensor]:
    started = time.monotonic()
    packs: dict[str, torch.Tensor] = {}
    total = len(matrices)
    for done, (name, parts) in enumerate(matrices.items(), start=1):
        weight = stacked([(w.float(), b) for w, b in parts])
        packs[f"{name}.packed"], packs[f"{name}.scales"] = quantize_int4(weight)
        if done % 16 == 0 or done == total:
            logger.info("runner: packing int4 weights (group %d): %d/%d", INT4_GROUP, done, total)
    logger.info("runner: int4 packing took %.1fs", time.monotonic() - started)
    return packs


def _pack_path(model: Any, cache_dir: str | Path | None) -> Path | None:
    if cache_dir is None or not Path(cache_dir).is_dir():
        return None
    return Path(cache_dir) / f"runner-int4-g{INT4_GROUP}-{fingerprint(model)}.pt"


def fingerprint(model: Any) -> str:
    """A cheap digest of the weights (shapes and a sample of values): a changed model, or one
    edited in memory after loading, never picks up another's packed weights."""
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        flat = param.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 64)][:64].float()
        digest.update(name.encode())
        digest.update(str(tuple(param.shape)).encode())
        digest.update(sample.numpy().tobytes())
    return digest.hexdigest()[:16]
