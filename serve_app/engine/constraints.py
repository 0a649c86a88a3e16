"""Constrained decoding for ``response_format``: JSON that always parses, and fits its schema.

Three layers, each usable on its own:

- ``TokenTexts``: the exact bytes of every token id of a tokenizer, built once per tokenizer.
  Byte-level BPE tokens are often *partial* UTF-8 characters, so everything below works on
  bytes, never on decoded text.
- ``JsonValidator``: an incremental JSON prefix checker, a small pushdown automaton (a stack
  of frames: object, array, string, number, literal) driven by a *grammar* node tree. Plain
  JSON is the grammar ``ANY_OBJECT``; a JSON schema is compiled (``compile_schema``) into a
  grammar that only admits the schema's keys and value types. ``copy()`` is cheap, so
  candidate tokens are tried on copies. ``distance()`` is the fewest bytes that still complete
  the document, which drives the token budget (below).
- ``JsonConstraint``: a ``LogitsProcessor`` that masks every token that would break the
  prefix. It advances its validator with the tokens actually chosen (``history.output_ids``),
  so it needs nothing from the sampler but a place in the processor list.

Schema subset enforced while decoding: ``type`` (one or a list) object / array / string /
number / integer / boolean / null; ``properties``, ``required``, ``additionalProperties``;
``items``, ``minItems``, ``maxItems``; ``enum``, ``const``; ``anyOf``; local ``$ref`` (not
recursive); ``allOf`` of one schema. Objects that list ``properties`` only ever get those keys
(structured-outputs semantics: ``additionalProperties: false`` is implied), each at most once,
and ``}`` only comes after every ``required`` key. Keywords that only narrow values
(``minimum``, ``maxLength``, ``pattern``, ``format``...) are not enforced, and any other
structural keyword (``oneOf``, ``not``, ``patternProperties``, recursive ``$ref``...) makes its
subtree fall back to "any JSON of the declared type" (or any JSON). Either way
``Grammar.fully_enforced`` is False, ``Grammar.notes`` says why, and callers should
post-validate the output with ``validate_output`` (``jsonschema``).

Budget: with ``max_tokens`` set, a candidate token is kept only if the document can still be
closed in the tokens left (one kept for EOS): ``distance_after <= max(remaining - 2,
distance_now - 1)``. Far from the limit this allows everything valid; near it, only tokens
that make progress (closing quotes and brackets, minimal values) remain. Byte-level vocabs have
a token for every single byte, and ``distance`` follows a concrete shortest completion, so a
progress token always exists. If ``max_tokens`` is below the schema's smallest document, the
output is cut short ("length") and cannot parse.

Not covered: ``stop`` strings can still cut the JSON; sampling only sees the top-K candidate
tokens that are valid (the full vocabulary is scanned when none of them is), which is exact for
greedy decoding and a truncation of the tail otherwise.
"""

from __future__ import annotations

import json
import logging
import threading
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from serve_app.engine.sampling import LogitsProcessor, Temperature, TopK, TopP

logger = logging.getLogger(__name__)

DEFAULT_TOP_K = 64
# Candidates tried per chunk when none of the top-K is valid and the vocabulary is scanned.
SCAN_CHUNK = 256
# Most candidates tried by one scan before settling for the valid single-byte tokens; fewer
# when the budget forces progress (closing a long string: valid tokens need a '"', and
# trying thousands of words to find one costs ~25 ms while a single '"' always works).
MAX_SCAN = 4096
MAX_SCAN_CLOSING = 256
# Longest run of structural whitespace allowed before the value: models love endless "\n".
MAX_WS_RUN = 64

_WS = frozenset(b" \t\n\r")
_DIGITS = frozenset(b"0123456789")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_ESCAPES = frozenset(b'"\\/bfnrt')
_QUOTE, _BACKSLASH, _COLON, _COMMA = ord('"'), ord("\\"), ord(":"), ord(",")
_LBRACE, _RBRACE, _LBRACKET, _RBRACKET = ord("{"), ord("}"), ord("["), ord("]")

# ================================================================================ token texts


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table, which byte-level BPE vocabularies are spelt in."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


class TokenTexts:
    """The bytes of every token id of one tokenizer; special tokens have ``b""`` and are listed.

    Built from the vocabulary's spelling (``convert_ids_to_tokens`` mapped through the inverse
    of ``bytes_to_unicode``), not from ``decode``: decoding one token that is half a UTF-8
    character gives U+FFFD, which would make the validator judge the wrong bytes.
    Use ``for_tokenizer`` to share one instance per tokenizer.
    """

    _cache: dict[int, tuple[weakref.ref, TokenTexts]] = {}
    _lock = threading.Lock()

    def __init__(self, token_bytes: Sequence[bytes], special_ids: Iterable[int]) -> None:
        self.special_ids = frozenset(special_ids)
        self.token_bytes = [
            b"" if i in self.special_ids else bytes(b) for i, b in enumerate(token_bytes)
        ]
        self.whitespace_ids = [i for i, b in enumerate(self.token_bytes) if b and set(b) <= _WS]
        self.byte_token_ids: dict[int, int] = {}  # byte -> the token that is just that byte
        for i, b in enumerate(self.token_bytes):
            if len(b) == 1:
                self.byte_token_ids.setdefault(b[0], i)
        self._first_bytes = torch.tensor([b[0] if b else 256 for b in self.token_bytes])
        self._first_bytes_sized: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self.token_bytes)

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> TokenTexts:
        """The cached instance for ``tokenizer`` (built on first use: ~0.3 s for 151k tokens)."""
        with cls._lock:
            hit = cls._cache.get(id(tokenizer))
            if hit is not None and hit[0]() is tokenizer:
                return hit[1]
            texts = cls.from_tokenizer(tokenizer)
            key = id(tokenizer)
            ref = weakref.ref(tokenizer, lambda _: cls._cache.pop(key, None))
            cls._cache[key] = (ref, texts)
            return texts

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> TokenTexts:
        """Spell out every id below ``len(tokenizer)`` (added tokens included)."""
        n = len(tokenizer)
        added = dict(getattr(tokenizer, "added_tokens_decoder", {}) or {})
        special = {i for i, tok in added.items() if getattr(tok, "special", False)}
        special |= {i for i in getattr(tokenizer, "all_special_ids", []) if i is not None}
        pieces = tokenizer.convert_ids_to_tokens(list(range(n)))
        base = [p or "" for i, p in enumerate(pieces) if i not in added]
        byte_decoder = {c: b for b, c in bytes_to_unicode().items()}
        if set("".join(base)) <= byte_decoder.keys():
            table = str.maketrans({c: chr(b) for c, b in byte_decoder.items()})
            token_bytes = [(p or "").translate(table).encode("latin-1") for p in pieces]
        else:  # not byte-level: best effort, partial characters become U+FFFD
            logger.warning("tokenizer is not byte-level BPE; token bytes come from decode()")
            token_bytes = [tokenizer.decode([i]).encode() for i in range(n)]
        for i, tok in added.items():  # added tokens are spelt as plain text, not byte-level
            if i < n:
                token_bytes[i] = str(getattr(tok, "content", tok)).encode()
        return cls(token_bytes, special)

    def first_bytes(self, size: int) -> torch.Tensor:
        """First byte of each id (256 for none) for a logits row of ``size`` (padded/cut)."""
        cached = self._first_bytes_sized.get(size)
        if cached is None:
            fb = self._first_bytes[:size]
            if size > len(fb):
                fb = torch.cat([fb, torch.full((size - len(fb),), 256, dtype=fb.dtype)])
            cached = self._first_bytes_sized[size] = fb
        return cached


# ================================================================================ grammar nodes


class SchemaError(ValueError):
    """The schema admits no JSON value, or is not a JSON schema at all."""


class Node:
    """A grammar node: what one JSON value may look like. ``minlen``: bytes of its shortest."""

    minlen: int = 1

    def start(self, b: int) -> Frame | None:
        """The frame that parses this value, having read its first byte ``b`` (None: invalid)."""
        raise NotImplementedError


class AnyNode(Node):
    """Any JSON value; its shortest is ``0``."""

    minlen = 1

    def start(self, b: int) -> Frame | None:
        if b == _LBRACE:
            return ObjectFrame(ANY_OBJECT)
        if b == _LBRACKET:
            return ArrayFrame(ANY_ARRAY)
        if b == _QUOTE:
            return StringFrame()
        if b in _NUMBER_START:
            return NumberFrame.begin(False, b)
        literal = _WORD_LITERALS.get(b)
        return literal.start(b) if literal is not None else None


class StringNode(Node):
    minlen = 2

    def start(self, b: int) -> Frame | None:
        return StringFrame() if b == _QUOTE else None


class NumberNode(Node):
    minlen = 1

    def __init__(self, integer: bool) -> None:
        self.integer = integer

    def start(self, b: int) -> Frame | None:
        return NumberFrame.begin(self.integer, b)


class LiteralNode(Node):
    """One of a fixed set of byte strings: true/false/null, enum and const values."""

    def __init__(self, candidates: Iterable[bytes]) -> None:
        self.candidates = tuple(dict.fromkeys(candidates))
        if not self.candidates:
            raise SchemaError("an enum with no (type-matching) values admits nothing")
        self.minlen = min(len(c) for c in self.candidates)

    def start(self, b: int) -> Frame | None:
        alive = [c for c in self.candidates if c[0] == b]
        return LiteralFrame(alive, 1) if alive else None


class UnionNode(Node):
    """Any of several nodes; the first byte picks one (``anyOf``, type lists)."""

    def __init__(self, options: Sequence[Node]) -> None:
        if not options:
            raise SchemaError("an empty anyOf/type list admits nothing")
        self.options = tuple(options)
        self.minlen = min(o.minlen for o in self.options)

    def start(self, b: int) -> Frame | None:
        # Among the options that take ``b``, commit to the one closest to done: it keeps
        # ``distance`` a true shortest completion (the budget logic relies on that).
        frames = [f for f in (o.start(b) for o in self.options) if f is not None]
        return min(frames, key=lambda f: f.distance(None)) if frames else None


class ArrayNode(Node):
    def __init__(self, items: Node, min_items: int = 0, max_items: int | None = None) -> None:
        if min_items < 0 or (max_items is not None and max_items < min_items):
            raise SchemaError(f"no array has between {min_items} and {max_items} items")
        self.items, self.min_items, self.max_items = items, min_items, max_items
        self.minlen = 2 if min_items == 0 else 1 + min_items * (items.minlen + 1)

    def start(self, b: int) -> Frame | None:
        return ArrayFrame(self) if b == _LBRACKET else None


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
        self.key_of = {_dumps(k): k for k in self.properties}
        self.literal_of = {k: lit for lit, k in self.key_of.items()}
        # Bytes for `"key":<shortest value>` (without the separating comma).
        self.cost = {k: len(self.literal_of[k]) + 1 + n.minlen for k, n in self.properties.items()}
        self.minlen = 1 + self.rest_open(self.required)

    def rest_open(self, required: frozenset[str]) -> int:
        """Bytes to write the ``required`` pairs and ``}`` right after ``{`` (no comma first)."""
        return 1 if not required else sum(self.cost[k] for k in required) + len(required)

    def rest_after(self, required: frozenset[str]) -> int:
        """Bytes to write ``,pair`` for each of ``required`` and then ``}``."""
        return sum(self.cost[k] for k in required) + len(required) + 1

    def start(self, b: int) -> Frame | None:
        return ObjectFrame(self) if b == _LBRACE else None


def _dumps(value: Any) -> bytes:
    """The canonical bytes the constraint produces for a fixed value (enum, const, key)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


ANY = AnyNode()
ANY_OBJECT = ObjectNode({}, (), ANY)
ANY_ARRAY = ArrayNode(ANY)
_NUMBER_START = frozenset(b"-0123456789")
_WORD_LITERALS = {
    ord("t"): LiteralNode([b"true"]),
    ord("f"): LiteralNode([b"false"]),
    ord("n"): LiteralNode([b"null"]),
}


# ================================================================================ frames

REJECT, OK, DONE, REFEED = 0, 1, 2, 3  # DONE: byte taken, frame ends; REFEED: ends, byte not


class Frame:
    """One open value on the validator's stack; ``feed`` one byte, ``copy`` for trying tokens."""

    __slots__ = ()

    def feed(self, b: int, v: JsonValidator) -> int:
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

    def feed(self, b: int, v: JsonValidator) -> int:
        if b in _WS:
            return OK if self.started else v.take_ws()
        if self.started:
            return REJECT
        child = self.node.start(b)
        if child is None:
            return REJECT
        self.started = True
        v.stack.append(child)
        return OK

    def distance(self, child: Frame | None) -> int:
        return 0 if self.started else self.node.minlen


# Object frame states.
_O_OPEN, _O_NEXT, _O_KEY, _O_COLON, _O_VALUE, _O_AFTER = range(6)


class ObjectFrame(Frame):
    __slots__ = ("node", "state", "seen", "cur")

    def __init__(self, node: ObjectNode, state: int = _O_OPEN, seen=frozenset(), cur=None):
        self.node, self.state, self.seen, self.cur = node, state, seen, cur

    def copy(self) -> ObjectFrame:
        return ObjectFrame(self.node, self.state, self.seen, self.cur)

    def feed(self, b: int, v: JsonValidator) -> int:
        state = self.state
        if b in _WS:
            return v.take_ws()
        if state == _O_VALUE:
            child = self.cur.start(b)
            if child is None:
                return REJECT
            self.state = _O_AFTER
            v.stack.append(child)
            return OK
        if state == _O_AFTER:
            if b == _COMMA and (self.node.free or len(self.seen) < len(self.node.properties)):
                self.state = _O_NEXT
                return OK
            return DONE if b == _RBRACE and self.node.required <= self.seen else REJECT
        if state == _O_COLON:
            if b == _COLON:
                self.state = _O_VALUE
                return OK
            return REJECT
        if b == _QUOTE:  # _O_OPEN or _O_NEXT
            return self._start_key(v)
        if b == _RBRACE and state == _O_OPEN and not self.node.required:
            return DONE
        return REJECT

    def _start_key(self, v: JsonValidator) -> int:
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
        if self.node.free:
            self.cur = self.node.additional
        else:
            key = self.node.key_of[child.matched()]
            self.seen = self.seen | {key}
            self.cur = self.node.properties[key]
        self.state = _O_COLON

    def distance(self, child: Frame | None) -> int:
        node, state = self.node, self.state
        left = node.required - self.seen
        if state == _O_OPEN:
            return node.rest_open(left)
        if state == _O_AFTER:
            return node.rest_after(left)
        if state == _O_VALUE:
            return self.cur.minlen + node.rest_after(left)
        if state == _O_COLON:
            return 1 + self.cur.minlen + node.rest_after(left)
        if state == _O_NEXT:
            if left:
                return node.rest_open(left)
            if node.free:
                return 3 + node.additional.minlen + 1
            return 1 + min(c for k, c in node.cost.items() if k not in self.seen)
        return self._key_distance(child, left)

    def _key_distance(self, child: Frame | None, left: frozenset[str]) -> int:
        """Key being written: the best key it can still become decides the rest."""
        node = self.node
        if node.free:
            return child.own_distance() + 1 + node.additional.minlen + 1
        best = None
        for lit in child.alive:
            key = node.key_of[lit]
            rest = node.rest_after(left - {key})
            d = len(lit) - child.pos + 1 + node.properties[key].minlen + rest
            best = d if best is None or d < best else best
        return best


# Array frame states.
_A_OPEN, _A_NEXT, _A_AFTER = range(3)


class ArrayFrame(Frame):
    __slots__ = ("node", "state", "count")

    def __init__(self, node: ArrayNode, state: int = _A_OPEN, count: int = 0) -> None:
        self.node, self.state, self.count = node, state, count

    def copy(self) -> ArrayFrame:
        return ArrayFrame(self.node, self.state, self.count)

    def feed(self, b: int, v: JsonValidator) -> int:
        if b in _WS:
            return v.take_ws()
        node, state = self.node, self.state
        if state == _A_AFTER:
            if b == _COMMA and (node.max_items is None or self.count < node.max_items):
                self.state = _A_NEXT
                return OK
            return DONE if b == _RBRACKET and self.count >= node.min_items else REJECT
        if state == _A_OPEN and b == _RBRACKET:
            return DONE if node.min_items == 0 else REJECT
        if node.max_items == 0:
            return REJECT
        child = node.items.start(b)
        if child is None:
            return REJECT
        self.count += 1
        self.state = _A_AFTER
        v.stack.append(child)
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

    def feed(self, b: int, v: JsonValidator) -> int:
        if self.utf_left:
            if not self.lo <= b <= self.hi:
                return REJECT
            self.utf_left -= 1
            self.lo, self.hi = 0x80, 0xBF
            return OK
        if self.hex_left:
            if b not in _HEX:
                return REJECT
            self.hex_left -= 1
            return OK
        if self.esc:
            self.esc = False
            if b == ord("u"):
                self.hex_left = 4
                return OK
            return OK if b in _ESCAPES else REJECT
        if b == _QUOTE:
            return DONE
        if b == _BACKSLASH:
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
            if b == 0xE0:
                self.lo = 0xA0
            elif b == 0xED:
                self.hi = 0x9F
        elif 0xF0 <= b <= 0xF4:
            self.utf_left = 3
            if b == 0xF0:
                self.lo = 0x90
            elif b == 0xF4:
                self.hi = 0x8F
        else:
            return REJECT
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

    def feed(self, b: int, v: JsonValidator) -> int:
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

    def feed(self, b: int, v: JsonValidator) -> int:
        pos = self.pos
        alive = [c for c in self.alive if len(c) > pos and c[pos] == b]
        if not alive:
            return REFEED if self.can_end() else REJECT
        self.alive, self.pos = alive, pos + 1
        if len(alive) == 1 and len(alive[0]) == pos + 1 and alive[0][-1] not in _DIGITS:
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


# ================================================================================ validator


class JsonValidator:
    """Incremental check that bytes fed so far are a prefix of a document of ``node``.

    ``feed`` returns False (and the validator is then dead) at the first byte that no valid
    document could have there; try candidates on a ``copy()``.
    """

    __slots__ = ("stack", "ws_run", "dead")

    def __init__(self, node: Node = ANY_OBJECT) -> None:
        self.stack: list[Frame] = [RootFrame(node)]
        self.ws_run = 0
        self.dead = False

    def copy(self) -> JsonValidator:
        new = JsonValidator.__new__(JsonValidator)
        new.stack = [f.copy() for f in self.stack]
        new.ws_run, new.dead = self.ws_run, self.dead
        return new

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
        if b not in _WS:
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


# ================================================================================ schemas


@dataclass
class Grammar:
    """A compiled schema: ``root`` node; ``notes`` list what the automaton does not enforce."""

    root: Node
    schema: Mapping[str, Any] | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def fully_enforced(self) -> bool:
        """True when every completed output is valid against the schema by construction."""
        return not self.notes


_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated"}
    | {"readOnly", "writeOnly", "$defs", "definitions", "strict", "name"}
)
_VALUE_CHECKS = frozenset(
    {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength"}
    | {"maxLength", "pattern", "format", "uniqueItems", "minProperties", "maxProperties"}
    | {"contentEncoding", "contentMediaType"}
)
_HANDLED = frozenset(
    {"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems"}
    | {"enum", "const", "anyOf", "allOf", "$ref"}
)
_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")


def compile_schema(schema: Mapping[str, Any] | bool) -> Grammar:
    """Compile a JSON schema into a grammar (see the module docstring for the subset)."""
    compiler = _SchemaCompiler(schema)
    root = compiler.node(schema, "#")
    return Grammar(root, schema if isinstance(schema, Mapping) else None, compiler.notes)


class _SchemaCompiler:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.notes: list[str] = []
        self.resolving: set[str] = set()

    def node(self, s: Any, where: str) -> Node:
        if s is True:
            return ANY
        if s is False:
            raise SchemaError(f"schema at {where} is false: no value is valid")
        if not isinstance(s, Mapping):
            raise SchemaError(f"schema at {where} is not an object")
        if "$ref" in s:
            return self._ref(s, where)
        checks = sorted(set(s) & _VALUE_CHECKS)
        if checks:
            self.notes.append(f"{where}: not enforced while decoding: {', '.join(checks)}")
        unknown = sorted(set(s) - _HANDLED - _VALUE_CHECKS - _ANNOTATIONS)
        all_of = s.get("allOf")
        if all_of is not None and not (isinstance(all_of, list) and len(all_of) == 1):
            unknown.append("allOf")
        if unknown:
            self.notes.append(f"{where}: unsupported {', '.join(unknown)}: any value of its type")
            return self._typed_only(s, where)
        if all_of is not None:
            rest = {k: v for k, v in s.items() if k != "allOf"}
            return self.node(_merge(rest, all_of[0]), where)
        if "anyOf" in s:
            rest = {k: v for k, v in s.items() if k != "anyOf"}
            options = s["anyOf"]
            if not isinstance(options, list):
                raise SchemaError(f"anyOf at {where} must be a list")
            branches = [_merge(rest, o) for o in options]
            return UnionNode([self.node(b, f"{where}/anyOf/{i}") for i, b in enumerate(branches)])
        types = self._types(s, where)
        if "const" in s or "enum" in s:
            values = [s["const"]] if "const" in s else list(s["enum"])
            values = [v for v in values if any(_has_type(v, t) for t in types)]
            return LiteralNode(_dumps(v) for v in values)
        nodes = [self._typed(t, s, where) for t in types]
        return nodes[0] if len(nodes) == 1 else UnionNode(nodes)

    def _ref(self, s: Mapping[str, Any], where: str) -> Node:
        ref = s["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#") or ref in self.resolving:
            self.notes.append(f"{where}: $ref {ref!r} (recursive or not local): any value")
            return ANY
        target: Any = self.root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, Mapping) or part not in target:
                raise SchemaError(f"$ref {ref!r} at {where} does not resolve")
            target = target[part]
        self.resolving.add(ref)
        try:
            return self.node(target, ref)
        finally:
            self.resolving.discard(ref)

    def _types(self, s: Mapping[str, Any], where: str) -> list[str]:
        t = s.get("type")
        if t is None:
            if {"properties", "required", "additionalProperties"} & s.keys():
                return ["object"]
            if {"items", "minItems", "maxItems"} & s.keys():
                return ["array"]
            return list(_TYPES)
        types = [t] if isinstance(t, str) else list(t)
        bad = [x for x in types if x not in _TYPES]
        if bad or not types:
            raise SchemaError(f"unknown type {t!r} at {where}")
        if "number" in types and "integer" in types:
            types.remove("integer")
        return types

    def _typed_only(self, s: Mapping[str, Any], where: str) -> Node:
        """Fallback for unsupported keywords: any value of the declared type(s)."""
        if "type" not in s:
            return ANY
        simple = {"object": ANY_OBJECT, "array": ANY_ARRAY}
        nodes = [simple.get(t) or self._typed(t, {}, where) for t in self._types(s, where)]
        return nodes[0] if len(nodes) == 1 else UnionNode(nodes)

    def _typed(self, t: str, s: Mapping[str, Any], where: str) -> Node:
        if t == "object":
            return self._object(s, where)
        if t == "array":
            items = s.get("items", True)
            if isinstance(items, list):  # draft-4 tuple form
                self.notes.append(f"{where}: tuple items: any items")
                items = True
            max_items = s.get("maxItems")
            return ArrayNode(
                self.node(items, f"{where}/items"),
                int(s.get("minItems", 0)),
                None if max_items is None else int(max_items),
            )
        if t == "string":
            return StringNode()
        if t in ("number", "integer"):
            return NumberNode(integer=t == "integer")
        return LiteralNode([b"true", b"false"] if t == "boolean" else [b"null"])

    def _object(self, s: Mapping[str, Any], where: str) -> Node:
        props = dict(s.get("properties") or {})
        required = list(s.get("required") or [])
        for key in required:
            props.setdefault(key, True)  # required but undeclared: any value
        nodes = {k: self.node(v, f"{where}/properties/{k}") for k, v in props.items()}
        extra = s.get("additionalProperties", True)
        additional = None if extra is False or props else self.node(extra, f"{where}/*")
        return ObjectNode(nodes, required, additional)


def _merge(outer: Mapping[str, Any], inner: Any) -> Any:
    """A subschema (anyOf branch, allOf item) with the keywords around it applied too."""
    if isinstance(inner, Mapping):
        return {**outer, **inner}
    return inner if inner is False or not outer else dict(outer)


def _has_type(value: Any, t: str) -> bool:
    if t == "integer":
        return (
            isinstance(value, int)
            and not isinstance(value, bool)
            or (isinstance(value, float) and value.is_integer())
        )
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
    if t == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, kinds[t])


def validate_output(text: str, schema: Mapping[str, Any] | None) -> str | None:
    """Why ``text`` is not a valid answer (None when it is): parse, top-level object or schema.

    The post-check for schemas the automaton does not fully enforce (``Grammar.notes``), and a
    way to tell a caller that a length-cut answer is not JSON.
    """
    try:
        value = json.loads(text)
    except ValueError as e:
        return f"not valid JSON: {e}"
    if schema is None:
        return None if isinstance(value, dict) else "the top-level value is not an object"
    import jsonschema

    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as e:
        return f"does not match the schema: {e.message}"
    return None


# ================================================================================ processor


class JsonConstraint:
    """Logits processor that only lets through tokens keeping the output valid JSON.

    Place it after the penalties and before temperature / top-k / top-p: the warpers then
    renormalise among valid tokens only, and greedy takes the best valid token. One instance
    per request (it holds the request's parse state).
    """

    def __init__(
        self,
        token_texts: TokenTexts,
        eos_token_ids: Iterable[int],
        schema: Mapping[str, Any] | None = None,
        *,
        max_tokens: int | None = None,
        top_k: int = DEFAULT_TOP_K,
    ) -> None:
        self.texts = token_texts
        self.eos_token_ids = frozenset(eos_token_ids)
        self.grammar = compile_schema(schema) if schema is not None else Grammar(ANY_OBJECT)
        self.validator = JsonValidator(self.grammar.root)
        self.max_tokens = max_tokens
        self.top_k = top_k
        self.num_consumed = 0
        self.failed = False

    @property
    def complete(self) -> bool:
        return self.validator.complete

    def __call__(self, logits: torch.Tensor, history: Any) -> torch.Tensor:
        self._advance(history.output_ids)
        if self.failed:
            return logits
        allowed = self.allowed_ids(logits, len(history.output_ids))
        index = torch.tensor(allowed, dtype=torch.long, device=logits.device)
        values = logits[index]
        if torch.isneginf(values).all():  # an earlier rule ruled them all out: keep them anyway
            values = torch.zeros_like(values)
        return torch.full_like(logits, float("-inf")).index_copy(0, index, values)

    def _advance(self, output_ids: Sequence[int]) -> None:
        """Feed the tokens chosen since the last call into the validator."""
        if len(output_ids) < self.num_consumed:
            raise ValueError("the token history went backwards; use one constraint per request")
        for token in output_ids[self.num_consumed :]:
            self.num_consumed += 1
            if token in self.eos_token_ids:
                continue
            if not self._bytes(token) or not self.validator.feed(self._bytes(token)):
                logger.warning("token %d broke the JSON constraint; no longer constraining", token)
                self.failed = True
                return

    def _bytes(self, token: int) -> bytes:
        texts = self.texts.token_bytes
        return texts[token] if 0 <= token < len(texts) else b""

    def allowed_ids(self, logits: torch.Tensor, num_generated: int) -> list[int]:
        """Ids that may come next (never empty): valid, within budget, best logits first."""
        if self.validator.complete and self.eos_token_ids:
            return sorted(self.eos_token_ids)
        limit = self._distance_limit(num_generated)
        top = torch.topk(logits, min(self.top_k, logits.numel())).indices.tolist()
        found = [i for i in top if self._accepts(i, limit)]
        if not found:
            found = self._scan(logits, limit)
        if not found and limit is not None:  # the budget cannot be met: any valid token
            found = self._scan(logits, None)
        if not found:  # cannot happen with a byte-level vocabulary
            logger.error("no token continues the JSON; letting the model end")
            found = sorted(self.eos_token_ids) or top
        return found

    def _distance_limit(self, num_generated: int) -> int | None:
        """Largest ``distance`` allowed after the next token (None: unlimited); module doc."""
        if self.max_tokens is None:
            return None
        remaining = self.max_tokens - num_generated
        return max(remaining - 2, self.validator.distance() - 1)

    def _accepts(self, token: int, limit: int | None) -> bool:
        data = self._bytes(token)
        if not data:
            return False
        trial = self.validator.copy()
        return trial.feed(data) and (limit is None or trial.distance() <= limit)

    def _scan(self, logits: torch.Tensor, limit: int | None) -> list[int]:
        """The valid tokens that matter when none of the top-K is valid (never empty if any is).

        Byte-level vocabularies have a token per byte, and some byte is always valid (within
        budget, when the budget can be met), so the valid single-byte tokens are a *floor*:
        only tokens with a higher logit and a valid first byte (one vectorised lookup) can beat
        them, and those are tried in logit order, in growing top-k windows (a full sort of
        151k logits costs ~10 ms), at most ``MAX_SCAN`` of them (``MAX_SCAN_CLOSING`` when
        the budget forces progress). Greedy stays exact unless that cap is hit.
        """
        first_ok = torch.zeros(257, dtype=torch.bool)
        floor: list[int] = []
        for b in range(256):
            trial = self.validator.copy()
            if trial.feed(bytes((b,))):
                first_ok[b] = True
                token = self.texts.byte_token_ids.get(b)
                if token is not None and (limit is None or trial.distance() <= limit):
                    floor.append(token)
        mask = first_ok[self.texts.first_bytes(logits.numel())].to(logits.device)
        if floor:
            mask &= logits > logits[floor].max()
        closing = limit is not None and limit < self.validator.distance()
        pool = min(int(mask.sum()), MAX_SCAN_CLOSING if closing else MAX_SCAN)
        masked = logits.masked_fill(~mask, float("-inf"))
        done, size = 0, SCAN_CHUNK
        while done < pool:
            size = min(size, pool)
            window = torch.topk(masked, size).indices.tolist()[done:]
            for start in range(0, len(window), SCAN_CHUNK):
                found = [i for i in window[start : start + SCAN_CHUNK] if self._accepts(i, limit)]
                if found:
                    return found + floor
            done, size = size, size * 8
        return floor


def constraint_for_response_format(
    response_format: Mapping[str, Any] | None,
    token_texts: TokenTexts,
    eos_token_ids: Iterable[int],
    *,
    max_tokens: int | None = None,
) -> JsonConstraint | None:
    """The constraint an OpenAI ``response_format`` asks for (None for text / absent).

    ``{"type": "json_object"}`` -> any JSON object; ``{"type": "json_schema", "json_schema":
    {"schema": {...}}}`` -> that schema. Raises ``SchemaError`` (a ``ValueError``) for a
    malformed response_format or a schema that admits nothing.
    """
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        schema = None
    elif kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if not isinstance(schema, Mapping):
            raise SchemaError("response_format.json_schema.schema must be a JSON schema object")
    else:
        raise SchemaError(f"unknown response_format type {kind!r}")
    return JsonConstraint(token_texts, eos_token_ids, schema, max_tokens=max_tokens)


def attach_constraint(sampler: Any, constraint: LogitsProcessor | None) -> None:
    """Put ``constraint`` in ``sampler.processors`` after the penalties, before the warpers.

    Penalties reshape the model's preferences and must see every token; temperature / top-k /
    top-p must only renormalise among valid tokens (a top-k taken before masking could keep
    nothing valid). Greedy samplers have no warpers, so this appends.
    """
    if constraint is None:
        return
    warpers = (Temperature, TopK, TopP)
    processors = sampler.processors
    index = next((i for i, p in enumerate(processors) if isinstance(p, warpers)), len(processors))
    processors.insert(index, constraint)
