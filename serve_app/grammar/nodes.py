"""Grammar nodes: what one JSON value may look like (compiled from a schema, shared, immutable).

``validator.open_frame`` opens the frame (``automaton``) that parses a value of a node. Nodes
are built once per schema and shared by every request using it, so they hold no parse state.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


class SchemaError(ValueError):
    """The schema admits no JSON value, or is not a JSON schema at all."""


class Node:
    """A grammar node: what one JSON value may look like. ``minlen``: bytes of its shortest."""

    minlen: int = 1


class AnyNode(Node):
    """Any JSON value; its shortest is ``0``."""

    minlen = 1


class StringNode(Node):
    minlen = 2


class NumberNode(Node):
    minlen = 1

    def __init__(self, integer: bool) -> None:
        self.integer = integer


class LiteralNode(Node):
    """One of a fixed set of byte strings: true/false/null, enum and const values."""

    def __init__(self, candidates: Iterable[bytes]) -> None:
        self.candidates = tuple(dict.fromkeys(candidates))
        if not self.candidates:
            raise SchemaError("an enum with no (type-matching) values admits nothing")
        self.minlen = min(len(c) for c in self.candidates)


class UnionNode(Node):
    """Any of several nodes; the first byte picks one (``anyOf``, type lists)."""

    def __init__(self, options: Sequence[Node]) -> None:
        if not options:
            raise SchemaError("an empty anyOf/type list admits nothing")
        # Nested unions are flattened and shared nodes (a ``$ref`` used twice) kept once, so
        # a value opens each distinct option once however the anyOf were nested.
        flat = [x for o in options for x in (o.options if isinstance(o, UnionNode) else (o,))]
        self.options = tuple({id(o): o for o in flat}.values())
        self.minlen = min(o.minlen for o in self.options)


class ArrayNode(Node):
    def __init__(self, items: Node, min_items: int = 0, max_items: int | None = None) -> None:
        if min_items < 0 or (max_items is not None and max_items < min_items):
            raise SchemaError(f"no array has between {min_items} and {max_items} items")
        self.items, self.min_items, self.max_items = items, min_items, max_items
        self.minlen = 2 if min_items == 0 else 1 + min_items * (items.minlen + 1)


class ObjectNode(Node):
    """An object with fixed ``properties`` (only those keys), or free keys when there are none.

    ``additional`` is the value node of free keys (None: no keys at all); it is only used when
    ``properties`` is empty.
    """

    def __init__(
        self,
        properties: Mapping[str, Node],
        required: Iterable[str] = (),
        additional: Node | None = None,
    ) -> None:
        self.properties = dict(properties)
        self.required = frozenset(required)
        if not self.required <= self.properties.keys():
            raise SchemaError(f"required keys without a property: {self.required}")
        self.free = not self.properties and additional is not None
        self.additional = additional
        self.key_of = {dumps_value(k): k for k in self.properties}
        self.literal_of = {k: lit for lit, k in self.key_of.items()}
        # Bytes for `"key":<shortest value>` (without the separating comma).
        self.cost = {k: len(self.literal_of[k]) + 1 + n.minlen for k, n in self.properties.items()}
        self.literal_cost = {lit: self.cost[k] for lit, k in self.key_of.items()}
        self.required_literals = frozenset(self.literal_of[k] for k in self.required)
        self.by_cost = sorted((c, k) for k, c in self.cost.items())
        # Bytes for every required pair, a comma after each but the last, and the `}`.
        self.owed = sum(self.cost[k] + 1 for k in self.required)
        self.minlen = 1 + (self.owed or 1)


def dumps_value(value: Any) -> bytes:
    """The canonical bytes the constraint produces for a fixed value (enum, const, key)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


ANY = AnyNode()
ANY_OBJECT = ObjectNode({}, (), ANY)
ANY_ARRAY = ArrayNode(ANY)
NUMBER_START = frozenset(b"-0123456789")
WORD_LITERALS = {
    ord("t"): LiteralNode([b"true"]),
    ord("f"): LiteralNode([b"false"]),
    ord("n"): LiteralNode([b"null"]),
}
