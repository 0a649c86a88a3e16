"""Constrained decoding: logits processors that keep an answer inside a grammar or a prefix.

- ``GrammarConstraint``: an llguidance matcher (``serve_app.grammar``) masks every token that
  would leave the grammar; it is advanced by the tokens actually chosen
  (``history.output_ids``), so it needs nothing from the sampler but a place in the processor
  list (``attach_constraint``). ``response_format`` (json_object, json_schema) and tool calls'
  arguments (``engine.tool_call_grammar``) decode under it.
- ``AnswerPrefixConstraint``: the answer spells a given text first (token healing).

An answer that ends under a grammar is valid by construction; one cut by ``max_tokens`` ends
with ``finish_reason: length`` and may be unfinished JSON, as OpenAI's are.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from serve_app.engine.sampling import LogitsProcessor, Temperature, TokenHistory, TopK, TopP
from serve_app.grammar.matcher import GrammarTokenizer
from serve_app.grammar.postcheck import validate_output
from serve_app.grammar.schema import ANY_OBJECT_SCHEMA, Grammar, SchemaError, compile_schema
from serve_app.grammar.token_bytes import TokenTexts

__all__ = [
    "AnswerPrefixConstraint",
    "Grammar",
    "GrammarConstraint",
    "SchemaError",
    "TokenTexts",
    "attach_constraint",
    "compile_schema",
    "constraint_for_response_format",
    "validate_output",
]

logger = logging.getLogger(__name__)

RESPONSE_FORMAT_SCHEMA = "response_format.json_schema.schema"


class GrammarConstraint:
    """Logits processor that only lets through tokens the grammar allows next (end of answer
    only once the grammar is satisfied). One per request: it holds the request's matcher."""

    def __init__(
        self,
        grammar: Grammar,
        tokenizer: GrammarTokenizer,
        eos_token_ids: Iterable[int],
        *,
        forbidden: Iterable[int] = (),
    ) -> None:
        """``forbidden``: ids never allowed, whatever the grammar says (a tool call's markers
        inside its own arguments)."""
        self.tokenizer = tokenizer
        self.matcher = tokenizer.new_matcher(grammar)
        self.eos_token_ids = frozenset(eos_token_ids)
        self.forbidden = sorted(set(forbidden))
        self.num_consumed = 0
        self.failed = False

    @property
    def complete(self) -> bool:
        """The answer so far is a whole sentence of the grammar."""
        return not self.failed and self.matcher.is_accepting()

    def __call__(self, logits: torch.Tensor, history: Any) -> torch.Tensor:
        self.advance(history.output_ids)
        if self.failed:
            return logits
        allowed = self.allowed(logits.numel()).to(logits.device)
        minus_inf = logits.new_full((), float("-inf"))
        masked = torch.where(allowed, logits, minus_inf)  # faster than masked_fill here
        if torch.isneginf(masked).all():  # an earlier rule ruled them all out: keep them
            masked = torch.where(allowed, logits.new_zeros(()), minus_inf)
        return masked

    def allowed(self, size: int) -> torch.Tensor:
        """Which of ``size`` ids may come next: the grammar's, and the end where it is done."""
        if self.matcher.is_stopped():  # nothing may follow but the end
            row = torch.zeros(size, dtype=torch.bool)
            row[[i for i in self.eos_token_ids if i < size]] = True
            return row
        row = self.tokenizer.allowed(self.matcher, size)
        ends = [i for i in self.eos_token_ids if i < size]
        row[ends] = self.matcher.is_accepting()
        row[[i for i in self.forbidden if i < size]] = False
        return row

    def advance(self, output_ids: Sequence[int]) -> None:
        """Feed the tokens chosen since the last call into the matcher."""
        if len(output_ids) < self.num_consumed:
            raise ValueError("the token history went backwards; use one constraint per request")
        for token in output_ids[self.num_consumed :]:
            self.num_consumed += 1
            if token in self.eos_token_ids or self.failed:
                continue
            if not self.matcher.consume_token(token):
                logger.warning(
                    "token %d left the grammar (%s); no longer constraining",
                    token,
                    self.matcher.get_error(),
                )
                self.failed = True


def constraint_for_response_format(
    response_format: Mapping[str, Any] | None,
    tokenizer: GrammarTokenizer,
    eos_token_ids: Iterable[int],
) -> GrammarConstraint | None:
    """The constraint an OpenAI ``response_format`` asks for (None for text / absent):
    ``{"type": "json_object"}`` -> any JSON object; ``{"type": "json_schema", "json_schema":
    {"schema": {...}}}`` -> that schema. Raises ``SchemaError`` for a malformed
    response_format or a schema this service does not decode under."""
    if response_format is None:
        return None
    kind = response_format.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        schema: Any = ANY_OBJECT_SCHEMA
    elif kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
    else:
        raise SchemaError(f"unknown type {kind!r}.", "response_format.type")
    grammar = compile_schema(schema, RESPONSE_FORMAT_SCHEMA)
    return GrammarConstraint(grammar, tokenizer, eos_token_ids)


class AnswerPrefixConstraint:
    """The output begins with ``text`` (``GenerationRequest.answer_prefix``): until spelled,
    each token must spell the rest (and may go on) or a beginning of it, so the model picks its
    own tokens for it (``"        "`` as ``"       "`` + ``" if"``)."""

    def __init__(self, text: str, token_texts: TokenTexts) -> None:
        self.text = text.encode()
        self.token_texts = token_texts

    def still_to_spell(self, output_ids: list[int]) -> bytes:
        rest = self.text
        for token in output_ids:
            spelled = self.token_texts.token_bytes[token]
            if spelled.startswith(rest):
                return b""
            rest = rest[len(spelled) :]  # a beginning of it: the mask allowed nothing else
        return rest

    def __call__(self, logits: torch.Tensor, history: TokenHistory) -> torch.Tensor:
        rest = self.still_to_spell(history.output_ids)
        if not rest:
            return logits
        index = torch.tensor(self.token_texts.ids_continuing(rest), device=logits.device)
        kept = torch.full_like(logits, float("-inf"))
        kept[index] = logits[index]
        return kept


def attach_constraint(sampler: Any, constraint: LogitsProcessor | None) -> None:
    """Put ``constraint`` in ``sampler.processors`` after the penalties, before the warpers.

    Penalties reshape the model's preferences and must see every token; temperature / top-k /
    top-p must renormalise among valid tokens only (a top-k taken before masking could keep
    nothing valid). Greedy samplers have no warpers: this appends, and greedy takes the best
    valid token."""
    if constraint is None:
        return
    warpers = (Temperature, TopK, TopP)
    processors = sampler.processors
    index = next((i for i, p in enumerate(processors) if isinstance(p, warpers)), len(processors))
    processors.insert(index, constraint)
