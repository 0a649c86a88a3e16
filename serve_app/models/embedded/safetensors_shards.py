"""Write tensors into safetensors shards one at a time, their layout planned before any is made.

``safetensors.torch.save_file`` wants every tensor of a file in memory at once (and copies each
to bytes), which is what made converting a model cost several times its size in RAM. A
safetensors file is a JSON header of names, dtypes, shapes and byte ranges followed by the raw
data, so when names and shapes are known up front (a GGUF's tensor table gives them) the header
can be written first and each tensor appended as it is produced: memory holds one tensor.

The folder looks like ``save_pretrained``'s: ``model.safetensors``, or numbered shards plus
``model.safetensors.index.json`` when the model is larger than one shard.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, NamedTuple

import torch

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
DEFAULT_SHARD_BYTES = 1 << 30  # small enough for any laptop disk cache, few enough files
_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
_HEADER_ALIGN = 8  # safetensors pads the header so the data starts 8-byte aligned


class PlannedTensor(NamedTuple):
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


class ShardWriter:
    """Writes the tensors of ``plan``, in its order, into shards of at most ``max_shard_bytes``.

    Use as a context manager; the index is written only when every planned tensor arrived.
    """

    def __init__(
        self,
        out_dir: str | Path,
        plan: Sequence[PlannedTensor],
        max_shard_bytes: int = DEFAULT_SHARD_BYTES,
    ) -> None:
        unknown = {tensor.dtype for tensor in plan} - set(_DTYPES)
        if unknown:
            raise ValueError(f"cannot write tensors of dtype {sorted(map(str, unknown))}")
        self.out_dir = Path(out_dir)
        self.shards = _split(plan, max_shard_bytes)
        self.files = _shard_names(len(self.shards))
        self._queue = [(index, item) for index, shard in enumerate(self.shards) for item in shard]
        self._next = 0
        self._open_index = -1
        self._handle: BinaryIO | None = None

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._close_handle()
        if kind is None:
            self._finish()

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Append the next planned tensor; any other name, shape or dtype is a bug upstream."""
        if self._next >= len(self._queue):
            raise ValueError(f"{name}: every planned tensor was already written")
        index, planned = self._queue[self._next]
        got = PlannedTensor(name, tuple(tensor.shape), tensor.dtype)
        if got != planned:
            raise ValueError(f"expected tensor {planned}, got {got}")
        if index != self._open_index:
            self._open_shard(index)
        assert self._handle is not None
        # The tensor's own memory as bytes (a view, any dtype): no copy of the largest tensor.
        self._handle.write(tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
        self._next += 1

    def _open_shard(self, index: int) -> None:
        self._close_handle()
        self._handle = open(self.out_dir / self.files[index], "wb")  # noqa: SIM115
        self._handle.write(_header(self.shards[index]))
        self._open_index = index

    def _close_handle(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None

    def _finish(self) -> None:
        if self._next != len(self._queue):
            missing = [tensor.name for _, tensor in self._queue[self._next :]]
            raise ValueError(f"{len(missing)} planned tensors never arrived: {missing[:5]}")
        if len(self.shards) == 1:
            return
        # What transformers' loader reads to find the shard of each tensor.
        weight_map = {tensor.name: self.files[index] for index, tensor in self._queue}
        total = sum(tensor.nbytes for _, tensor in self._queue)
        index_json = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (self.out_dir / INDEX_NAME).write_text(json.dumps(index_json, indent=2) + "\n")


def _split(plan: Sequence[PlannedTensor], max_bytes: int) -> list[list[PlannedTensor]]:
    """Consecutive groups of at most ``max_bytes``; a larger tensor gets a shard of its own."""
    if not plan:
        raise ValueError("nothing to write")
    shards: list[list[PlannedTensor]] = [[]]
    size = 0
    for tensor in plan:
        if shards[-1] and size + tensor.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(tensor)
        size += tensor.nbytes
    return shards


def _shard_names(count: int) -> list[str]:
    if count == 1:
        return [WEIGHTS_NAME]
    return [f"model-{index:05d}-of-{count:05d}.safetensors" for index in range(1, count + 1)]


def _header(shard: Sequence[PlannedTensor]) -> bytes:
    """The length-prefixed JSON header of a shard holding ``shard`` in order, data unpadded."""
    entries: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for tensor in shard:
        entries[tensor.name] = {
            "dtype": _DTYPES[tensor.dtype],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + tensor.nbytes],
        }
        offset += tensor.nbytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % _HEADER_ALIGN)
    return struct.pack("<Q", len(text)) + text
