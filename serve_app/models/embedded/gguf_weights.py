"""A GGUF file's weights under the model's parameter names, dequantized one tensor at a time.

This is transformers' own GGUF loading path for the architectures it loads through
``load_gguf_checkpoint`` (Qwen2 among them): the same name map (``get_gguf_hf_weights_map``), the
same per-architecture fix-ups (``TENSOR_PROCESSORS``, e.g. Llama's Q/K un-permute) and the same
``gguf.dequantize``, but yielding each tensor instead of collecting the whole model, so that
converting costs one float32 tensor of memory, not the model (9 GB for the 1.5B).

The file is read with ordinary reads, not through its memory map: mapped pages count as the
process's resident memory, and a model's worth of them would undo the point.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from serve_app.models.embedded.safetensors_shards import PlannedTensor

_CHUNK_ELEMENTS = 1 << 22  # values dequantized per step: bounds numpy's temporaries (16 MB)


class GgufWeights:
    """The float32 tensors ``from_pretrained(gguf_file=...)`` would load, as a plan and a stream.

    ``model`` is the model built from the file's config (on the meta device: only names and
    shapes are read). Tensors the model ties to others are left out, as ``save_pretrained``
    leaves them out; a parameter the file lacks is an error, not a random weight.
    """

    def __init__(self, gguf_path: str | Path, model: Any) -> None:
        from gguf import GGUFReader
        from transformers.integrations.gguf import is_gguf_arch_supported
        from transformers.modeling_gguf_pytorch_utils import (
            TENSOR_PROCESSORS,
            TensorProcessor,
            get_gguf_hf_weights_map,
            read_field,
        )

        self.path = Path(gguf_path)
        reader = GGUFReader(self.path)
        architecture = read_field(reader, "general.architecture")[0]
        if is_gguf_arch_supported(architecture):
            # transformers loads these through its newer conversion ops, not mirrored here.
            raise NotImplementedError(f"{self.path.name}: architecture {architecture!r}")
        self._processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(
            config=model.config.to_dict()
        )
        self._names = get_gguf_hf_weights_map(model, self._processor)
        expected = _saved_shapes(model)
        self._tensors = [
            tensor for tensor in reader.tensors if self._names.get(tensor.name) in expected
        ]
        names = [self._names[tensor.name] for tensor in self._tensors]
        self.plan = [PlannedTensor(name, expected[name], torch.float32) for name in names]
        missing = sorted(set(expected) - set(names))
        if missing:
            raise ValueError(f"{self.path.name} lacks the model's tensors {missing}")

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(parameter name, float32 tensor)`` in plan order, one alive at a time."""
        with open(self.path, "rb") as file:
            for tensor, planned in zip(self._tensors, self.plan, strict=True):
                weights = _dequantize(file, tensor)
                result = self._processor.process(
                    weights=weights,
                    name=tensor.name,
                    tensor_key_mapping=self._names,
                    parsed_parameters={"tensors": {}},  # where MoE processors stash their merges
                )
                if result.name != tensor.name:  # a processor that merges tensors (MoE experts)
                    raise NotImplementedError(f"{tensor.name}: merged by {self._processor}")
                dense = torch.from_numpy(np.ascontiguousarray(result.weights)).float()
                del weights, result  # else the last tensor outlives the making of the next
                yield planned.name, dense
                del dense


def _saved_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    """What ``save_pretrained`` writes: the state dict without the tied copies."""
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    return {
        name: tuple(value.shape) for name, value in model.state_dict().items() if name not in tied
    }


def _dequantize(file: Any, tensor: Any) -> np.ndarray:
    """``gguf.dequantize`` of the whole tensor, done a block of rows at a time.

    Quantized blocks never span rows and dequantizing is elementwise per block, so the result is
    bit-identical to one call over the tensor, without its several tensor-sized temporaries.
    """
    from gguf import dequantize

    layout = tensor.data  # a lazy memory-mapped view: its shape and dtype, never its pages
    if layout.ndim == 1:  # a norm or a bias: small, and a quantized row must stay whole
        return np.asarray(dequantize(_read(file, tensor, 0, layout.shape), tensor.tensor_type))
    rows, row_shape = layout.shape[0], layout.shape[1:]
    step = max(1, _CHUNK_ELEMENTS // max(1, tensor.n_elements // rows))
    out: np.ndarray | None = None
    for start in range(0, rows, step):
        count = min(step, rows - start)
        chunk = dequantize(_read(file, tensor, start, (count, *row_shape)), tensor.tensor_type)
        if out is None:
            out = np.empty((rows, *chunk.shape[1:]), dtype=chunk.dtype)
        out[start : start + count] = chunk
    assert out is not None
    return out


def _read(file: Any, tensor: Any, first_row: int, shape: tuple[int, ...]) -> np.ndarray:
    """Rows ``first_row`` on of ``tensor`` as stored (blocks or values), in ``shape``."""
    layout = tensor.data
    row_bytes = math.prod(layout.shape[1:]) * layout.dtype.itemsize
    file.seek(tensor.data_offset + first_row * row_bytes)
    count = math.prod(shape)
    values = np.fromfile(file, dtype=layout.dtype, count=count)
    if values.size != count:
        raise ValueError(f"{tensor.name}: the file ends inside this tensor")
    return values.reshape(shape)
