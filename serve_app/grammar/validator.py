"""An incremental JSON prefix checker: a pushdown automaton over grammar nodes.

``JsonValidator`` keeps a stack of frames (``automaton``), one per open value, and feeds them
one byte at a time; ``open_frame`` picks the frame a node's value starts with. The nodes
(``nodes``) know nothing of frames, and the frames nothing of this driver (``Parser``), so
the three modules import one way only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from serve_app.grammar.automaton import (
    DONE,
    LBRACE,
    LBRACKET,
    MAX_WS_RUN,
    OK,
    QUOTE,
    REJECT,
    WS,
    ArrayFrame,
    Frame,
    LiteralFrame,
    NumberFrame,
    ObjectFrame,
    RootFrame,
    StringFrame,
)
from serve_app.grammar.nodes import (
    ANY_ARRAY,
    ANY_OBJECT,
    NUMBER_START,
    WORD_LITERALS,
    AnyNode,
    ArrayNode,
    LiteralNode,
    Node,
    NumberNode,
    ObjectNode,
    StringNode,
    UnionNode,
)


def open_frame(node: Node, b: int) -> Frame | None:
    """The frame that parses a value of ``node`` having read its first byte ``b``; None where
    ``node`` admits no value that starts so."""
    return _OPENERS[type(node)](node, b)


def _open_object(node: ObjectNode, b: int) -> Frame | None:
    return ObjectFrame(node) if b == LBRACE else None


def _open_array(node: ArrayNode, b: int) -> Frame | None:
    return ArrayFrame(node) if b == LBRACKET else None


def _open_string(node: StringNode, b: int) -> Frame | None:
    return StringFrame() if b == QUOTE else None


def _open_number(node: NumberNode, b: int) -> Frame | None:
    return NumberFrame.begin(node.integer, b)


def _open_literal(node: LiteralNode, b: int) -> Frame | None:
    alive = [c for c in node.candidates if c[0] == b]
    return LiteralFrame(alive, 1) if alive else None


def _open_union(node: UnionNode, b: int) -> Frame | None:
    # Among the options that take ``b``, commit to the one closest to done: it keeps
    # ``distance`` a true shortest completion (the budget logic relies on that).
    frames = [f for f in (open_frame(o, b) for o in node.options) if f is not None]
    return min(frames, key=lambda f: f.distance(None)) if frames else None


def _open_any(node: AnyNode, b: int) -> Frame | None:
    if b == LBRACE:
        return ObjectFrame(ANY_OBJECT)
    if b == LBRACKET:
        return ArrayFrame(ANY_ARRAY)
    if b == QUOTE:
        return StringFrame()
    if b in NUMBER_START:
        return NumberFrame.begin(False, b)
    literal = WORD_LITERALS.get(b)
    return _open_literal(literal, b) if literal is not None else None


# One lookup per value opened: each node class has its opener (grammar's classes are final).
_OPENERS: dict[type, Callable[[Any, int], Frame | None]] = {
    ObjectNode: _open_object,
    ArrayNode: _open_array,
    StringNode: _open_string,
    NumberNode: _open_number,
    LiteralNode: _open_literal,
    UnionNode: _open_union,
    AnyNode: _open_any,
}


class ByteChecker:
    """Bytes fed one at a time to ``_feed_byte``; ``feed`` returns False (and the checker is
    then dead) at the first byte that no accepted text could have there, so a caller tries
    candidates on a ``copy()``."""

    __slots__ = ("dead",)

    def feed(self, data: bytes | str) -> bool:
        """Feed bytes (or text, as UTF-8); False as soon as the prefix becomes invalid."""
        if isinstance(data, str):
            data = data.encode()
        if self.dead:
            return False
        for b in data:
            if not self._feed_byte(b):
                self.dead = True
                return False
        return True

    def _feed_byte(self, b: int) -> bool:
        raise NotImplementedError


class JsonValidator(ByteChecker):
    """Incremental check that bytes fed so far are a prefix of a document of ``node``."""

    __slots__ = ("stack", "ws_run")

    def __init__(self, node: Node = ANY_OBJECT) -> None:
        self.stack: list[Frame] = [RootFrame(node)]
        self.ws_run = 0
        self.dead = False

    def copy(self) -> JsonValidator:
        new = JsonValidator.__new__(JsonValidator)
        new.stack = [f.copy() for f in self.stack]
        new.ws_run, new.dead = self.ws_run, self.dead
        return new

    def open(self, node: Node, b: int) -> bool:
        """Push the frame of the value byte ``b`` starts, where ``node`` admits one (a frame's
        child: the document, a property value, an array item); False where it does not."""
        child = open_frame(node, b)
        if child is None:
            return False
        self.stack.append(child)
        return True

    def _feed_byte(self, b: int) -> bool:
        if b not in WS:
            self.ws_run = 0
        stack = self.stack
        while True:
            top = stack[-1]
            result = top.feed(b, self)
            if result == OK:
                return True
            if result == REJECT:
                return False
            stack.pop()  # DONE or REFEED (the root never ends, so the stack never empties)
            stack[-1].child_done(top)
            if result == DONE:
                return True

    def take_ws(self) -> int:
        """Structural whitespace: allowed, up to ``MAX_WS_RUN`` in a row."""
        self.ws_run += 1
        return OK if self.ws_run <= MAX_WS_RUN else REJECT

    @property
    def complete(self) -> bool:
        """One whole value has been read (only whitespace may follow)."""
        stack = self.stack
        if self.dead:
            return False
        if len(stack) == 1:
            return stack[0].started
        return len(stack) == 2 and stack[1].can_end()

    def distance(self) -> int:
        """Fewest bytes that complete the document (0 iff ``complete``)."""
        stack = self.stack
        last = len(stack) - 1
        return sum(f.distance(stack[i + 1] if i < last else None) for i, f in enumerate(stack))
