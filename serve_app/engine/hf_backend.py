"""The HF backend's decode batch: one left-padded KV cache shared by every decoding request.

As HF ``generate`` batches decoding: per layer, keys and values ``[B, kv_heads, T, head_dim]``,
row ``b``'s ``n_b`` real positions right-aligned in columns ``T - n_b .. T - 1`` (zeros before),
marked by a ``[B, T]`` mask. Each decode step appends one column to all rows
(``DynamicCache.update``) and feeds ``position_ids`` ``n_b`` so RoPE sees true positions. The
tensors are rebuilt only when membership changes: a joining request's KV is left-padded and
concatenated on the batch axis (the batch padded when the newcomer is longer); after rows leave,
all-padding leading columns are trimmed: the rest stop paying for a long request that left.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from serve_app.engine.model_backend import PromptChunk
from serve_app.engine.tree import Row, read_log_probs, tree_mask
from serve_app.runner.kv import KV


def cache_from_kv(kv: KV) -> DynamicCache:
    """A ``DynamicCache`` holding the tensors as-is (its constructor copies), in plain
    ``DynamicLayer``s: the engine's models use full attention everywhere."""
    cache = DynamicCache()
    for keys, values in kv:
        layer = DynamicLayer()
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
        cache.layers.append(layer)
    return cache


def kv_from_cache(cache: DynamicCache) -> KV:
    return tuple((layer.keys, layer.values) for layer in cache.layers)


def _pad_left(t: torch.Tensor, n: int) -> torch.Tensor:
    """Prepend ``n`` zero positions on the sequence axis (dim -2 of [B, H, T, D])."""
    return F.pad(t, (0, 0, n, 0)) if n else t


class DecodeBatch:
    """The decoding requests and their shared KV: ``rows[b]`` (anything with ``last_token_id``
    and ``num_computed``, its count of real positions) owns row ``b``."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self.rows: list[Any] = []
        self.cache: DynamicCache | None = None
        self.mask: torch.Tensor | None = None  # [B, T] long, 1 = real position

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def width(self) -> int:
        """T: the padded sequence length of the batch's KV."""
        return 0 if self.mask is None else self.mask.shape[1]

    def add(self, rows: Sequence[Any], kvs: Sequence[KV]) -> None:
        """Join requests whose prefill finished; ``kvs[i]`` holds ``rows[i]``'s positions."""
        if not rows:
            return
        lengths = [kv[0][0].shape[-2] for kv in kvs]
        width = max([self.width, *lengths])
        parts_kv: list[KV] = []
        parts_mask: list[torch.Tensor] = []
        if self.rows:
            parts_kv.append(kv_from_cache(self.cache))
            parts_mask.append(F.pad(self.mask, (width - self.width, 0)))
        for kv, n in zip(kvs, lengths, strict=True):
            parts_kv.append(kv)
            mask = torch.zeros(1, width, dtype=torch.long, device=self.device)
            mask[:, width - n :] = 1
            parts_mask.append(mask)
        merged = []
        for layer in range(len(parts_kv[0])):
            keys = [_pad_left(p[layer][0], width - p[layer][0].shape[-2]) for p in parts_kv]
            values = [_pad_left(p[layer][1], width - p[layer][1].shape[-2]) for p in parts_kv]
            merged.append((torch.cat(keys, dim=0), torch.cat(values, dim=0)))
        self.cache = cache_from_kv(tuple(merged))
        self.mask = torch.cat(parts_mask, dim=0)
        self.rows.extend(rows)

    def remove(self, rows: Sequence[Any]) -> None:
        """Drop rows (finished or aborted requests) and trim all-padding leading columns."""
        drop = {id(r) for r in rows}
        keep = [i for i, r in enumerate(self.rows) if id(r) not in drop]
        if len(keep) == len(self.rows):
            return
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.cache, self.mask = None, None
            return
        index = torch.tensor(keep, dtype=torch.long, device=self.device)
        mask = self.mask.index_select(0, index)
        start = int(mask.any(dim=0).long().argmax())  # first column some row still uses
        self.mask = mask[:, start:]
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, index)[..., start:, :]
            layer.values = layer.values.index_select(0, index)[..., start:, :]

    def forward(self, model: Any) -> torch.Tensor:
        """One decode step: each row's last sampled token, its KV appended as a new column;
        next-token logits ``[B, V]``. The caller advances each row's ``num_computed``."""
        input_ids = torch.tensor(
            [[r.last_token_id] for r in self.rows], dtype=torch.long, device=self.device
        )
        position_ids = torch.tensor(
            [[r.num_computed] for r in self.rows], dtype=torch.long, device=self.device
        )
        ones = torch.ones(len(self.rows), 1, dtype=torch.long, device=self.device)
        mask = torch.cat([self.mask, ones], dim=1)
        out = model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=position_ids,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.mask = mask
        return out.logits[:, -1, :]


class HFBackend:
    """``backend.ModelBackend`` over an HF model, without speculation: a ``DynamicCache`` per
    prefilling request (its ``kv``), then the shared ``DecodeBatch``."""

    supports_speculation = False
    prompt_batch = 1  # each request's cache is its own DynamicCache

    def __init__(self, model: Any, device: str | torch.device = "cpu") -> None:
        self.model = model
        self.device = torch.device(device)
        self.batch = DecodeBatch(self.device)

    @property
    def rows(self) -> list[Any]:
        return self.batch.rows

    def __len__(self) -> int:
        return len(self.batch)

    def begin(self, state: Any, kv: KV | None) -> None:
        state.kv = cache_from_kv(kv) if kv is not None else DynamicCache()

    def prefill(
        self, chunks: Sequence[PromptChunk], check: Callable[[], None] | None = None
    ) -> list[torch.Tensor]:
        """One request's chunk; ``check`` is unused (the HF forward has no hook: aborts wait)."""
        (chunk,) = chunks
        state, start, end = chunk.state, chunk.start, chunk.end
        out = self.model(
            input_ids=torch.tensor(
                [state.prompt_ids[start:end]], dtype=torch.long, device=self.device
            ),
            position_ids=torch.arange(start, end, device=self.device).unsqueeze(0),
            past_key_values=state.kv,
            use_cache=True,
            logits_to_keep=1,
        )
        return [out.logits[0, -1]]

    def computed_kv(self, state: Any) -> KV | None:
        """A prefilling request's cache, unless a pass stopped half-way through it."""
        if state.kv is None:
            return None
        kv = kv_from_cache(state.kv)
        if any(k.shape[-2] != state.num_computed for k, _ in kv):
            return None
        return kv

    def join(self, states: Sequence[Any]) -> None:
        self.batch.add(states, [kv_from_cache(s.kv) for s in states])
        for state in states:
            state.kv = None

    def decode(self, drafts: Sequence[Sequence[int]]) -> torch.Tensor:
        """Logits ``[rows, V]`` (drafts must be empty: no speculation here)."""
        return self.batch.forward(self.model)

    def score(self, state: Any, row: Row, check: Callable[[], None]) -> list[float]:
        """Via a fresh ``DynamicCache`` over the prefix tensors: the prefix is not appended to."""
        offset = state.num_computed
        kv = kv_from_cache(state.kv)
        positions = (torch.tensor(row.depths) + offset).unsqueeze(0)
        mask = tree_mask([row], offset, len(row))
        if self.model.config._attn_implementation != "sdpa":  # eager adds the mask to scores
            mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
        out = self.model.base_model(
            input_ids=torch.tensor([row.tokens], device=self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            past_key_values=DynamicCache(ddp_cache_data=list(kv), config=self.model.config),
            use_cache=True,
        )
        head = self.model.get_output_embeddings()
        return read_log_probs(out.last_hidden_state[0], row.reads, head)

    def release(self, states: Sequence[Any]) -> None:
        self.batch.remove(states)
        for state in states:
            state.kv = None

    def idle(self) -> None:
        """Nothing held between requests (each request's cache is its own)."""

    def reset(self) -> None:
        self.batch = DecodeBatch(self.device)
