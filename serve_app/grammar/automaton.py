"""The frames of the incremental JSON prefix checker: one per open value (object, array,
string, number, literal), each fed one byte at a time by the validator (``validator``), which
keeps them on a stack. ``copy()`` is cheap, so candidate tokens are tried on copies;
``distance()`` is the fewest bytes that still close a frame, which drives the token budget.
"""

from __future__ import annotations

from typing import Protocol

from serve_app.grammar.nodes import ArrayNode, Node, ObjectNode

# Longest run of structural whitespace allowed before the value: models love endless "\n".
MAX_WS_RUN = 64

WS = frozenset(b" \t\n\r")
DIGITS = frozenset(b"0123456789")
HEX = frozenset(b"0123456789abcdefABCDEF")
ESCAPES = frozenset(b'"\\/bfnrt')
QUOTE, BACKSLASH, COLON, COMMA = ord('"'), ord("\\"), ord(":"), ord(",")
LBRACE, RBRACE, LBRACKET, RBRACKET = ord("{"), ord("}"), ord("["), ord("]")

REJECT, OK, DONE, REFEED = 0, 1, 2, 3  # DONE: byte taken, frame ends; REFEED: ends, byte not

# RFC 3629's table: after these lead bytes the first continuation byte has a narrower range
# (else an overlong form, a surrogate, or a code point past U+10FFFF); after the others it is
# 0x80..0xBF, as every later continuation byte is.
FIRST_CONTINUATION = {
    0xE0: (0xA0, 0xBF),
    0xED: (0x80, 0x9F),
    0xF0: (0x90, 0xBF),
    0xF4: (0x80, 0x8F),
}


class Parser(Protocol):
    """What a frame asks of the validator driving it (``validator.JsonValidator``): its stack,
    to open a child value, and to take structural whitespace."""

    stack: list[Frame]

    def open(self, node: Node, b: int) -> bool: ...

    def take_ws(self) -> int: ...


class Frame:
    """One open value on the validator's stack; ``feed`` one byte, ``copy`` for trying tokens."""

    __slots__ = ()

    def feed(self, b: int, v: Parser) -> int:
        raise NotImplementedError

    def copy(self) -> Frame:
        raise NotImplementedError

    def child_done(self, child: Frame) -> None:
        """A value this frame pushed has ended."""

    def can_end(self) -> bool:
        """Whether the value is complete if the input stops here (numbers, ``1`` in an enum)."""
        return False

    def distance(self, child: Frame | None) -> int:
        """Fewest bytes to close this frame (its part only), given the frame above it."""
        raise NotImplementedError


class RootFrame(Frame):
    """Whitespace, one value, whitespace: the whole document."""

    __slots__ = ("node", "started")

    def __init__(self, node: Node, started: bool = False) -> None:
        self.node, self.started = node, started

    def copy(self) -> RootFrame:
        return RootFrame(self.node, self.started)

    def feed(self, b: int, v: Parser) -> int:
        if b in WS:
            return OK if self.started else v.take_ws()
        if self.started:
            return REJECT
        if not v.open(self.node, b):
            return REJECT
        self.started = True
        return OK

    def distance(self, child: Frame | None) -> int:
        return 0 if self.started else self.node.minlen


# Object frame states.
_O_OPEN, _O_NEXT, _O_KEY, _O_COLON, _O_VALUE, _O_AFTER = range(6)


class ObjectFrame(Frame):
    """``owed``: bytes still needed for the required keys not yet written (``,pair`` each,
    the last one's comma standing for the ``}``), kept up to date as keys arrive, so the
    distance costs the same however many properties the schema lists."""

    __slots__ = ("node", "state", "seen", "cur", "owed")

    def __init__(
        self,
        node: ObjectNode,
        state: int = _O_OPEN,
        seen: frozenset[str] = frozenset(),
        cur: Node | None = None,
        owed: int | None = None,
    ) -> None:
        self.node, self.state, self.seen, self.cur = node, state, seen, cur
        self.owed = node.owed if owed is None else owed

    def copy(self) -> ObjectFrame:
        return ObjectFrame(self.node, self.state, self.seen, self.cur, self.owed)

    def feed(self, b: int, v: Parser) -> int:
        state = self.state
        if b in WS:
            return v.take_ws()
        if state == _O_VALUE:
            if not v.open(self.cur, b):
                return REJECT
            self.state = _O_AFTER
            return OK
        if state == _O_AFTER:
            if b == COMMA and (self.node.free or len(self.seen) < len(self.node.properties)):
                self.state = _O_NEXT
                return OK
            return DONE if b == RBRACE and not self.owed else REJECT
        if state == _O_COLON:
            if b == COLON:
                self.state = _O_VALUE
                return OK
            return REJECT
        if b == QUOTE:  # _O_OPEN or _O_NEXT
            return self._start_key(v)
        if b == RBRACE and state == _O_OPEN and not self.owed:
            return DONE
        return REJECT

    def _start_key(self, v: Parser) -> int:
        node = self.node
        if node.free:
            child: Frame = StringFrame(key=True)
        else:
            seen = self.seen
            alive = [lit for lit, k in node.key_of.items() if k not in seen]
            if not alive:
                return REJECT
            child = LiteralFrame(alive, 1, key=True)
        self.state = _O_KEY
        v.stack.append(child)
        return OK

    def child_done(self, child: Frame) -> None:
        if self.state != _O_KEY:
            return
        node = self.node
        if node.free:
            self.cur = node.additional
        else:
            key = node.key_of[child.matched()]
            self.seen = self.seen | {key}
            self.cur = node.properties[key]
            if key in node.required:
                self.owed -= node.cost[key] + 1
        self.state = _O_COLON

    def distance(self, child: Frame | None) -> int:
        node, state, owed = self.node, self.state, self.owed
        if state == _O_OPEN:
            return owed or 1
        if state == _O_AFTER:
            return owed + 1
        if state == _O_VALUE:
            return self.cur.minlen + owed + 1
        if state == _O_COLON:
            return 1 + self.cur.minlen + owed + 1
        if state == _O_NEXT:
            if owed:
                return owed
            if node.free:
                return 3 + node.additional.minlen + 1
            return 1 + next(c for c, k in node.by_cost if k not in self.seen)
        return self._key_distance(child)

    def _key_distance(self, child: Frame | None) -> int:
        """Key being written: the best key it can still become decides the rest. A required
        key leaves ``owed - pos`` bytes (its own pair is part of ``owed``); any other adds its
        pair and a comma to ``owed``."""
        node = self.node
        if node.free:
            return child.own_distance() + 1 + node.additional.minlen + 1
        required = node.required_literals
        if any(lit in required for lit in child.alive):
            return self.owed - child.pos
        return min(node.literal_cost[lit] for lit in child.alive) - child.pos + self.owed + 1


# Array frame states.
_A_OPEN, _A_NEXT, _A_AFTER = range(3)


class ArrayFrame(Frame):
    __slots__ = ("node", "state", "count")

    def __init__(self, node: ArrayNode, state: int = _A_OPEN, count: int = 0) -> None:
        self.node, self.state, self.count = node, state, count

    def copy(self) -> ArrayFrame:
        return ArrayFrame(self.node, self.state, self.count)

    def feed(self, b: int, v: Parser) -> int:
        if b in WS:
            return v.take_ws()
        node, state = self.node, self.state
        if state == _A_AFTER:
            if b == COMMA and (node.max_items is None or self.count < node.max_items):
                self.state = _A_NEXT
                return OK
            return DONE if b == RBRACKET and self.count >= node.min_items else REJECT
        if state == _A_OPEN and b == RBRACKET:
            return DONE if node.min_items == 0 else REJECT
        if node.max_items == 0:
            return REJECT
        if not v.open(node.items, b):
            return REJECT
        self.count += 1
        self.state = _A_AFTER
        return OK

    def distance(self, child: Frame | None) -> int:
        node, state = self.node, self.state
        per_item = node.items.minlen + 1
        if state == _A_OPEN:
            return 1 if node.min_items == 0 else node.min_items * per_item
        if state == _A_AFTER:
            return max(0, node.min_items - self.count) * per_item + 1
        return max(1, node.min_items - self.count) * per_item


class StringFrame(Frame):
    """A free string: escapes checked, UTF-8 kept well-formed (no overlongs, no surrogates)."""

    __slots__ = ("key", "esc", "hex_left", "utf_left", "lo", "hi")

    def __init__(self, key: bool = False) -> None:
        self.key = key
        self.esc = False
        self.hex_left = self.utf_left = 0
        self.lo, self.hi = 0x80, 0xBF

    def copy(self) -> StringFrame:
        new = StringFrame.__new__(StringFrame)
        new.key, new.esc, new.hex_left = self.key, self.esc, self.hex_left
        new.utf_left, new.lo, new.hi = self.utf_left, self.lo, self.hi
        return new

    def feed(self, b: int, v: Parser) -> int:
        if self.utf_left:
            if not self.lo <= b <= self.hi:
                return REJECT
            self.utf_left -= 1
            self.lo, self.hi = 0x80, 0xBF
            return OK
        if self.hex_left:
            if b not in HEX:
                return REJECT
            self.hex_left -= 1
            return OK
        if self.esc:
            self.esc = False
            if b == ord("u"):
                self.hex_left = 4
                return OK
            return OK if b in ESCAPES else REJECT
        if b == QUOTE:
            return DONE
        if b == BACKSLASH:
            self.esc = True
            return OK
        if b < 0x80:
            return OK if b >= 0x20 else REJECT
        return self._lead(b)

    def _lead(self, b: int) -> int:
        """A UTF-8 lead byte: how many continuation bytes follow, and the first one's range."""
        if 0xC2 <= b <= 0xDF:
            self.utf_left = 1
        elif 0xE0 <= b <= 0xEF:
            self.utf_left = 2
        elif 0xF0 <= b <= 0xF4:
            self.utf_left = 3
        else:
            return REJECT
        self.lo, self.hi = FIRST_CONTINUATION.get(b, (0x80, 0xBF))
        return OK

    def own_distance(self) -> int:
        if self.utf_left:
            return self.utf_left + 1
        if self.hex_left:
            return self.hex_left + 1
        return 2 if self.esc else 1

    def distance(self, child: Frame | None) -> int:
        return 0 if self.key else self.own_distance()  # a key's parent counts it


def _number_table(integer: bool) -> list[dict[int, int]]:
    """Transitions of JSON's number grammar; ``integer`` drops fraction and exponent."""
    digits, nonzero = b"0123456789", b"123456789"
    start = {ord("-"): 1, ord("0"): 2, **dict.fromkeys(nonzero, 3)}
    table: list[dict[int, int]] = [
        start,  # 0 start
        {ord("0"): 2, **dict.fromkeys(nonzero, 3)},  # 1 after '-'
        {},  # 2 after a leading 0
        dict.fromkeys(digits, 3),  # 3 integer digits
        dict.fromkeys(digits, 5),  # 4 after '.'
        dict.fromkeys(digits, 5),  # 5 fraction digits
        {ord("+"): 7, ord("-"): 7, **dict.fromkeys(digits, 8)},  # 6 after 'e'
        dict.fromkeys(digits, 8),  # 7 after the exponent's sign
        dict.fromkeys(digits, 8),  # 8 exponent digits
    ]
    if not integer:
        for state in (2, 3):
            table[state].update({ord("."): 4, ord("e"): 6, ord("E"): 6})
        table[5].update({ord("e"): 6, ord("E"): 6})
    return table


_NUMBER_TABLES = {False: _number_table(False), True: _number_table(True)}
_NUMBER_ACCEPTING = frozenset({2, 3, 5, 8})


class NumberFrame(Frame):
    """A number ends at the first byte that cannot continue it; that byte goes to the parent."""

    __slots__ = ("table", "state")

    def __init__(self, table: list[dict[int, int]], state: int) -> None:
        self.table, self.state = table, state

    @classmethod
    def begin(cls, integer: bool, b: int) -> NumberFrame | None:
        table = _NUMBER_TABLES[integer]
        state = table[0].get(b)
        return cls(table, state) if state is not None else None

    def copy(self) -> NumberFrame:
        return NumberFrame(self.table, self.state)

    def feed(self, b: int, v: Parser) -> int:
        nxt = self.table[self.state].get(b)
        if nxt is not None:
            self.state = nxt
            return OK
        return REFEED if self.state in _NUMBER_ACCEPTING else REJECT

    def can_end(self) -> bool:
        return self.state in _NUMBER_ACCEPTING

    def distance(self, child: Frame | None) -> int:
        return 0 if self.state in _NUMBER_ACCEPTING else 1


class LiteralFrame(Frame):
    """Matches one of several byte strings; ``alive`` are those still matching ``pos`` bytes.

    A full match that no candidate extends ends the frame at once, unless it ends in a digit
    (``1`` in ``enum: [1, 12]``, or alone): like a number, it ends at the next byte.
    """

    __slots__ = ("alive", "pos", "key")

    def __init__(self, alive: list[bytes], pos: int, key: bool = False) -> None:
        self.alive, self.pos, self.key = alive, pos, key

    def copy(self) -> LiteralFrame:
        return LiteralFrame(self.alive, self.pos, self.key)

    def feed(self, b: int, v: Parser) -> int:
        pos = self.pos
        alive = [c for c in self.alive if len(c) > pos and c[pos] == b]
        if not alive:
            return REFEED if self.can_end() else REJECT
        self.alive, self.pos = alive, pos + 1
        if len(alive) == 1 and len(alive[0]) == pos + 1 and alive[0][-1] not in DIGITS:
            return DONE
        return OK

    def matched(self) -> bytes:
        return next(c for c in self.alive if len(c) == self.pos)

    def can_end(self) -> bool:
        return any(len(c) == self.pos for c in self.alive)

    def own_distance(self) -> int:
        return min(len(c) for c in self.alive) - self.pos

    def distance(self, child: Frame | None) -> int:
        return 0 if self.key else self.own_distance()
