"""llguidance matchers for one tokenizer: the next token's mask, one request at a time.

``GrammarTokenizer.for_tokenizer`` builds llguidance's view of a vocabulary once (a pass over
every token, docs/structured_output.md; cached, shared by the replica's requests); ``new_matcher``
gives a request its own matcher for a ``Grammar``: a copy of one built once per grammar and
tokenizer, so a request pays microseconds, not the grammar's build. ``allowed`` turns a
matcher's bitmask into a boolean row the size of the logits.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any

import llguidance
import llguidance.hf
import numpy as np
import torch

from serve_app.errors import InvalidRequestError
from serve_app.grammar.schema import LIMITS, Grammar

TEMPLATES_PER_TOKENIZER = 64


class GrammarTokenizer:
    """llguidance's tokenizer for one HF tokenizer, and the matchers built on it."""

    _cache: dict[int, tuple[weakref.ref, GrammarTokenizer]] = {}
    _lock = threading.Lock()

    def __init__(self, tokenizer: Any, eos_token_ids: list[int]) -> None:
        self.vocab_size = len(tokenizer)
        self.ll_tokenizer = llguidance.hf.from_tokenizer(
            tokenizer, n_vocab=self.vocab_size, eos_token=eos_token_ids or None
        )
        self._templates: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self._templates_lock = threading.Lock()
        self._bitmask_words = (self.vocab_size + 31) // 32

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, eos_token_ids: list[int]) -> GrammarTokenizer:
        """The cached instance for ``tokenizer`` (built on first use)."""
        key = id(tokenizer)
        with cls._lock:
            hit = cls._cache.get(key)
            if hit is not None and hit[0]() is tokenizer:
                return hit[1]
            built = cls(tokenizer, sorted(eos_token_ids))
            ref = weakref.ref(tokenizer, lambda _: cls._cache.pop(key, None))
            cls._cache[key] = (ref, built)
            return built

    def new_matcher(self, grammar: Grammar) -> llguidance.LLMatcher:
        """A fresh matcher at the start of ``grammar`` (llguidance builds its lexer once per
        grammar; each request walks its own copy)."""
        with self._templates_lock:
            template = self._templates.get(grammar.text)
            if template is not None:
                self._templates.move_to_end(grammar.text)
                return template.deep_copy()
        template = llguidance.LLMatcher(self.ll_tokenizer, grammar.text, limits=LIMITS, log_level=0)
        if template.is_error():  # checked without a vocabulary before; this one refuses it
            raise InvalidRequestError(
                f"The requested format cannot be decoded with this model's vocabulary: "
                f"{template.get_error()}"
            )
        with self._templates_lock:
            self._templates[grammar.text] = template
            while len(self._templates) > TEMPLATES_PER_TOKENIZER:
                self._templates.popitem(last=False)
        return template.deep_copy()

    def allowed(self, matcher: llguidance.LLMatcher, size: int) -> torch.Tensor:
        """Which of ``size`` token ids ``matcher`` lets come next (ids past the vocabulary,
        padding rows of the embedding, never)."""
        words = np.empty(self._bitmask_words, dtype=np.int32)
        matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        bits = np.unpackbits(words.view(np.uint8), bitorder="little")[: self.vocab_size]
        row = torch.zeros(size, dtype=torch.bool)
        known = min(size, self.vocab_size)
        row[:known] = torch.from_numpy(bits[:known].view(np.bool_))
        return row
