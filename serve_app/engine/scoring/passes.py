"""The scorer's model passes: the shared prefix's KV, then packed tree rows on top of it.

Two implementations of the same two steps, picked once per scorer the way the generating
engine picks its backend (``runner.backend.configured_runner``):

- ``RunnerPass``: the engine's own runner (``Qwen2Runner``, dense weights: scoring is
  prefill-shaped work) over a one-slot ``SlotCache`` that holds the prefix, so a prefix-cache
  hit costs a copy into the slot and the rows' KV is written after it in place;
- ``HFPass``: the HF model's forward over a ``DynamicCache``, for models the runner does not
  run and for ``runner: hf``.

Both return final-normed hidden states; the scorer runs the LM head (``head``) only where it
reads. Prefix KV is the prefix cache's layout (per layer ``[1, kv_heads, n, head_dim]``), so
entries written by either pass are read by the other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from serve_app.engine.hf_backend import cache_from_kv, kv_from_cache
from serve_app.engine.scoring.trie import Row, tree_mask

# Prefix tokens per runner forward: bounds the causal mask and the activations of a 32k-token
# state (a few hundred MB at most) without splitting a typical state at all.
PREFILL_CHUNK_TOKENS = 2048

if TYPE_CHECKING:
    from serve_app.engine.prefix_cache import KV
    from serve_app.engine.runner.qwen2 import Qwen2Runner


class HFPass:
    """The HF model's forward: a batch-1 ``DynamicCache`` prefix, expanded over the rows."""

    def __init__(self, model: Any, device: Any, pad_id: int) -> None:
        self.model = model
        self.device = device
        self.pad_id = pad_id
        self.base = model.base_model
        self.head = model.get_output_embeddings()

    def prefix(self, prefix: list[int], cached_len: int, cached: KV | None) -> KV:
        """KV of ``prefix``: the cached first ``cached_len`` tokens, the rest run on top."""
        import torch

        if cached_len == len(prefix):
            return cached
        ids = torch.tensor([prefix[cached_len:]], device=self.device)
        past = cache_from_kv(cached) if cached_len else None
        out = self.base(input_ids=ids, past_key_values=past, use_cache=True)
        return kv_from_cache(out.past_key_values)

    def forward(self, rows: list[Row], kv: KV, offset: int) -> Any:
        """Hidden states ``[B, width, H]`` of right-padded tree rows on top of ``kv``."""
        import torch
        from transformers import DynamicCache

        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        positions = torch.full((len(rows), width), offset, dtype=torch.long)
        for b, row in enumerate(rows):
            ids[b, : len(row)] = torch.tensor(row.tokens)
            positions[b, : len(row)] = torch.tensor(row.depths) + offset
        mask = tree_mask(rows, offset, width)
        if self.model.config._attn_implementation != "sdpa":  # eager adds the mask to scores
            mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
        expanded = [
            (k.expand(len(rows), -1, -1, -1), v.expand(len(rows), -1, -1, -1)) for k, v in kv
        ]
        out = self.base(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            past_key_values=DynamicCache(ddp_cache_data=expanded, config=self.model.config),
            use_cache=True,
        )
        return out.last_hidden_state

    def release(self) -> None:
        """Nothing held between requests."""


class RunnerPass:
    """The runner over one KV slot: the prefix in its first columns, a pass's rows after it.

    ``max_columns``: the most columns a request uses (a packed row's tokens each take a
    column, siblings included, so the prefix plus one pass can pass the context length; the
    scored-token budget bounds it). ``check`` runs before every decoder layer
    (cancellation).
    """

    def __init__(
        self,
        runner: Qwen2Runner,
        max_columns: int,
        check: Callable[[], None],
    ) -> None:
        from serve_app.engine.runner.kv import MIN_CAPACITY

        self.runner = runner
        self.cache = runner.new_cache(1, MIN_CAPACITY, max_columns)
        self.check = check

    def head(self, states: Any) -> Any:
        return self.runner.lm_head(states, self.runner.quantized_prompts)

    def prefix(self, prefix: list[int], cached_len: int, cached: KV | None) -> KV:
        """The slot holds ``prefix``'s KV (a hit is copied in, the rest run); views of it."""
        # One column past the prefix (rows always follow it): the views returned never span
        # the slot's whole buffer, so PrefixCache.insert copies them out instead of keeping a
        # buffer the rows overwrite.
        self.cache.ensure(len(prefix) + 1)
        if cached_len:
            self.cache.load(0, cached)
        for start in range(cached_len, len(prefix), PREFILL_CHUNK_TOKENS):
            tokens = prefix[start : start + PREFILL_CHUNK_TOKENS]
            self.runner.forward(self.cache, 0, [tokens], [start], decode=False, check=self.check)
        return self.cache.read(0, len(prefix))

    def forward(self, rows: list[Row], kv: KV, offset: int) -> Any:
        """Hidden states ``[1, len, H]`` of one packed row; ``kv`` is already in the slot."""
        import torch

        (row,) = rows  # the scorer packs a pass's questions into one row
        mask = tree_mask(rows, offset, len(row))[0, 0]
        positions = torch.tensor(row.depths) + offset
        hidden = self.runner.forward_tree(
            self.cache, 0, offset, row.tokens, positions, mask, self.check
        )
        return hidden.unsqueeze(0)

    def release(self) -> None:
        """Back to the initial capacity: a long state's columns are not kept while idle."""
        self.cache.shrink()
