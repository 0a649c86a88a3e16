"""Prompt-lookup (n-gram) drafting for speculative decoding.

The draft for a request is what followed the most recent earlier occurrence of its last n
tokens (n from ``max_ngram`` down to ``min_ngram``) in its prompt + output that has k tokens
after it (else the earliest occurrence, whose continuation is the longest). The engine also
searches another ``source``: what followed the prompt's prefix-cache match, i.e. the
completion this account was just offered, so a user typing that suggestion gets the rest of
it checked in one forward instead of decoded token by token. An edit's answer
mostly copies the region it rewrites, a chat answer often quotes its context, so these drafts
are often right, and checking k of them costs one forward of k + 1 rows, about as much as one
step while decode is bound by reading the weights.

Exactness: the engine samples each verified position with the request's own sampler and
history, exactly as plain decoding would, and keeps a draft token only when the sampled token
equals it; the first mismatch ends the step with the sampled token. For greedy requests that
is plain decoding, token for token. For sampled requests it is the standard rejection rule for
a deterministic draft: the draft token ``t`` is accepted with probability ``p(t)``, and a
rejection yields a token drawn from ``p`` restricted to tokens other than ``t``, renormalised
(a draw from ``p`` conditioned on not being ``t``), so every emitted token has distribution
``p``. It even consumes the request's generator exactly as plain decoding does, so seeded
requests give the same text with and without speculation.
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
