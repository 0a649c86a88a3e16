"""Building a ``Qwen2Runner`` from a loaded HF model: kernel choice, int4 packing, disk cache.

Which weights run where is decided here, at run time, from what the CPU computes natively:

- prefill chunks (``prompt_weights``): ``auto`` reads prompts on the decode weights where
  those are int8 (per-row int8 reads a prompt ~1.5x faster than fp32 GEMM on AVX2, with the
  same measured quality: docs/benchmarks.md), the prompt's first token on dense weights
  (``Qwen2Runner.first_token``); elsewhere ``dense``: the HF parameters as they are (fp32) on
  CPUs without bf16 compute, a bf16 copy where the CPU has AVX512-BF16 or AMX (~2x faster GEMM
  there), and a chunk of at most ``small_prefill_tokens`` tokens after position 0 on the
  decode weights (``Qwen2Runner.forward`` says why);
- decode steps (few rows): the runner's own 4-bit kernel when ``weights="q4"``
  (``weights_q4``; prompts then on int8), int4 groupwise when ``weights="int4"``, fbgemm
  int8 per channel when ``weights="int8"``, else the dense weights; ``weights="auto"`` takes
  q4 wherever torch has its fbgemm/x86 int8 engine and the runner's C kernels build
  (``native``), int8 where only the first holds, int4 elsewhere. q4 decodes fastest where it
  builds and stays closest to fp32 after int8; on AVX2, int8 beats torch's int4; AMX CPUs are
  unmeasured (the figures, per CPU: docs/benchmarks.md, "Figures behind the defaults").

On a CUDA GPU (the weights' device, ``model_device``) none of that applies: the decode and
prompt weights are the dense ones, in the model's own dtype unless ``prefill_dtype`` names
another (the HF parameters themselves, already on the GPU: nothing is copied or cached), and
int4/int8, CPU kernels, are refused with ``DeviceError``.

Quantizing reads every dense weight and takes seconds, so the results are saved once next to
the converted model and later replicas read them from there: int4 packs
(``runner-int4-g32-<fingerprint>.pt``) are mapped, so every replica on the machine shares one
page-cache copy; int8 values (``runner-int8-v3-<fingerprint>.pt``, smoothed: ``smoothing.py``)
are read into fbgemm's own packed copy per replica; with prompts on the decode weights, the
first-position entries of the tokenizer's special tokens
(``runner-first-<dtype>-<fingerprint>.pt``: the tokens prompts start with,
``Qwen2Runner.first_token``) too. A replica that finds these files never reads the dense
weights of its layers, so the memory-mapped model file stays out of its memory.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from serve_app.engine.runner import native, weights_q4
from serve_app.engine.runner.lora import LoraAdapter
from serve_app.engine.runner.pages import page_out
from serve_app.engine.runner.qwen2 import Layer, Qwen2Runner, norm_weight
from serve_app.engine.runner.smoothing import input_peaks, smoothing
from serve_app.engine.runner.weights import (
    INT4_GROUP,
    Linear,
    int4_supported,
    int8_supported,
    int8_values,
    prepack_int8,
    quantize_int4,
    stacked,
)
from serve_app.models.loader import DeviceError
from serve_app.models.progress import visible_progress

logger = logging.getLogger(__name__)
RUNNER_LOGGER = logging.getLogger("serve_app.engine.runner")  # prepare's, smoothing's

WEIGHTS = ("auto", "q4", "int4", "int8", "dense")
PROMPT_WEIGHTS = ("auto", "dense", "decode")
# v1 (never released) held two extra zero columns per matrix; v2 had no smoothing. v3 is
# smoothed by data/calibration.txt: a new text needs a new version. A runner built without
# calibration ids (no tokenizer) keeps its unsmoothed values apart, never in the file a
# smoothed runner reads.
INT8_FILE = "int8-v3"
UNSMOOTHED_INT8_FILE = "int8-raw-v3"
Q4_FILE = "q4-v1"
# q4 takes the decoder layers' linears; the LM head stays on int8, rounded twice (as llama.cpp's
# Q4_K_M keeps its output matrix in 6 bits): every logit goes through it, and a q4 head lost
# FIM first lines that an int8 one kept (docs/benchmarks.md, "Figures behind the defaults").
CPU = torch.device("cpu")
LINEARS = ("qkv", "o", "gate_up", "down", "lm_head")
# int8 linears whose activations are rounded twice (``int8_linear``'s ``precise``) when a runner
# generates: the down projection (inputs peaking at tens of times their RMS, in no fixed
# channel) takes most of the rounding error away, q/k/v and the head are cheap to add (the head
# reads one row per prompt chunk), gate/up is the largest matrix for the least gain
# (``bench.int8_rounding``; its figures: docs/benchmarks.md).
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
    ``q4``, which reads prompts on int8, fall back to int4 where torch has no fbgemm/x86
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
    """Whether prompts run on the ``decode`` weights (resolved): ``auto`` where they are int8
    (``q4`` reads prompts on its int8 copy)."""
    if requested not in PROMPT_WEIGHTS:
        raise ValueError(f"unknown prompt weights {requested!r}; use one of {PROMPT_WEIGHTS}")
    if requested == "auto":
        return decode in ("int8", "q4")
    return requested == "decode" and decode != "dense"


def build_runner(
    model: Any,
    *,
    weights: str = "int4",
    dense_dtype: torch.dtype = torch.float32,
    cache_dir: str | Path | None = None,
    small_prefill_tokens: int = 0,
    prompt_weights: str = "dense",
    first_tokens: Iterable[int] = (),
    precise_activations: Sequence[str] = (),
    calibration: Sequence[int] = (),
    adapters: Mapping[str, LoraAdapter] | None = None,
) -> Qwen2Runner:
    """A runner over ``model``'s weights; quantized weights (and, with prompts on the decode
    weights, the first-position entries of ``first_tokens``) are read from / saved to
    ``cache_dir``. ``small_prefill_tokens``, ``prompt_weights``: see ``Qwen2Runner.forward``.
    ``precise_activations``: the kinds of ``LINEARS`` whose int8 activations are rounded twice
    (``int8_linear``).
    ``calibration``: token ids read once on the dense weights to smooth int8's inputs
    (``smoothing.py``, ``smoothing.calibration_ids``); empty: int8 unsmoothed.
    ``adapters``: the LoRA adapters requests may name (``lora.load_adapter``)."""
    if weights not in WEIGHTS:
        raise ValueError(f"unknown runner weights {weights!r}; use one of {WEIGHTS}")
    weights = decode_weights(weights, model_device(model))
    on_decode_weights = quantized_prompts(prompt_weights, weights)
    hf_layers = model.model.layers
    parts = [_layer_parts(layer, dense_dtype) for layer in hf_layers]
    head = [(_dense(model.lm_head.weight, dense_dtype), None)]
    packs: dict[str, torch.Tensor] = {}
    int8: dict[str, tuple[torch.ScriptObject, torch.Tensor | None]] = {}
    q4: dict[str, torch.Tensor] = {}
    if weights == "int4":
        packs = _int4_packs(_matrices(parts, head), _cache_path(model, cache_dir, "int4"))
    elif weights in ("int8", "q4"):
        path = _cache_path(model, cache_dir, INT8_FILE if calibration else UNSMOOTHED_INT8_FILE)
        int8 = _int8_packs(_matrices(parts, head), path, model, calibration)
    kernel = weights_q4.Q4Kernel() if weights == "q4" else None
    if kernel is not None:  # the head stays int8: see Q4_FILE
        layers_only = {k: v for k, v in _matrices(parts, head).items() if k != "lm_head"}
        q4 = _q4_packs(layers_only, _cache_path(model, cache_dir, Q4_FILE))

    unknown = set(precise_activations) - set(LINEARS)
    if unknown:
        raise ValueError(f"unknown linears {sorted(unknown)}; use some of {LINEARS}")

    def linear(p: list, name: str) -> Linear:
        packed, smooth = int8.get(name, (None, None))
        precise = name.rsplit(".", 1)[-1] in precise_activations
        own = (kernel, q4[name]) if kernel is not None and name in q4 else None
        return Linear(p, _pack(packs, name), packed, precise, smooth, own)

    layers = []
    for index, (norm_in, qkv, o, norm_post, gate_up, down) in enumerate(parts):
        linears = {"qkv": qkv, "o": o, "gate_up": gate_up, "down": down}
        built = {name: linear(p, f"layers.{index}.{name}") for name, p in linears.items()}
        layers.append(
            Layer(norm_in, built["qkv"], built["o"], norm_post, built["gate_up"], built["down"])
        )
    head_linear = linear(head, "lm_head")
    runner = Qwen2Runner(
        model, layers, head_linear, small_prefill_tokens, on_decode_weights, adapters
    )
    if runner.device.type == "cpu" and native.unavailable_reason() is None:
        # Decode attention in C on every CPU runner: a query alone over its own columns costs
        # torch ~1.7x the batched pass (7 drafts, 800 columns, the 0.5B), C ~1.07x.
        runner.native = native.load()
    if on_decode_weights:
        path = _cache_path(model, cache_dir, f"first-{str(dense_dtype).removeprefix('torch.')}")
        runner.first_tokens.update(_first_token_entries(runner, sorted(set(first_tokens)), path))
        # The dense layers are read again only for a new position-0 token: the pages a first
        # start faulted in to quantize them (the 1.5B's whole 7 GB file) need not stay.
        page_out(w for p in _matrices(parts, head).values() for w, _ in p)
    return runner


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


def _int4_packs(matrices: dict[str, list], path: Path | None) -> dict[str, torch.Tensor]:
    """int4 packs of the matrices the kernel takes, mapped from ``path``: shared pages."""
    matrices = {
        k: v
        for k, v in matrices.items()
        if int4_supported(sum(w.shape[0] for w, _ in v), v[0][0].shape[1])
    }

    def pack(_name: str, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        packed, scales = quantize_int4(weight)
        return {"packed": packed, "scales": scales}

    return _cached(path, f"int4 weights (group {INT4_GROUP})", lambda: _quantize(matrices, pack))


def _q4_packs(matrices: dict[str, list], path: Path | None) -> dict[str, torch.Tensor]:
    """The q4 kernel's packs of every matrix it takes, mapped from ``path``: shared pages."""
    matrices = {
        k: v
        for k, v in matrices.items()
        if weights_q4.supported(sum(w.shape[0] for w, _ in v), v[0][0].shape[1])
    }
    saved = _cached(
        path, "q4 weights", lambda: _quantize(matrices, lambda _, w: {"q4": weights_q4.quantize(w)})
    )
    return {name: saved[f"{name}.q4"] for name in matrices}


def _int8_packs(
    matrices: dict[str, list], path: Path | None, model: Any, calibration: Sequence[int]
) -> dict[str, tuple[torch.ScriptObject, torch.Tensor | None]]:
    """``(fbgemm pack, 1 / s or None)`` per matrix, made from the int8 values saved at
    ``path`` (the file is read, packed and released: fbgemm keeps its own copy, private to
    the replica). Where ``calibration`` is given, each matrix is smoothed first
    (``smoothing.py``); the peaks are measured only when the file is made."""

    def compute() -> dict[str, torch.Tensor]:
        peaks = input_peaks(model, list(calibration)) if calibration else {}

        def values(name: str, weight: torch.Tensor) -> dict[str, torch.Tensor]:
            if not peaks:
                q, scales = int8_values(weight)
                return {"q": q, "scales": scales}
            s = smoothing(peaks[name], weight)  # a name input_peaks lacks fails here, loudly
            q, scales = int8_values(weight * s)
            return {"q": q, "scales": scales, "smooth": (1 / s).contiguous()}

        return _quantize(matrices, values)

    saved = _cached(path, "int8 weights", compute)
    # The small smoothing vectors are copied out: a tensor torch.load mapped keeps the whole
    # file's mapping, and every page prepacking read (the 1.5B: 1.5 GB) resident, alive.
    return {
        name: (
            prepack_int8(saved[f"{name}.q"], saved[f"{name}.scales"]),
            None if f"{name}.smooth" not in saved else saved[f"{name}.smooth"].clone(),
        )
        for name in matrices
    }


def _quantize(
    matrices: dict[str, list], quantize: Callable[[str, torch.Tensor], dict[str, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    started = time.monotonic()
    out: dict[str, torch.Tensor] = {}
    total = len(matrices)
    for done, (name, parts) in enumerate(matrices.items(), start=1):
        weight = stacked([(w.float(), b) for w, b in parts])
        out |= {f"{name}.{key}": t for key, t in quantize(name, weight).items()}
        if done % 16 == 0 or done == total:
            logger.info("runner: quantizing weights: %d/%d", done, total)
    logger.info("runner: quantizing took %.1fs", time.monotonic() - started)
    return out


def _first_token_entries(runner: Qwen2Runner, tokens: list[int], path: Path | None) -> dict:
    """``Qwen2Runner.first_token``'s entries for ``tokens``, computed on the dense weights once
    and saved at ``path``."""

    def compute() -> dict[str, torch.Tensor]:
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
    saved = _cached(path, f"first-position entries of {len(tokens)} tokens", compute)
    return {
        ("", token): (
            tuple((kv[0], kv[1]) for kv in saved[f"{token}.kv"]),
            saved[f"{token}.hidden"],
        )
        for token in tokens
        if f"{token}.kv" in saved
    }


def _cached(
    path: Path | None, what: str, compute: Callable[[], dict[str, torch.Tensor]]
) -> dict[str, torch.Tensor]:
    """``compute()``, saved once at ``path`` and read back, mapped, from there after."""
    if path is None:
        return compute()
    # One writer per machine: replicas starting together wait for the first one's file.
    with open(path.with_name(f"{path.name}.lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if path.exists():
                try:
                    saved = torch.load(path, mmap=True, weights_only=True)
                    logger.info("runner: %s mapped from %s", what, path)
                    return saved
                except Exception:
                    logger.warning("runner: unreadable %s; computing again", path, exc_info=True)
            tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
            with visible_progress(RUNNER_LOGGER):  # minutes for the 1.5B, once per machine
                logger.info("runner: preparing %s, once: later starts map %s", what, path)
                torch.save(compute(), tmp)
                os.replace(tmp, path)
                logger.info("runner: %s saved to %s", what, path)
            _remove_stale(path)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return torch.load(path, mmap=True, weights_only=True)


def _remove_stale(path: Path) -> None:
    """The same kind of file for other weights (a re-converted model, an older fingerprint)
    or in an older version of its format (``runner-int8-v2-*`` once v3 is saved): never read
    again, up to a GB each. A replica still mapping one keeps its pages."""
    kind = re.sub(r"-v\d+$", "", path.name.rsplit("-", 1)[0])
    for stale in path.parent.glob(f"{kind}-*.pt"):
        if stale != path and stale.name.count("-") == path.name.count("-"):
            stale.unlink(missing_ok=True)
            stale.with_name(f"{stale.name}.lock").unlink(missing_ok=True)


def _cache_path(model: Any, cache_dir: str | Path | None, kind: str) -> Path | None:
    if cache_dir is None or not Path(cache_dir).is_dir():
        return None
    name = f"int4-g{INT4_GROUP}" if kind == "int4" else kind
    return Path(cache_dir) / f"runner-{name}-{fingerprint(model)}.pt"


def fingerprint(model: Any) -> str:
    """A cheap digest of the weights (shapes and each tensor's first and last 32 values): a
    changed model, or one edited in memory after loading, never picks up another's packed
    weights. Only the two ends are read: a strided sample faulted ~0.5 GB of the mapped model
    file into every replica (the kernel maps 64 KB around each faulting read)."""
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        flat = param.detach().reshape(-1)
        sample = torch.cat([flat[:32], flat[-32:]]).float()
        digest.update(name.encode())
        digest.update(str(tuple(param.shape)).encode())
        digest.update(sample.numpy().tobytes())
    return digest.hexdigest()[:16]
