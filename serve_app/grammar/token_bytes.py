"""The exact bytes of every token id of a tokenizer, built once per tokenizer.

Byte-level BPE tokens are often *partial* UTF-8 characters, so the JSON automaton works on
bytes, never on decoded text.
"""

from __future__ import annotations

import bisect
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

logger = logging.getLogger(__name__)


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
        self.byte_token_ids: dict[int, int] = {}  # byte -> the token that is just that byte
        for i, b in enumerate(self.token_bytes):
            if len(b) == 1:
                self.byte_token_ids.setdefault(b[0], i)
        # No token spells more bytes: bounds the tokens any text can become, cheaply.
        self.max_token_bytes = max((len(b) for b in self.token_bytes), default=1)
        self._first_bytes = torch.tensor([b[0] if b else 256 for b in self.token_bytes])
        self._first_bytes_sized: dict[int, torch.Tensor] = {}
        self._sorted: tuple[list[bytes], list[int]] | None = None

    def __len__(self) -> int:
        return len(self.token_bytes)

    def ids_continuing(self, text: bytes) -> list[int]:
        """The (non-special) tokens that can come next while ``text`` is still to be spelled:
        those that spell it (and maybe more), and those that spell a beginning of it."""
        found = self._ids_where(text, bytes.startswith)
        for end in range(1, len(text)):
            found += self._ids_where(text[:end], bytes.__eq__)
        return [i for i in found if i not in self.special_ids]

    def _ids_where(self, text: bytes, matches: Callable[[bytes, bytes], bool]) -> list[int]:
        """Ids whose bytes ``matches`` ``text``, among the tokens sorted at and after it."""
        if self._sorted is None:  # built on first use (a sort of the vocabulary, docs/fim.md)
            order = sorted(range(len(self.token_bytes)), key=self.token_bytes.__getitem__)
            self._sorted = ([self.token_bytes[i] for i in order], order)
        spelled, ids = self._sorted
        found = []
        for position in range(bisect.bisect_left(spelled, text), len(spelled)):
            if not matches(spelled[position], text):
                break
            found.append(ids[position])
        return found

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> TokenTexts:
        """The cached instance for ``tokenizer`` (built on first use, once: docs/fim.md)."""
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
