"""Tree rows: tokens run on top of a cached prefix, each attending to its own ancestors only.

A scoring request (``protocol.ScoringRequest``) reads next-token probabilities at chosen
positions of such rows, run in one forward on top of the request's prefix KV; the mask
(``tree_mask``) lets sibling branches share a position without seeing each other. Decision
questions' option tries become rows in ``scoring.trie.make_row``: the engine knows no questions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Positions the LM head runs on at once: bounds the [N, vocabulary] logits in memory.
READ_CHUNK = 256


@dataclass
class Row:
    """One row: a chain of tokens, then tree nodes, each with its parent in the row."""

    tokens: list[int]
    parents: list[int]  # index in the row, -1 = attends to the cached prefix only
    depths: list[int]  # position after the prefix
    reads: list[tuple[int, int]]  # (index in the row, target token)

    def __len__(self) -> int:
        return len(self.tokens)


def tree_mask(rows: list[Row], offset: int, width: int) -> Any:
    """[batch, 1, width, offset + width] bool mask: True where a token may attend. Padding
    attends to the prefix only, so no attention row is empty (and it is never read)."""
    import torch

    mask = torch.zeros((len(rows), 1, width, offset + width), dtype=torch.bool)
    mask[:, :, :, :offset] = True
    for b, row in enumerate(rows):
        own = mask[b, 0, :, offset:]
        chain = _chain_length(row)
        own[:chain, :chain] = torch.ones(chain, chain, dtype=torch.bool).tril()
        for i in range(chain, len(row)):
            if row.parents[i] >= 0:
                own[i] = own[row.parents[i]]
            own[i, i] = True
    return mask


def pack(rows: list[Row]) -> Row:
    """Several rows as one, none seeing another's tokens: on a batch-1 prefix it needs no
    padding and no copy of the prefix KV per question (a batch of B rows expands it B times)."""
    tokens: list[int] = []
    parents: list[int] = []
    depths: list[int] = []
    reads: list[tuple[int, int]] = []
    for row in rows:
        offset = len(tokens)
        tokens += row.tokens
        parents += [p + offset if p >= 0 else -1 for p in row.parents]
        depths += row.depths
        reads += [(i + offset, target) for i, target in row.reads]
    return Row(tokens, parents, depths, reads)


def _chain_length(row: Row) -> int:
    """How many leading tokens form a plain causal chain (the remainder)."""
    n = 0
    while n < len(row) and row.parents[n] == n - 1:
        n += 1
    return n


def read_log_probs(
    hidden: Any, reads: list[tuple[int, int]], head: Callable[[Any], Any]
) -> list[float]:
    """log P(target | position) for ``reads`` (row index, target token) of final-normed
    ``hidden [N, H]``, in float64; the LM head runs once per distinct position read."""
    import torch

    where: dict[int, int] = {}
    picks = [where.setdefault(index, len(where)) for index, _ in reads]
    states = hidden[list(where)]
    pick = torch.tensor(picks, dtype=torch.long)
    target = torch.tensor([t for _, t in reads], dtype=torch.long)
    values = torch.empty(len(picks), dtype=torch.float64)
    for start in range(0, states.shape[0], READ_CHUNK):
        logits = head(states[start : start + READ_CHUNK]).float().cpu()
        lse = logits.logsumexp(dim=-1)
        mine = ((pick >= start) & (pick < start + READ_CHUNK)).nonzero().squeeze(1)
        local = pick[mine] - start
        values[mine] = (logits[local, target[mine]] - lse[local]).double()
    return values.tolist()
