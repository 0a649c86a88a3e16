"""One adapter per constrained-decoding engine ``bench.grammar_library`` compares: the project's
automaton (``serve_app.grammar``) and the grammar libraries that are installed
(llguidance, xgrammar, outlines-core). Each compiles a schema and hands out walkers that
compute the next-token mask, say whether a token is in it, and advance by a token.

The libraries are set up to keep the project's guarantees where they can: whitespace is
allowed but bounded (the automaton allows 64 structural whitespace bytes in a row, so a model
cannot loop on newlines), and objects with ``properties`` take only those keys. outlines-core
keeps its default whitespace (one optional space): with newlines allowed (``[ \n\r\t]{0,4}``)
its regex index of the tests' SCHEMA took 2.1 s instead of 1.3 s, and the default is its best
case.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib import metadata
from typing import Any, Protocol

import torch

from bench.grammar_cases import Schema
from serve_app.engine.constraints import JsonConstraint
from serve_app.grammar import schema as schema_module
from serve_app.grammar.automaton import MAX_WS_RUN
from serve_app.grammar.token_bytes import TokenTexts

ANY_OBJECT_SCHEMA = {"type": "object"}  # what json_object mode is, for the libraries
WS_PATTERN = rf"[\x20\x0A\x0D\x09]{{1,{MAX_WS_RUN}}}"


class Walker(Protocol):
    def mask(self, logits: torch.Tensor) -> None:
        """Compute the allowed next tokens (the timed part)."""

    def allows(self, token: int) -> bool: ...

    def advance(self, token: int) -> bool:
        """Take ``token``; False where the engine refuses it."""


class Engine(Protocol):
    name: str
    version: str

    def compile(self, schema: Schema) -> Any:
        """The compiled schema; raises (any exception) where the engine refuses it."""

    def walker(self, compiled: Any) -> Walker: ...


def _bit(mask: torch.Tensor, token: int) -> bool:
    return bool((int(mask[0, token >> 5]) >> (token & 31)) & 1)


# ------------------------------------------------------------------------------ automaton


class AutomatonWalker:
    """``JsonConstraint.allowed_ids`` as the engine calls it: the top-64 candidates by logit
    checked on validator copies, the vocabulary scanned only when none of them is valid."""

    def __init__(self, texts: TokenTexts, eos: list[int], schema: Schema) -> None:
        self.constraint = JsonConstraint(texts, eos, schema)
        self.output: list[int] = []
        self.allowed: list[int] = []

    def mask(self, logits: torch.Tensor) -> None:
        self.allowed = self.constraint.allowed_ids(logits, len(self.output))

    def allows(self, token: int) -> bool:
        return token in self.allowed

    def advance(self, token: int) -> bool:
        self.output.append(token)
        self.constraint.advance(self.output)
        return not self.constraint.failed


class Automaton:
    name = "automaton"
    version = "project"

    def __init__(self, texts: TokenTexts, eos: list[int]) -> None:
        self.texts, self.eos = texts, eos

    def compile(self, schema: Schema) -> Any:
        if schema is None:
            return None
        schema_module._CACHE.clear()  # time the compile, not the LRU cache
        return schema_module.compile_schema(schema)

    def walker(self, compiled: Any) -> Walker:
        schema = None if compiled is None else compiled.schema
        return AutomatonWalker(self.texts, self.eos, schema)


# ---------------------------------------------------------------------------- llguidance


class LLGuidanceWalker:
    def __init__(self, matcher: Any, vocab: int) -> None:
        import llguidance.torch

        self.matcher = matcher
        self.fill = llguidance.torch.fill_next_token_bitmask
        self.bitmask = llguidance.torch.allocate_token_bitmask(1, vocab)

    def mask(self, logits: torch.Tensor) -> None:
        self.fill(self.matcher, self.bitmask)

    def allows(self, token: int) -> bool:
        return _bit(self.bitmask, token)

    def advance(self, token: int) -> bool:
        return self.matcher.consume_token(token) and not self.matcher.is_error()


class LLGuidance:
    name = "llguidance"

    def __init__(self, tokenizer: Any, eos: list[int]) -> None:
        import llguidance
        import llguidance.hf

        self.version = metadata.version("llguidance")
        self.llg = llguidance
        self.vocab = len(tokenizer)
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=self.vocab, eos_token=eos)

    def compile(self, schema: Schema) -> Any:
        # ``overrides``: a client's own "x-guidance" key must not loosen the whitespace bound
        # or turn on ``lenient`` (unsupported keywords ignored instead of refused). \uXXXX
        # escapes of printable characters are JSON the automaton takes; llguidance's default
        # only takes them for control characters.
        options = {
            "whitespace_pattern": WS_PATTERN,
            "lenient": False,
            "coerce_one_of": False,
            "json_allow_general_unicode_escapes": True,
        }
        grammar = self.llg.LLMatcher.grammar_from_json_schema(
            schema if schema is not None else ANY_OBJECT_SCHEMA, overrides=options
        )
        matcher = self.llg.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(matcher.get_error())
        return matcher

    def walker(self, compiled: Any) -> Walker:
        return LLGuidanceWalker(compiled.deep_copy(), self.vocab)


# ------------------------------------------------------------------------------ xgrammar


class XGrammarWalker:
    def __init__(self, xgr: Any, compiled: Any, vocab: int) -> None:
        self.matcher = xgr.GrammarMatcher(compiled)
        self.bitmask = xgr.allocate_token_bitmask(1, vocab)

    def mask(self, logits: torch.Tensor) -> None:
        self.matcher.fill_next_token_bitmask(self.bitmask)

    def allows(self, token: int) -> bool:
        return _bit(self.bitmask, token)

    def advance(self, token: int) -> bool:
        return self.matcher.accept_token(token)


class XGrammar:
    name = "xgrammar"

    def __init__(self, tokenizer: Any, eos: list[int], threads: int) -> None:
        import xgrammar

        self.version = metadata.version("xgrammar")
        self.xgr = xgrammar
        self.vocab = len(tokenizer)
        info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=self.vocab, stop_token_ids=eos
        )
        # No cache: every compile is timed whole, as a new schema's would be.
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=threads, cache_enabled=False)

    def compile(self, schema: Schema) -> Any:
        return self.compiler.compile_json_schema(
            json.dumps(schema if schema is not None else ANY_OBJECT_SCHEMA),
            any_whitespace=True,
            max_whitespace_cnt=MAX_WS_RUN,
            strict_mode=True,  # objects with properties take only those keys, as today
        )

    def walker(self, compiled: Any) -> Walker:
        return XGrammarWalker(self.xgr, compiled, self.vocab)


# ------------------------------------------------------------------------- outlines-core


class OutlinesWalker:
    def __init__(self, guide: Any, vocab: int) -> None:
        self.guide = guide
        self.bitmask = torch.zeros((1, (vocab + 31) // 32), dtype=torch.int32)

    def mask(self, logits: torch.Tensor) -> None:
        self.guide.write_mask_into(self.bitmask.data_ptr(), self.bitmask.numel(), 4)

    def allows(self, token: int) -> bool:
        return _bit(self.bitmask, token)

    def advance(self, token: int) -> bool:
        try:
            self.guide.advance(token, return_tokens=False)
        except ValueError:  # "No next state found for the current state"
            return False
        return True


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, texts: TokenTexts, eos: list[int]) -> None:
        import outlines_core

        self.version = metadata.version("outlines-core")
        self.oc = outlines_core
        self.vocab_size = len(texts)
        spelled: dict[bytes, list[int]] = {}
        for token, data in enumerate(texts.token_bytes):
            if data:
                spelled.setdefault(data, []).append(token)
        # One eos only: outlines-core's Vocabulary takes a single end token.
        self.vocabulary = outlines_core.Vocabulary(eos[0], spelled)

    def compile(self, schema: Schema) -> Any:
        regex = self.oc.json_schema.build_regex_from_schema(
            json.dumps(schema if schema is not None else ANY_OBJECT_SCHEMA)
        )
        return self.oc.Index(regex, self.vocabulary)

    def walker(self, compiled: Any) -> Walker:
        return OutlinesWalker(self.oc.Guide(compiled), self.vocab_size)


# -------------------------------------------------------------------------------- loading

LIBRARIES = ("llguidance", "xgrammar", "outlines-core")


def load_tokenizer(path: str) -> tuple[Any, TokenTexts, list[int]]:
    """The tokenizer, its token bytes, and the chat model's end tokens (im_end first)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    eos = [t for t in tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]) if t]
    return tokenizer, TokenTexts.for_tokenizer(tokenizer), eos


def make_engine(
    name: str, tokenizer: Any, texts: TokenTexts, eos: list[int], threads: int
) -> Engine:
    """The engine called ``name`` (ImportError where its library is not installed)."""
    makers: dict[str, Callable[[], Engine]] = {
        "automaton": lambda: Automaton(texts, eos),
        "llguidance": lambda: LLGuidance(tokenizer, eos),
        "xgrammar": lambda: XGrammar(tokenizer, eos, threads),
        "outlines-core": lambda: OutlinesCore(texts, eos),
    }
    return makers[name]()
