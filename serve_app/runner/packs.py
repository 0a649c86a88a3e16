"""The runner's quantized weights on disk: made once per machine, mapped by every replica.

Quantizing reads every dense weight and takes seconds (minutes for the 1.5B), so the results
are saved once next to the converted model and later replicas read them from there: int4, q4
and q8 packs (``runner-int4-g32-<fingerprint>.pt``, ``runner-q4-v1-*``, ``runner-q8-v1-*``)
are mapped, so every replica on the machine shares one page-cache copy; fbgemm's int8 values
(``runner-int8-v3-*``, smoothed: ``smoothing.py``) are read into its own packed copy per
replica. A replica that
finds these files never reads the dense weights of its layers, so the memory-mapped model file
stays out of its memory.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from serve_app.models.progress import visible_progress
from serve_app.runner import weights_q4, weights_q8
from serve_app.runner.smoothing import input_peaks, smoothing
from serve_app.runner.weights import (
    INT4_GROUP,
    int4_supported,
    int8_values,
    prepack_int8,
    quantize_int4,
    stacked,
)

logger = logging.getLogger(__name__)
RUNNER_LOGGER = logging.getLogger("serve_app.runner")  # its progress, smoothing's

# v1 (never released) held two extra zero columns per matrix; v2 had no smoothing. v3 is
# smoothed by data/calibration.txt: a new text needs a new version. A runner built without
# calibration ids (no tokenizer) keeps its unsmoothed values apart, never in the file a
# smoothed runner reads.
INT8_FILE = "int8-v3"
UNSMOOTHED_INT8_FILE = "int8-raw-v3"
Q4_FILE = "q4-v1"
Q8_FILE = "q8-v1"


def int4_packs(matrices: dict[str, list], path: Path | None) -> dict[str, torch.Tensor]:
    """int4 packs of the matrices the kernel takes, mapped from ``path``: shared pages."""
    matrices = {
        k: v
        for k, v in matrices.items()
        if int4_supported(sum(w.shape[0] for w, _ in v), v[0][0].shape[1])
    }

    def pack(_name: str, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        packed, scales = quantize_int4(weight)
        return {"packed": packed, "scales": scales}

    return cached(path, f"int4 weights (group {INT4_GROUP})", lambda: _quantize(matrices, pack))


def q4_packs(matrices: dict[str, list], path: Path | None) -> dict[str, torch.Tensor]:
    """The q4 kernel's packs of every matrix it takes, mapped from ``path``: shared pages."""
    return _own_packs(matrices, path, "q4", weights_q4.supported, weights_q4.quantize)


def q8_packs(matrices: dict[str, list], path: Path | None) -> dict[str, torch.Tensor]:
    """The q8 kernel's packs of every matrix it takes, mapped from ``path``: shared pages."""
    return _own_packs(matrices, path, "q8", weights_q8.supported, weights_q8.quantize)


def _own_packs(
    matrices: dict[str, list],
    path: Path | None,
    kind: str,
    supported: Callable[[int, int], bool],
    quantize: Callable[[torch.Tensor], torch.Tensor],
) -> dict[str, torch.Tensor]:
    """The runner's own kernel's packs (``kind``) of the matrices whose shape it takes."""
    matrices = {
        k: v
        for k, v in matrices.items()
        if supported(sum(w.shape[0] for w, _ in v), v[0][0].shape[1])
    }
    saved = cached(
        path, f"{kind} weights", lambda: _quantize(matrices, lambda _, w: {kind: quantize(w)})
    )
    return {name: saved[f"{name}.{kind}"] for name in matrices}


def int8_packs(
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

    saved = cached(path, "int8 weights", compute)
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


def cached(
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


def cache_path(model: Any, cache_dir: str | Path | None, kind: str) -> Path | None:
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
