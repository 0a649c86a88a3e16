"""A plain-torch forward for Qwen2-architecture models over the runner's slot KV cache.

One ``forward`` serves prefill chunks, decode steps and speculative verification: a ragged batch
(row ``b`` feeds ``len(tokens[b])`` tokens from position ``starts[b]`` into KV slot
``slot0 + b``), every linear over the flattened tokens (no padding compute), padding only inside
attention, which reads the slots' keys/values in place. Query ``j`` of row ``b`` sees cache
columns ``<= starts[b] + j``: causal within the new tokens, and blind to stale columns past a
row's end (rejected drafts', overwritten later). ``forward_tree``, the decision scorer's pass,
runs the same layers over an option trie with explicit positions and a tree mask.

The HF module stays the source of truth: embeddings, norms' weights and the rotary embedding
(whatever its ``rope_type``) are read from it; only the linears get quantized copies. Passes run
where the weights are (``RUNNER_DEVICES``, ``Qwen2Runner.device``); on a CUDA GPU on dense weights
in the model's dtype (``builder.decode_weights``: the quantized kernels are CPU kernels).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from serve_app.runner.attention import (
    aligned_prefill_attention,
    aligned_width,
    causal_prompt_attention,
    exact_attention,
    rope,
    small_attention,
)
from serve_app.runner.graphs import DecodeGraphs
from serve_app.runner.kv import SlotCache
from serve_app.runner.layout import PassLayout
from serve_app.runner.lora import LoraAdapter, LoraBatch
from serve_app.runner.prepared_weights import FirstEntry, PreparedWeights

logger = logging.getLogger(__name__)

# Position-0 entries kept (``Qwen2Runner.first_token``; ~30 KB each on the 0.5B): this service's
# prompts start with a special token (saved at preparation), the bound is for ones that don't.
FIRST_TOKENS_KEPT = 256
# Where the forward runs: torch's CPU, or a CUDA GPU (the HF model elsewhere, e.g. mps).
RUNNER_DEVICES = ("cpu", "cuda")


def unsupported_reason(model: Any) -> str | None:
    """Why the runner cannot run ``model`` (the engine then uses HF), or None."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) != "qwen2":
        return f"model_type {getattr(config, 'model_type', None)!r} is not qwen2"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"hidden_act {config.hidden_act!r}"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []):
        return "non-full attention layers"
    device = next(model.parameters()).device
    if device.type not in RUNNER_DEVICES:
        return f"the runner runs on {' and '.join(RUNNER_DEVICES)}, not {device.type}"
    return None


def norm_weight(weight: torch.Tensor) -> torch.Tensor:
    """An RMSNorm weight as the runner holds it: as is on CPU, else in fp32 (the activations'):
    torch's fused rms_norm refuses a bf16 weight on fp32 input (separate kernels, same numbers)."""
    weight = weight.detach()
    return weight if weight.device.type == "cpu" else weight.float()


class Qwen2Runner:
    """Weights and forward of one Qwen2 model; ``SlotCache`` holds the keys/values."""

    def __init__(
        self,
        model: Any,
        weights: PreparedWeights,
        small_prefill_tokens: int = 0,
        adapters: Mapping[str, LoraAdapter] | None = None,
        graphs: DecodeGraphs | None = None,
    ) -> None:
        config = model.config
        self.model = model
        self.weights = weights
        self.layers = weights.layers
        self.lm_head = weights.lm_head
        self.quantized_prompts = weights.choice.quantized_prompts
        # The runner's C kernels (``native``) where its weights use them: decode attention too.
        self.native = weights.native
        self.small_prefill_tokens = small_prefill_tokens
        self.adapters: dict[str, LoraAdapter] = dict(adapters or {})  # ``lora``, by name
        # Position 0's entries by (adapter name, token id), as an adapter changes its KV too:
        # the prepared ones, then an LRU of what requests start with.
        self.first_tokens: OrderedDict[tuple[str, int], FirstEntry] = OrderedDict(
            weights.first_tokens
        )
        # Captured decode steps (``graphs.DecodeGraphs``); None: every step runs eagerly.
        self.graphs = graphs
        self.embed = model.model.embed_tokens.weight
        self.device = self.embed.device
        self.final_norm = norm_weight(model.model.norm.weight)
        self.rotary = model.model.rotary_emb
        self.eps = float(config.rms_norm_eps)
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(config.num_key_value_heads)
        self.head_dim = int(
            getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        )
        self.intermediate = int(config.intermediate_size)
        self.vocab_size = int(config.vocab_size)

    @property
    def decode_weights(self) -> str:
        linear = self.layers[0].qkv
        if linear.q4 is not None:
            return "q4"
        if linear.q8 is not None or linear.int8 is not None:
            return "int8"
        return "int4" if linear.int4 is not None else "dense"

    def new_cache(self, slots: int, capacity: int, max_capacity: int) -> SlotCache:
        return SlotCache(
            len(self.layers),
            slots,
            self.num_kv_heads,
            self.head_dim,
            capacity=capacity,
            max_capacity=max_capacity,
            dtype=self.embed.dtype if self.embed.dtype == torch.float32 else torch.float32,
            device=self.device,
        )

    def _attend(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        mask: torch.Tensor,
        decode: bool,
    ) -> torch.Tensor:
        if decode:
            blocked = ~mask.unsqueeze(1)
            return small_attention(q, keys, values, blocked)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), weight, self.eps)

    def forward(
        self,
        cache: SlotCache,
        slot0: int,
        tokens: Sequence[Sequence[int]],
        starts: Sequence[int],
        *,
        decode: bool,
        check: Callable[[], None] | None = None,
        slots: Sequence[int] | None = None,
        adapters: Sequence[str] | None = None,
    ) -> torch.Tensor:
        """Feed ``tokens[b]`` at ``starts[b]..`` of slot ``slot0 + b`` (``slots[b]`` where given:
        prompt chunks of requests in any slots) and write their KV. ``adapters[b]``: row ``b``'s
        LoRA adapter by name ("": none). ``check``: called before every layer (it raises to stop
        the pass, e.g. on cancellation).

        ``decode`` (a decode or verify step): on the decode weights (q4 for the decoder layers
        only, int8 or int4), fp32 logits ``[sum(len(t)), V]`` for every token, rows in order. A
        token's numbers never depend on the batch or on how many drafts are verified with it:
        the weights do not depend on the row count, quantized linears work per row (int4: bf16;
        int8: a scale per row; q4: per 32 inputs), and on CPU each query attends alone.
        Otherwise a prefill chunk: logits ``[B, V]`` of each row's last token, on dense weights,
        except a chunk past position 0 of at most ``small_prefill_tokens`` tokens (memory-bound
        like a decode step, so faster on the decode weights); with ``quantized_prompts`` all run
        on them but position 0 (``first_token``), and a chunk that starts a prompt is one row.
        Logits always come from the decode head where there is one, so every sampled token, the
        first included, is read through the same head (it feeds no KV).
        """
        names = list(adapters) if adapters is not None else [""] * len(tokens)
        if not decode and self.quantized_prompts and 0 in starts:
            if len(tokens) != 1:
                raise ValueError("a chunk that starts a prompt on quantized weights is one row")
            hidden = self.first_token(cache, slot0, tokens[0][0], names[0])
            if len(tokens[0]) == 1:
                return self.lm_head(self._norm(hidden, self.final_norm), True, decode=True)
            return self.forward(
                cache, slot0, [tokens[0][1:]], [1], decode=False, check=check, adapters=names
            )
        if decode and self.graphs is not None and slot0 == 0 and not any(names):
            logits = self.graphs.decode(self, cache, tokens, starts)
            if logits is not None:
                return logits
        # Never a chunk holding position 0 on dense prompts: see ``first_token``.
        small = self.quantized_prompts or (
            sum(len(t) for t in tokens) <= self.small_prefill_tokens and min(starts) > 0
        )
        if slots is not None and list(slots) == list(range(slots[0], slots[0] + len(slots))):
            slot0, slots = slots[0], None  # consecutive: read in place
        batch = PassLayout.ragged(slot0, tokens, starts, decode, self.device, slots)
        lora = LoraBatch.of_rows([self.adapter(name) for name in names], batch.row_of)
        x = self._layers(cache, batch, decode or small, check, decode, lora)
        if not decode:
            ends_flat = torch.tensor([len(t) for t in tokens], device=self.device).cumsum(0) - 1
            x = x[ends_flat]
        return self.lm_head(self._norm(x, self.final_norm), True, decode=True)

    def static_decode(
        self,
        cache: SlotCache,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        span: int,
    ) -> torch.Tensor:
        """A fixed-shape decode step for ``DecodeGraphs``: row ``b`` (slot ``b``) feeds the
        ``span`` tokens ``tokens[b * span:][:span]`` at ``positions`` (likewise), their KV
        written into ``slots[i]`` (the spare for a padding row), each attending over the
        allocation's columns up to its position. Logits ``[rows * span, V]``; ``cache`` must
        already hold ``max(positions) + 1`` columns."""
        batch = PassLayout.static_decode(tokens, positions, slots, span, cache.capacity)
        x = self._layers(cache, batch, True, None, True)
        return self.lm_head(self._norm(x, self.final_norm), True, decode=True)

    def adapter(self, name: str) -> LoraAdapter | None:
        """The adapter named ``name`` ("": none); the engine admits only names it has."""
        return self.adapters[name] if name else None

    def first_token(
        self, cache: SlotCache, slot: int, token: int, adapter: str = ""
    ) -> torch.Tensor:
        """Write position 0's keys/values for ``token`` into ``slot``; its hidden state ``[1, H]``.

        Qwen's first position (the attention sink every later token reads) carries activations
        many times the others' in a few channels, and int8's one scale per row flattens the rest
        of that row: whole prompts on int8 failed behaviour tests that pass with position 0 on
        dense weights. Position 0 sees only itself, so its KV depends on the token id alone:
        computed once on dense weights and kept (LRU, ``FIRST_TOKENS_KEPT``)."""
        key = (adapter, token)
        entry = self.first_tokens.get(key)
        if entry is None:
            logger.info("runner: position-0 entry for token %d computed on dense weights", token)
            batch = PassLayout.ragged(slot, [[token]], [0], False, self.device)
            lora = LoraBatch.of_rows([self.adapter(adapter)], batch.row_of)
            hidden = self._layers(cache, batch, False, None, lora=lora)
            kv = tuple((k.clone(), v.clone()) for k, v in cache.read(slot, 1))
            entry = self.first_tokens[key] = (kv, hidden)
            if len(self.first_tokens) > FIRST_TOKENS_KEPT:
                self.first_tokens.popitem(last=False)
            return hidden
        self.first_tokens.move_to_end(key)
        cache.load(slot, entry[0])
        return entry[1]

    def forward_tree(
        self,
        cache: SlotCache,
        slot: int,
        start: int,
        tokens: Sequence[int],
        positions: torch.Tensor,
        mask: torch.Tensor,
        check: Callable[[], None] | None = None,
    ) -> torch.Tensor:
        """Final-normed hidden states ``[N, hidden]`` of ``tokens`` laid out as a tree, for
        scoring on the prompt weights (dense, or the decode weights with ``quantized_prompts``):
        token ``i`` is written at column ``start + i`` of ``slot`` (over the prefix in columns
        ``< start``), rotated as position ``positions[i]``, attending where ``mask[i]``
        (``[N, start + N]`` bool): an option trie's sibling branches share a position without
        seeing each other. The caller applies ``lm_head(h, quantized_prompts)`` where it reads.
        """
        batch = PassLayout.tree(slot, start, tokens, positions, mask, self.device)
        x = self._layers(cache, batch, self.quantized_prompts, check)
        return self._norm(x, self.final_norm)

    def _layers(
        self,
        cache: SlotCache,
        batch: PassLayout,
        quantized: bool,
        check: Callable[[], None] | None,
        decode: bool = False,
        lora: LoraBatch | None = None,
    ) -> torch.Tensor:
        """The decoder layers over the batch's flattened tokens ``[N]``: hidden states
        ``[N, hidden]`` before the final norm, each token's KV written at (its slot, its column).
        ``quantized``: int4/int8 linears where present; ``decode``: a decode step's rows (q4
        linears where present); ``lora``: the adapters' deltas for the rows that named them."""

        def linear(fused: str, x: torch.Tensor) -> torch.Tensor:
            y = getattr(layer, fused)(x, quantized, decode)
            return y if lora is None else lora.add(y, x, index, fused)

        rows, span, padded = batch.rows, batch.span, batch.padded
        width = batch.mask.shape[-1]
        cache.ensure(width)
        if batch.prefill_start is not None:  # room for the aligned attention's widths
            cache.ensure(min(aligned_width(width), cache.max_capacity))
        cos, sin = self.rotary(self.embed[:1].unsqueeze(0), batch.positions.unsqueeze(0))
        cos, sin = cos[0].unsqueeze(1), sin[0].unsqueeze(1)  # [N, 1, D]
        qk_heads = self.num_heads + self.num_kv_heads
        qk_width = qk_heads * self.head_dim
        x = F.embedding(batch.tokens, self.embed).float()
        for index, layer in enumerate(self.layers):
            if check is not None:
                check()
            h = self._norm(x, layer.input_norm)
            qkv = linear("qkv", h)
            # q and k heads side by side: one RoPE for both.
            qk = rope(qkv[:, :qk_width].view(-1, qk_heads, self.head_dim), cos, sin)
            q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
            v = qkv[:, qk_width:].view(-1, self.num_kv_heads, self.head_dim)
            keys, values = cache.write(index, batch.slot_of, batch.columns, k, v)
            if batch.read_slots is None:
                keys, values = (
                    keys[batch.slot0 : batch.slot0 + rows, :, :width],
                    values[batch.slot0 : batch.slot0 + rows, :, :width],
                )
            else:  # rows in other slots: a copy of theirs
                keys = keys[batch.read_slots, :, :width]
                values = values[batch.read_slots, :, :width]
            if padded:
                qp = q.new_zeros(rows, span, self.num_heads, self.head_dim)
                qp[batch.row_of, batch.step_of] = q
            else:
                qp = q.view(rows, span, self.num_heads, self.head_dim)
            if batch.prefill_start is not None:
                attn = aligned_prefill_attention(
                    qp.transpose(1, 2), cache, index, batch.slot0, batch.prefill_start
                )
            elif batch.prompt_rows is not None:
                attn = causal_prompt_attention(
                    qp.transpose(1, 2), keys, values, batch.prompt_rows, self.embed.dtype
                )
            elif batch.query_ends is not None:
                attn = exact_attention(
                    qp.transpose(1, 2), keys, values, batch.query_ends, self.native
                )
            else:
                attn = self._attend(qp.transpose(1, 2), keys, values, batch.mask, batch.decode)
            attn = attn.transpose(1, 2)
            attn = (
                attn[batch.row_of, batch.step_of]
                if padded
                else attn.reshape(-1, self.num_heads, self.head_dim)
            )
            x = x + linear("o", attn.reshape(x.shape[0], -1))
            h = self._norm(x, layer.post_norm)
            gate, up = linear("gate_up", h).split(self.intermediate, dim=-1)
            x = x + linear("down", F.silu(gate) * up)
        return x
