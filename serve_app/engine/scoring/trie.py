"""Options as a token trie, and batch rows that run a prompt remainder plus its trie at once.

A question's options are token sequences (a choice's labels, each followed by the end-of-turn
token so that a label that is a prefix of another does not take its mass). Their likelihood is
a sum of next-token log-probabilities along each sequence. Sequences share prefixes (``l1``,
``l10``, ``l100`` all start with ``l``), so the distinct (position, next token) reads form a
trie: each trie node is one token that must run through the model, and each edge is one
probability read. 255 labels cost one extra token per distinct prefix, not one prompt copy per
label.

A ``Row`` lays out one question's remainder (its tokens after the shared state) followed by
its trie's nodes, flattened. Every token attends to the shared cached prefix and to its own
ancestors: the remainder's tokens are a chain, each trie node hangs under its parent node (or
under the remainder's last token). Positions follow depth, so a node sees exactly the context
it would see in a plain forward pass of its own path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Answers = list[list[list[int]]]  # per option, alternative token sequences


@dataclass
class OptionTrie:
    """The distinct prefixes of a question's option sequences.

    ``tokens[k]``/``parents[k]``: trie node ``k`` (parents first; ``-1`` = the prompt's last
    token, the root). ``reads``: the distinct (node, next token) probabilities to read, node
    ``-1`` being the root. ``paths[o][a]``: read indices summed for option ``o``, alternative
    ``a``.
    """

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    reads: list[tuple[int, int]] = field(default_factory=list)
    paths: list[list[list[int]]] = field(default_factory=list)


def build_trie(answers: Answers, end_id: int | None) -> OptionTrie:
    """The trie over every alternative (plus ``end_id`` when given) of every option."""
    trie = OptionTrie()
    nodes: dict[tuple[int, int], int] = {}  # (parent node, token) -> node index
    reads: dict[tuple[int, int], int] = {}  # (node, next token) -> read index
    for alternatives in answers:
        option_paths = []
        for seq in alternatives:
            tokens = [*seq, end_id] if end_id is not None else list(seq)
            node, path = -1, []
            for position, token in enumerate(tokens):
                path.append(reads.setdefault((node, token), len(reads)))
                if position + 1 < len(tokens):  # the last token is only read, never run
                    if (node, token) not in nodes:
                        nodes[(node, token)] = len(trie.tokens)
                        trie.tokens.append(token)
                        trie.parents.append(node)
                    node = nodes[(node, token)]
            option_paths.append(path)
        trie.paths.append(option_paths)
    trie.reads = list(reads)
    return trie


@dataclass
class Row:
    """One batch row: a remainder chain, then trie nodes, each with its parent in the row."""

    tokens: list[int]
    parents: list[int]  # index in the row, -1 = attends to the cached prefix only
    depths: list[int]  # position after the prefix
    reads: list[tuple[int, int]]  # (index in the row, target token)

    def __len__(self) -> int:
        return len(self.tokens)


def make_row(remainder: list[int], trie: OptionTrie) -> Row:
    """The remainder followed by the trie, reads placed at their row positions."""
    n = len(remainder)
    parents = list(range(-1, n - 1))
    depths = list(range(n))
    for parent in trie.parents:
        at = n - 1 if parent < 0 else n + parent
        parents.append(at)
        depths.append(depths[at] + 1)
    reads = [(n - 1 if node < 0 else n + node, target) for node, target in trie.reads]
    return Row([*remainder, *trie.tokens], parents, depths, reads)


def tree_mask(rows: list[Row], offset: int, width: int) -> Any:
    """[batch, 1, width, offset + width] bool mask: True where a token may attend.

    Padding attends to the prefix only, so no attention row is empty (and it is never read).
    """
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
    """Several rows as one: each keeps its own ancestors, none sees another's tokens.

    One packed row on top of a batch-1 prefix needs no copy of the prefix KV per question
    (a batch of B rows expands it B times) and no padding.
    """
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
