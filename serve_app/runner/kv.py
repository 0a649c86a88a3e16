"""The runner's KV cache: one static slot per batch row, allocated once and reused.

Per layer, keys and values are ``[slots, kv_heads, capacity, head_dim]``. A request owns one
slot from admission to its end, position ``p`` in column ``p``: nothing is padded or shifted as
requests come and go, and a decode step reads slots ``0 .. rows - 1`` in place (``move`` keeps
decoding requests in the lowest slots). Capacity grows by doubling up to the
context length and drops back when the engine is idle, so a replica holds memory for the
longest prompt in flight, not ``slots * context_length``.

Prefix-cache entries are HF-layout tuples (per layer ``[1, kv_heads, n, head_dim]``): ``load``
copies one into a slot (a hit costs a copy, not a recompute); ``read`` gives views to copy out.
"""

from __future__ import annotations

from typing import Any

import torch

from serve_app.runner.pages import return_freed_memory

# Per layer (keys, values), each [1, kv_heads, seq_len, head_dim]: a prefix-cache entry.
KV = tuple[tuple[torch.Tensor, torch.Tensor], ...]

# Positions per slot a cache starts with and shrinks back to when idle: small (256 held tens of MB
# idle per replica), as doubling copies only used columns, little next to reading the prompt.
MIN_CAPACITY = 64


class SlotCache:
    def __init__(
        self,
        layers: int,
        slots: int,
        kv_heads: int,
        head_dim: int,
        *,
        capacity: int,
        max_capacity: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self.shape = (slots, kv_heads, head_dim)
        self.num_layers = layers
        self.dtype = dtype
        self.device = torch.device(device)  # the weights' device: a GPU runner's KV stays there
        self.max_capacity = max_capacity
        self.initial_capacity = max(1, min(capacity, max_capacity))
        self.capacity = 0
        # Decode graphs captured over this allocation's tensors, by (rows, span), and their
        # pool: both go with the tensors (see ``graphs``). A pool whose graphs were all freed
        # cannot be captured into again (torch's allocator asserts, seen after a cache grew).
        self.graphs: dict[tuple[int, int], Any] = {}
        self.graph_pool: Any = None
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._allocate(self.initial_capacity, keep=0)

    @property
    def slots(self) -> int:
        return self.shape[0]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def _allocate(self, capacity: int, keep: int) -> None:
        slots, heads, dim = self.shape
        new_keys, new_values = [], []
        for index in range(self.num_layers):
            k = torch.zeros(slots, heads, capacity, dim, dtype=self.dtype, device=self.device)
            v = torch.zeros_like(k)
            if keep:
                k[:, :, :keep] = self.keys[index][:, :, :keep]
                v[:, :, :keep] = self.values[index][:, :, :keep]
            new_keys.append(k)
            new_values.append(v)
        self.keys, self.values, self.capacity = new_keys, new_values, capacity
        self.graphs, self.graph_pool = {}, None

    def ensure(self, width: int) -> None:
        """Grow (doubling, keeping every slot's columns) so ``width`` columns fit."""
        if width <= self.capacity:
            return
        if width > self.max_capacity:
            raise ValueError(f"{width} positions exceed the cache's {self.max_capacity}")
        capacity = self.capacity
        while capacity < width:
            capacity *= 2
        self._allocate(min(capacity, self.max_capacity), keep=self.capacity)

    def shrink(self) -> None:
        """Back to the initial capacity, and the freed heap back to the OS (a cheap trim; call
        only when no slot holds anything: the engine is idle)."""
        if self.capacity != self.initial_capacity:
            self._allocate(self.initial_capacity, keep=0)
        return_freed_memory()

    def write(
        self,
        layer: int,
        slot_of: torch.Tensor,
        positions: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``[N, kv_heads, D]`` keys/values at (slot, position) pairs; return the layer."""
        k, v = self.keys[layer], self.values[layer]
        k.transpose(1, 2)[slot_of, positions] = keys.to(self.dtype)
        v.transpose(1, 2)[slot_of, positions] = values.to(self.dtype)
        return k, v

    def load(self, slot: int, kv: KV) -> None:
        n = kv[0][0].shape[-2]
        self.ensure(n)
        for index, (k, v) in enumerate(kv):
            self.keys[index][slot, :, :n] = k[0]
            self.values[index][slot, :, :n] = v[0]

    def read(self, slot: int, length: int) -> KV:
        """Views of a slot's first ``length`` positions in the prefix cache's layout."""
        return tuple(
            (k[slot : slot + 1, :, :length], v[slot : slot + 1, :, :length])
            for k, v in zip(self.keys, self.values, strict=True)
        )

    def move(self, source: int, dest: int, length: int) -> None:
        """Copy a slot's first ``length`` positions to another slot."""
        for k, v in zip(self.keys, self.values, strict=True):
            k[dest, :, :length] = k[source, :, :length]
            v[dest, :, :length] = v[source, :, :length]
