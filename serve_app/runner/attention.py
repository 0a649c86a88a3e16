"""The runner's attention kernels; each one's docstring says why a pass takes it.

On CPU: prompt chunks ``aligned_prefill_attention``, decode steps ``exact_attention`` (in C where
``native`` builds). Off it: prompt chunks ``causal_prompt_attention`` (torch's flash kernel on a
GPU). Other passes: a few queries per row ``small_attention``, many torch's SDPA. ``rope`` is
HF's rotate-half rotary embedding.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from serve_app.runner.kv import SlotCache
from serve_app.runner.native import Native

# Prompt attention in blocks of this many positions, aligned at multiples of it (see
# ``aligned_prefill_attention``), with at least ``MIN_QUERY_ROWS`` queries per call.
ATTENTION_BLOCK = 64
MIN_QUERY_ROWS = 8


def aligned_width(width: int) -> int:
    return -(-width // ATTENTION_BLOCK) * ATTENTION_BLOCK


def aligned_prefill_attention(
    q: torch.Tensor, cache: SlotCache, layer: int, slot: int, start: int
) -> torch.Tensor:
    """Attention of a prompt chunk's queries ``q`` ``[1, heads, span, D]`` (positions
    ``start..``) whose numbers do not depend on where the chunk starts or ends.

    torch's CPU attention gives a query the same bits whatever queries share the call, but not
    whatever the key width (its reductions' blocking follows it), nor in calls of 1-3 queries
    (another path): a prompt read cold and after a prefix-cache hit disagreed in the last bits,
    which int8 rounding over 24 layers grew into far-apart logits, now and then another greedy
    answer. So a query at position ``p`` attends over width ``ceil((p + 1) / 64) * 64`` (masked
    columns weigh exactly 0) in a call of at least 8 queries (the last repeated)."""
    keys, values = cache.keys[layer], cache.values[layer]
    span = q.shape[2]
    out = []
    position = start
    while position < start + span:
        block = (position // ATTENTION_BLOCK + 1) * ATTENTION_BLOCK
        end = min(block, start + span)
        width = min(block, keys.shape[2])
        queries = q[:, :, position - start : end - start]
        at = torch.arange(position, end, device=q.device)
        pad = MIN_QUERY_ROWS - (end - position)
        if pad > 0:
            queries = torch.cat([queries, queries[:, :, -1:].expand(-1, -1, pad, -1)], dim=2)
            at = torch.cat([at, at[-1:].expand(pad)])
        mask = torch.arange(width, device=q.device).view(1, 1, 1, width) <= at.view(1, 1, -1, 1)
        attended = F.scaled_dot_product_attention(
            queries,
            keys[slot : slot + 1, :, :width],
            values[slot : slot + 1, :, :width],
            attn_mask=mask,
            enable_gqa=True,
        )
        out.append(attended[:, :, : end - position])
        position = end
    return torch.cat(out, dim=2)


def causal_prompt_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    rows: list[tuple[int, int]],
    dtype: torch.dtype,
) -> torch.Tensor:
    """Attention of prompt chunks off the CPU: row ``b`` of ``q`` ``[rows, heads, span, D]``
    holds ``rows[b] = (start, length)``'s queries (positions ``start..``, padded to ``span``;
    a padded query's output is zeros), each attending over the columns up to its own of
    ``keys``/``values`` ``[rows, kv_heads, width, D]``. fp32 in and out, attention in ``dtype``.

    Not one padded call with ``attn_mask`` (as decode steps): torch's flash kernel takes no
    arbitrary mask and no fp32, and without it a long prompt's first token slowed far more than
    its linears' work grew (``bench.gpu``). One call per row in bf16 under ``causal_lower_right``
    (the row's last query sees every column) runs on the flash kernel."""
    out = q.new_zeros(q.shape)
    for b, (start, length) in enumerate(rows):
        width = start + length
        attended = F.scaled_dot_product_attention(
            q[b : b + 1, :, :length].to(dtype),
            keys[b : b + 1, :, :width].to(dtype),
            values[b : b + 1, :, :width].to(dtype),
            attn_mask=causal_lower_right(length, width),
            enable_gqa=True,
        )
        out[b, :, :length] = attended[0]
    return out


def exact_attention(
    q: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    ends: list[list[int]],
    native: Native | None,
) -> torch.Tensor:
    """Attention of each query over exactly the columns it may read, one at a time: row ``b``'s
    query ``j`` of ``q`` ``[rows, heads, span, D]`` over columns ``< ends[b][j]``.

    Not one padded pass (``small_attention``): kernels sum a padded row in another order than the
    row alone, and the 1-ulp difference crosses the decode weights' next activation rounding
    often enough to change greedy tokens; here a token's numbers are the same alone, beside other
    requests, or verified among drafts. ``native``: the C kernel (``kernels/attention.c``, faster
    than torch's matmuls), else torch, a few small ops per query and layer."""
    rows, heads, span, dim = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads  # query head h reads kv head h // group, as HF's repeat_kv
    out = q.new_empty(rows, span, heads, dim)
    native = native if dim % 8 == 0 and group <= 16 else None  # what attention.c takes
    for b, row_ends in enumerate(ends):
        for j, end in enumerate(row_ends):
            query = q[b, :, j].contiguous()
            if native is not None:
                native_attention(native, query, keys[b], values[b], end, out[b, j])
                continue
            grouped = query.view(kv_heads, group, dim)
            scores = torch.matmul(grouped, keys[b, :, :end].transpose(-1, -2)) * dim**-0.5
            probs = torch.softmax(scores, dim=-1)
            out[b, j] = torch.matmul(probs, values[b, :, :end]).reshape(heads, dim)
    return out.transpose(1, 2)


def native_attention(
    native: Native, query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, end: int,
    out: torch.Tensor,
) -> None:  # fmt: skip
    """One query ``[heads, D]`` over columns ``< end`` of one slot's ``[kv_heads, T, D]``
    keys and values (the cache's own rows: each kv head's columns contiguous), into ``out``."""
    heads, dim = query.shape
    assert keys.stride() == values.stride() and keys.stride()[1:] == (dim, 1)
    assert query.is_contiguous() and out.is_contiguous()
    status = native.library.attend_one(
        query.data_ptr(), heads, keys.shape[0], dim, keys.data_ptr(), values.data_ptr(),
        keys.stride(0), end, dim**-0.5, out.data_ptr(),
    )  # fmt: skip
    if status != 0:
        raise RuntimeError(f"decode attention kernel failed ({status})")


def small_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, blocked: torch.Tensor
) -> torch.Tensor:
    """Attention for a few queries per row as two batched matmuls over the grouped heads
    (torch's CPU flash kernel, built for many queries, is slower for decode-sized ones).
    ``blocked`` is ``[B, 1, 1, T, W]``, True = masked."""
    rows, heads, span, dim = q.shape
    kv_heads = keys.shape[1]
    group = heads // kv_heads  # query head h reads kv head h // group, as HF's repeat_kv
    grouped = q.reshape(rows, kv_heads, group * span, dim)
    scores = torch.matmul(grouped, keys.transpose(-1, -2)) * dim**-0.5
    scores = scores.view(rows, kv_heads, group, span, -1).masked_fill(blocked, float("-inf"))
    probs = torch.softmax(scores, dim=-1).view(rows, kv_heads, group * span, -1)
    return torch.matmul(probs, values).view(rows, heads, span, dim)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """HF's rotate-half RoPE on ``[N, heads, D]`` with per-token ``cos``/``sin`` ``[N, 1, D]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
