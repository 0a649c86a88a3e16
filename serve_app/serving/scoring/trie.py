"""Options as a token trie, and batch rows that run a prompt remainder plus its trie at once.

A question's options are token sequences (a choice's labels, each followed by the end-of-turn
token so that a label that is a prefix of another does not take its mass). Their likelihood is
a sum of next-token log-probabilities along each sequence. Sequences share prefixes (``l1``,
``l10``, ``l100`` all start with ``l``), so the distinct (position, next token) reads form a
trie: each trie node is one token that must run through the model, and each edge is one
probability read. 255 labels cost one extra token per distinct prefix, not one prompt copy per
label.

A ``Row`` (``engine.tree``) lays out one question's remainder (its tokens after the shared
state) followed by its trie's nodes, flattened. Every token attends to the shared cached
prefix and to its own ancestors: the remainder's tokens are a chain, each trie node hangs
under its parent node (or under the remainder's last token). Positions follow depth, so a
node sees exactly the context it would see in a plain forward pass of its own path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from serve_app.engine.tree import Row

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
