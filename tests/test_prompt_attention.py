"""Prompt chunks' attention off the CPU (``causal_prompt_attention``), checked on the CPU.

On a GPU a prompt chunk attends row by row under a lower-right causal mask, which torch runs
on its flash kernel; on the CPU torch materializes the same mask, so the numbers can be set
against the padded mask a ragged pass builds (``PassLayout.ragged``), which decode steps and
the CPU read.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from serve_app.runner.attention import causal_prompt_attention
from serve_app.runner.layout import PassLayout

HEADS, KV_HEADS, DIM = 4, 2, 16


def ragged(starts: list[int], lengths: list[int]) -> tuple[torch.Tensor, ...]:
    """Queries ``[rows, heads, span, D]`` padded with noise, and keys/values over the widest
    row's columns, noise past each row's end (a chunk must never read them)."""
    torch.manual_seed(0)
    rows, span = len(starts), max(lengths)
    width = max(s + n for s, n in zip(starts, lengths, strict=True))
    q = torch.randn(rows, HEADS, span, DIM)
    keys = torch.randn(rows, KV_HEADS, width, DIM)
    values = torch.randn(rows, KV_HEADS, width, DIM)
    return q, keys, values


def test_each_row_attends_as_the_padded_mask_says() -> None:
    """Rows that start at 0 (a fresh prompt), mid-prompt (after a prefix-cache hit or an
    earlier chunk) and of different lengths: each real query's output equals the padded
    mask's, padding queries give zeros."""
    starts, lengths = [0, 37, 5, 120], [9, 3, 17, 1]
    q, keys, values = ragged(starts, lengths)
    layout = PassLayout.ragged(0, [[1] * n for n in lengths], starts, False, torch.device("cpu"))
    masked = F.scaled_dot_product_attention(q, keys, values, attn_mask=layout.mask, enable_gqa=True)
    rows = list(zip(starts, lengths, strict=True))
    ours = causal_prompt_attention(q, keys, values, rows, torch.float32)
    assert ours.dtype == torch.float32 and ours.shape == q.shape
    for b, n in enumerate(lengths):
        torch.testing.assert_close(ours[b, :, :n], masked[b, :, :n], rtol=1e-5, atol=1e-5)
        assert not ours[b, :, n:].any()


def test_in_bf16_it_stays_within_bf16s_rounding_of_fp32() -> None:
    """The GPU's case: attention in the model's dtype, fp32 around it."""
    starts, lengths = [0, 64], [64, 32]
    q, keys, values = ragged(starts, lengths)
    rows = list(zip(starts, lengths, strict=True))
    exact = causal_prompt_attention(q, keys, values, rows, torch.float32)
    rounded = causal_prompt_attention(q, keys, values, rows, torch.bfloat16)
    assert rounded.dtype == torch.float32
    assert float((rounded - exact).abs().max()) < 0.05
