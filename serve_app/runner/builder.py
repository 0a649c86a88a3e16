"""A model's weights made ready for the runner, once: ``prepare_weights`` returns them, and the
runner is built from them and never changed after.

Which weights run where is decided at run time, from what the CPU computes natively
(``choose_weights``, the one place; its figures per CPU: docs/benchmarks.md, "Figures behind
the defaults"):

- decode steps (few rows): the runner's own 4-bit kernel (``weights_q4``; prompts and scores
  on the same weights, its LM head on 8 bits) wherever torch has its fbgemm/x86 int8 engine
  and the runner's C kernels build (``native``), 8 bits where only the first holds, torch's
  int4 elsewhere; or what ``weights`` names;
- 8 bits (prompts and scores on int8 or with ``prompt_weights: decode``, q4's LM head): the
  runner's q8 (``weights_q8``: a scale per 32 inputs, rounded once, one mapped file every
  replica shares) where its C kernels run on SIMD, else fbgemm's int8 per channel (a private
  pack per replica); or what ``int8_kernel`` names;
- prompts: on the decode weights where those are quantized (faster than fp32 GEMM, at the
  same measured quality), the prompt's first token on the dense weights
  (``Qwen2Runner.first_token``); elsewhere on the dense weights: the HF parameters as they are
  (fp32) on CPUs without bf16 compute, a bf16 copy where the CPU has AVX512-BF16 or AMX.

On a CUDA GPU (the weights' device, ``model_device``) none of that applies: the decode and
prompt weights are the dense ones, in the model's own dtype unless ``prefill_dtype`` names
another, and int4/int8, CPU kernels, are refused with ``DeviceError``. The quantized weights
are saved once per machine next to the converted model (``packs``), and with prompts on the
decode weights the first-position entries of the tokenizer's special tokens too
(``runner-first-<dtype>-<fingerprint>.pt``: the tokens prompts start with).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from serve_app.engine_config import EngineConfig
from serve_app.models.loader import DeviceError
from serve_app.runner import native
from serve_app.runner.graphs import DecodeGraphs
from serve_app.runner.lora import LoraAdapter, load_adapter
from serve_app.runner.native_matmul import NativeMatmul
from serve_app.runner.packs import (
    INT8_FILE,
    Q4_FILE,
    Q8_FILE,
    UNSMOOTHED_INT8_FILE,
    cache_path,
    cached,
    int4_packs,
    int8_packs,
    q4_packs,
    q8_packs,
)
from serve_app.runner.pages import page_out
from serve_app.runner.prepared_weights import (
    FirstEntry,
    Layer,
    PreparedWeights,
    WeightChoice,
)
from serve_app.runner.qwen2 import Qwen2Runner, norm_weight, unsupported_reason
from serve_app.runner.smoothing import calibration_ids
from serve_app.runner.weights import Linear, int8_supported

logger = logging.getLogger(__name__)

WEIGHTS = ("auto", "q4", "int4", "int8", "dense")
INT8_KERNELS = ("auto", "q8", "fbgemm")
PROMPT_WEIGHTS = ("auto", "dense", "decode", "q4")
CPU = torch.device("cpu")
LINEARS = ("qkv", "o", "gate_up", "down", "lm_head")
# int8 linears whose activations are rounded twice (``int8_linear``'s ``precise``) when a runner
# generates: the down projection (inputs peaking at tens of times their RMS, in no fixed
# channel) takes most of the rounding error away, q/k/v and the head are cheap to add (the head
# reads one row per prompt chunk), gate/up is the largest matrix for the least gain
# (the measurement: docs/fim.md, "Rounding twice where it pays").
PRECISE_WHEN_GENERATING = ("qkv", "down", "lm_head")


def model_device(model: Any) -> torch.device:
    """Where ``model``'s weights are, so where its runner runs."""
    return next(model.parameters()).device


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


def prefill_dtype(
    requested: str = "auto",
    device: torch.device = CPU,
    model_dtype: torch.dtype = torch.float32,
    prompts_quantized: bool = False,
) -> torch.dtype:
    """The dense weights' dtype. ``auto`` on CPU: bf16 where the CPU computes it natively and
    prompts are read on the dense weights; fp32 (the model's own tensors, no copy) elsewhere,
    and where prompts run on the quantized weights (``prompts_quantized``): the dense weights
    then only compute each token id's first position once, and a bf16 copy of them cost a
    replica ~1.5 GB for it (AVX512-BF16, the 0.5B: 4.4 GB resident against 2.9). On a GPU the
    model's own dtype (bf16 as prod.yaml loads it: no copy of the weights)."""
    if requested == "auto":
        if device.type != "cpu":
            return model_dtype
        native = cpu_has_bf16_compute() and not prompts_quantized
        return torch.bfloat16 if native else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[requested]


def decode_weights(requested: str, device: torch.device = CPU) -> str:
    """The decode weights ``requested`` means on this CPU (``auto`` resolved; ``int8`` and
    ``q4``, whose LM head is 8-bit, fall back to int4 where torch has no fbgemm/x86
    quantized engine, and ``q4`` to int8 where the runner's C kernels do not build, with a
    warning). Off the CPU only ``dense`` (``auto`` means it): the others are CPU kernels."""
    if device.type != "cpu":
        if requested in ("auto", "dense"):
            return "dense"
        raise DeviceError(
            f"runner weights {requested!r} run on CPU only (the runner's q4 kernel, torch's "
            f"int4/int8 ones); the model is on {device}: set engine.weights to auto or dense "
            "(the model's own dtype there), or engine.runner to hf"
        )
    if requested in ("auto", "int8", "q4") and not int8_supported():
        if requested != "auto":
            logger.warning("runner: %s needs torch's fbgemm/x86 int8 engine; using int4", requested)
        return "int4"
    if requested in ("auto", "q4"):
        reason = native.unavailable_reason()
        if reason is None:
            return "q4"
        if requested == "q4":
            logger.warning("runner: q4 decode weights unavailable (%s); using int8", reason)
    return "int8" if requested in ("auto", "q4") else requested


def quantized_prompts(requested: str, decode: str) -> bool:
    """Whether prompts run on the ``decode`` weights (resolved): ``auto`` where they are q4 or
    int8 (``prompt_bits``: on q4's 4 bits or its 8-bit copy)."""
    if requested not in PROMPT_WEIGHTS:
        raise ValueError(f"unknown prompt weights {requested!r}; use one of {PROMPT_WEIGHTS}")
    if requested == "auto":
        return decode in ("int8", "q4")
    return requested in ("decode", "q4") and decode != "dense"


def prompt_bits(requested: str, decode: str) -> int:
    """4 where quantized prompts read the q4 decode weights themselves (``auto`` and ``q4``;
    the LM head stays on 8 bits), 8 on q4's 8-bit copy (``decode``) and on int8. ``q4`` asked
    for on other decode weights: their 8 bits, with a warning.

    4 bits by default: one copy of the layers per model serves decode steps and prompts (the
    1.5B's 8-bit copy was 1.6 GB more of a laptop's memory), at the same measured quality and
    a faster prompt on AVX2 (docs/benchmarks.md)."""
    if decode != "q4":
        if requested == "q4":
            logger.warning("runner: prompts on q4 need q4 decode weights, not %s", decode)
        return 8
    return 4 if requested in ("auto", "q4") else 8


def choose_weights(
    model: Any,
    *,
    weights: str = "int4",
    prompt_weights: str = "dense",
    dense_dtype: torch.dtype | str = torch.float32,
    precise: Sequence[str] = (),
    scoring: bool = False,
    int8_kernel: str = "auto",
) -> WeightChoice:
    """What ``weights``, ``prompt_weights``, ``dense_dtype`` (a dtype, or an
    ``EngineConfig.prefill_dtype`` name) and ``int8_kernel`` mean for ``model`` on this
    machine.
    ``scoring``: a runner that only reads prompts (the decision scorer's) gets no decode
    weights where prompts are dense, and only q4's int8 (which reads its prompts) on q4."""
    if weights not in WEIGHTS:
        raise ValueError(f"unknown runner weights {weights!r}; use one of {WEIGHTS}")
    unknown = set(precise) - set(LINEARS)
    if unknown:
        raise ValueError(f"unknown linears {sorted(unknown)}; use some of {LINEARS}")
    if int8_kernel not in INT8_KERNELS:
        raise ValueError(f"unknown int8 kernel {int8_kernel!r}; use one of {INT8_KERNELS}")
    device = model_device(model)
    decode = decode_weights(weights, device)
    prompts_quantized = quantized_prompts(prompt_weights, decode)
    bits = prompt_bits(prompt_weights, decode) if prompts_quantized else 8
    if scoring and bits == 8:
        decode = ("int8" if decode == "q4" else decode) if prompts_quantized else "dense"
    if isinstance(dense_dtype, str):
        model_dtype = next(model.parameters()).dtype
        dense_dtype = prefill_dtype(dense_dtype, device, model_dtype, prompts_quantized)
    kernel = resolved_int8_kernel(int8_kernel)
    return WeightChoice(decode, prompts_quantized, dense_dtype, tuple(precise), kernel, bits)


def resolved_int8_kernel(requested: str) -> str:
    """``auto``: q8 wherever the runner's C kernels run on SIMD (one rounding per 32 inputs,
    a mapped file every replica shares), else fbgemm. q8 asked for where they do not: fbgemm,
    with a warning."""
    reason = native.unavailable_reason()
    if requested == "q8" and reason is not None:
        logger.warning("runner: q8 weights unavailable (%s); using fbgemm's int8", reason)
    if requested == "fbgemm" or reason is not None:
        return "fbgemm"
    return "q8"


def prepare_weights(
    model: Any,
    choice: WeightChoice,
    *,
    cache_dir: str | Path | None = None,
    calibration: Sequence[int] = (),
    first_tokens: Iterable[int] = (),
) -> PreparedWeights:
    """``model``'s weights as ``choice`` has them; quantized weights (and, with prompts on the
    decode weights, the first-position entries of ``first_tokens``) read from / saved to
    ``cache_dir``. ``calibration``: token ids read once on the dense weights to smooth int8's
    inputs (``smoothing.py``, ``smoothing.calibration_ids``); empty: int8 unsmoothed."""
    parts = [_layer_parts(layer, choice.dense_dtype) for layer in model.model.layers]
    head = [(_dense(model.lm_head.weight, choice.dense_dtype), None)]
    matrices = _matrices(parts, head)
    packs: dict[str, torch.Tensor] = {}
    int8: dict[str, tuple[torch.ScriptObject, torch.Tensor | None]] = {}
    q4: dict[str, torch.Tensor] = {}
    if choice.decode == "int4":
        packs = int4_packs(matrices, cache_path(model, cache_dir, "int4"))
    eight_bit = choice.decode in ("int8", "q4")  # never on a GPU (dense there)
    own_eight_bit = eight_bit and choice.int8_kernel == "q8"
    kernel = NativeMatmul() if choice.decode == "q4" or own_eight_bit else None
    q8: dict[str, torch.Tensor] = {}
    # With prompts on q4 only the LM head needs 8 bits: the layers' pages of the (whole) file
    # are never read, so every replica of the model maps one 4-bit copy of them.
    eight_bit_names = {"lm_head"} if choice.prompt_bits == 4 else set(matrices)
    if own_eight_bit:
        q8 = q8_packs(matrices, cache_path(model, cache_dir, Q8_FILE))
        q8 = {k: v for k, v in q8.items() if k in eight_bit_names}
    rest = {k: v for k, v in matrices.items() if k in eight_bit_names and k not in q8}
    if eight_bit and rest:  # fbgemm, or a shape q8 does not take
        path = cache_path(model, cache_dir, INT8_FILE if calibration else UNSMOOTHED_INT8_FILE)
        int8 = int8_packs(rest, path, model, calibration)
    if choice.decode == "q4":
        # q4 takes the decoder layers' linears; the LM head stays on 8 bits (as llama.cpp's
        # Q4_K_M keeps its output matrix in 6): every logit goes through it, and a q4 head lost
        # FIM first lines an int8 one kept (docs/benchmarks.md).
        layers_only = {k: v for k, v in matrices.items() if k != "lm_head"}
        q4 = q4_packs(layers_only, cache_path(model, cache_dir, Q4_FILE))

    def linear(name: str) -> Linear:
        packed, smooth = int8.get(name, (None, None))
        precise = name.rsplit(".", 1)[-1] in choice.precise
        own4 = (kernel, q4[name]) if name in q4 else None
        own8 = (kernel, q8[name]) if name in q8 else None
        return Linear(matrices[name], _pack(packs, name), packed, precise, smooth, own4, own8)

    layers = tuple(
        Layer(
            norm_in,
            linear(f"layers.{index}.qkv"),
            linear(f"layers.{index}.o"),
            norm_post,
            linear(f"layers.{index}.gate_up"),
            linear(f"layers.{index}.down"),
        )
        for index, (norm_in, _, _, norm_post, _, _) in enumerate(parts)
    )
    # Decode attention in C on every CPU runner: a query alone over its own columns costs torch
    # far more than the batched pass it replaced, C about the same (docs/benchmarks.md).
    on_cpu = model_device(model).type == "cpu"
    kernels = native.load() if on_cpu and native.unavailable_reason() is None else None
    prepared = PreparedWeights(choice, layers, linear("lm_head"), kernels)
    if not choice.quantized_prompts:
        return prepared
    dtype = str(choice.dense_dtype).removeprefix("torch.")
    path = cache_path(model, cache_dir, f"first-{dtype}")
    entries = _first_token_entries(model, prepared, sorted(set(first_tokens)), path)
    # The dense layers are read again only for a new position-0 token: the pages a first
    # start faulted in to quantize them (the 1.5B's whole 7 GB file) need not stay.
    page_out(w for p in matrices.values() for w, _ in p)
    return replace(prepared, first_tokens=entries)


def build_runner(
    model: Any,
    *,
    weights: str = "int4",
    dense_dtype: torch.dtype | str = torch.float32,
    cache_dir: str | Path | None = None,
    small_prefill_tokens: int = 0,
    prompt_weights: str = "dense",
    first_tokens: Iterable[int] = (),
    precise_activations: Sequence[str] = (),
    calibration: Sequence[int] = (),
    adapters: Mapping[str, LoraAdapter] | None = None,
    scoring: bool = False,
    graphs: DecodeGraphs | None = None,
    int8_kernel: str = "auto",
) -> Qwen2Runner:
    """A runner over ``model``'s weights, as ``choose_weights`` resolves the options and
    ``prepare_weights`` makes them. ``small_prefill_tokens``, ``prompt_weights``: see
    ``Qwen2Runner.forward``; ``precise_activations``: ``WeightChoice.precise``;
    ``adapters``: the LoRA adapters requests may name (``lora.load_adapter``); ``graphs``:
    captured decode steps (``graphs.DecodeGraphs``), None: every step eager."""
    choice = choose_weights(
        model,
        weights=weights,
        prompt_weights=prompt_weights,
        dense_dtype=dense_dtype,
        precise=precise_activations,
        scoring=scoring,
        int8_kernel=int8_kernel,
    )
    prepared = prepare_weights(
        model, choice, cache_dir=cache_dir, calibration=calibration, first_tokens=first_tokens
    )
    return Qwen2Runner(model, prepared, small_prefill_tokens, adapters, graphs)


def configured_runner(
    loaded: Any, config: EngineConfig, purpose: str, adapters: Mapping[str, Path] | None = None
) -> Qwen2Runner | None:
    """The runner ``config`` asks for (its ``runner``, ``weights``, ``prompt_weights``,
    ``prefill_dtype``), or None where the model runs on HF: ``runner: hf``, or a model the
    runner does not support. int4/int8 asked for on a GPU raise ``DeviceError`` (at start,
    not at a request); decode steps replay CUDA graphs there unless ``cuda_graphs`` is off.

    The one decision for every user of the model (the generating engine, the decision
    scorer), so they fall back together and read prompts on the same weights. On int8 a
    generating runner rounds q/k/v's, the down projection's and the head's activations twice
    (``PRECISE_WHEN_GENERATING``); a scoring one (``config.task``) every activation: a
    decision's number must not move with what else the request asks or what the prefix cache
    held (docs/benchmarks.md, "Figures behind the defaults").
    ``adapters``: LoRA adapters requests may name (``lora.load_adapter``, checked here)."""
    reason = "runner: hf" if config.runner == "hf" else unsupported_reason(loaded.model)
    if reason is not None:
        logger.info("%s: HF model (%s)", purpose, reason)
        return None
    device = model_device(loaded.model)
    scoring = config.task == "score"
    captured = device.type == "cuda" and config.cuda_graphs and not scoring
    return build_runner(
        loaded.model,
        weights=config.weights,
        dense_dtype=config.prefill_dtype,
        cache_dir=getattr(loaded, "location", None),
        small_prefill_tokens=config.small_prefill_tokens,
        prompt_weights=config.prompt_weights,
        first_tokens=prompt_start_tokens(loaded.tokenizer),
        precise_activations=LINEARS if scoring else PRECISE_WHEN_GENERATING,
        calibration=calibration_ids(loaded.tokenizer),
        adapters={
            name: load_adapter(name, Path(path), loaded.model, device)
            for name, path in (adapters or {}).items()
        },
        scoring=scoring,
        graphs=DecodeGraphs() if captured else None,
        int8_kernel=config.int8_kernel,
    )


def prompt_start_tokens(tokenizer: Any) -> list[int]:
    """The tokens a prompt may start with that are worth a saved first-position entry: the
    tokenizer's special and added tokens (the chat and FIM formats open with one)."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return sorted(set(getattr(tokenizer, "all_special_ids", [])) | set(added))


def _dense(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    t = t.detach()
    return t if t.dtype == dtype else t.to(dtype)


def _layer_parts(layer: Any, dtype: torch.dtype) -> tuple:
    attn, mlp = layer.self_attn, layer.mlp

    def part(linear: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        bias = None if linear.bias is None else _dense(linear.bias, dtype)
        return _dense(linear.weight, dtype), bias

    return (
        norm_weight(layer.input_layernorm.weight),
        [part(attn.q_proj), part(attn.k_proj), part(attn.v_proj)],
        [part(attn.o_proj)],
        norm_weight(layer.post_attention_layernorm.weight),
        [part(mlp.gate_proj), part(mlp.up_proj)],
        [part(mlp.down_proj)],
    )


def _pack(packs: dict[str, torch.Tensor], name: str) -> tuple[torch.Tensor, torch.Tensor] | None:
    if f"{name}.packed" not in packs:
        return None
    return packs[f"{name}.packed"], packs[f"{name}.scales"]


def _matrices(parts: list[tuple], head: list) -> dict[str, list]:
    """Every linear's dense parts by name (``layers.<i>.<qkv|o|gate_up|down>``, ``lm_head``)."""
    matrices: dict[str, list] = {}
    for index, (_, qkv, o, _, gate_up, down) in enumerate(parts):
        for name, p in (("qkv", qkv), ("o", o), ("gate_up", gate_up), ("down", down)):
            matrices[f"layers.{index}.{name}"] = p
    matrices["lm_head"] = head
    return matrices


def _first_token_entries(
    model: Any, prepared: PreparedWeights, tokens: list[int], path: Path | None
) -> dict[tuple[str, int], FirstEntry]:
    """``Qwen2Runner.first_token``'s entries for ``tokens``, computed once on the dense weights
    (by a runner of ``prepared_weights`` kept only for it) and saved at ``path``."""

    def compute() -> dict[str, torch.Tensor]:
        runner = Qwen2Runner(model, prepared)
        cache = runner.new_cache(1, 1, 1)
        out: dict[str, torch.Tensor] = {}
        with torch.inference_mode():
            for token in tokens:
                runner.first_token(cache, 0, token)
                kv, hidden = runner.first_tokens.pop(("", token))
                out[f"{token}.kv"] = torch.stack([torch.stack(pair) for pair in kv])
                out[f"{token}.hidden"] = hidden
        return out

    if not tokens:
        return {}
    saved = cached(path, f"first-position entries of {len(tokens)} tokens", compute)
    return {
        ("", token): (
            tuple((kv[0], kv[1]) for kv in saved[f"{token}.kv"]),
            saved[f"{token}.hidden"],
        )
        for token in tokens
        if f"{token}.kv" in saved
    }
