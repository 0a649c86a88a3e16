"""Prompt-lookup (n-gram) drafting for speculative decoding.

The draft is what followed the latest earlier occurrence of the request's last n tokens (n from
``max_ngram`` down to ``min_ngram``) in its prompt + output with k tokens after it (else the
earliest: the longest continuation), or in another ``source``: what followed the prompt's
prefix-cache match, the completion this account was just offered, so a user typing it gets the
rest checked in one forward, not decoded token by token. Edits mostly copy the region they
rewrite and chat answers quote their context, so drafts are often right, and checking k costs
one forward of k + 1 rows, about one step while decode is bound by reading the weights.

Exactness: each verified position is sampled with the request's own sampler and history, as
plain decoding would, keeping a draft token only when the sampled one equals it (the first
mismatch ends the step with the sampled token): for greedy requests plain decoding, for sampled
ones the standard rejection rule for a deterministic draft (``t`` kept with probability
``p(t)``, else a draw from ``p`` conditioned on not ``t``), so every token has distribution
``p``. It even consumes the generator as plain decoding does: seeded requests give the same text.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

DEFAULT_MAX_NGRAM = 3
DEFAULT_MIN_NGRAM = 2


def propose_draft(
    tokens: Sequence[int],
    k: int,
    source: Sequence[int] | None = None,
    *,
    max_ngram: int = DEFAULT_MAX_NGRAM,
    min_ngram: int = DEFAULT_MIN_NGRAM,
) -> list[int]:
    """Up to ``k`` tokens that followed a match of the last n-gram of ``tokens``: in
    ``source`` when given, else earlier in ``tokens`` itself."""
    length = len(tokens)
    if k < 1 or length < min_ngram + 1:
        return []
    ids = torch.tensor(tokens, dtype=torch.long)
    searched = ids if source is None else torch.tensor(source, dtype=torch.long)
    # In ``tokens`` itself, the tail must not match itself: windows end before the last token.
    end = length - 1 if source is None else len(searched)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        if end < n:
            continue
        windows = searched[:end].unfold(0, n, 1)
        hits = (windows == ids[length - n :]).all(dim=1).nonzero()
        hits = hits[hits[:, 0] + n < len(searched)]  # at least one token after the match
        if len(hits):
            # The latest match with k tokens after it; else the earliest (the longest draft).
            full = hits[hits[:, 0] + n + k <= len(searched)]
            start = int(full[-1] if len(full) else hits[0]) + n
            return [int(t) for t in searched[start : start + k]]
    return []
