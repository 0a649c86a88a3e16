"""Constrained decoding for ``response_format``: JSON that always parses, and fits its schema.

Three layers, each usable alone (modules of ``serve_app.grammar``):

- ``TokenTexts`` (``token_bytes``): every token id's exact bytes (tokens are often partial UTF-8).
- ``JsonValidator`` (``validator``, ``automaton``, ``nodes``, ``schema``): an incremental JSON
  prefix checker (a pushdown automaton) driven by a *grammar*: ``ANY_OBJECT`` for plain JSON,
  or ``compile_schema``'s, admitting only the schema's keys and value types. Candidate tokens
  are tried on cheap ``copy()``s; ``distance()`` (fewest bytes to complete) drives the budget.
- ``JsonConstraint``: a ``LogitsProcessor`` masking every token that would break the prefix,
  advanced by the tokens actually chosen (``history.output_ids``), so it needs nothing from
  the sampler but a place in the processor list (``attach_constraint``).

Enforced while decoding: ``type`` (one or a list, any JSON type); ``properties``, ``required``,
``additionalProperties``; ``items``, ``minItems``, ``maxItems``; ``enum``, ``const``;
``anyOf``; local non-recursive ``$ref``; ``allOf`` of one schema. Objects listing
``properties`` get only those keys (structured-outputs semantics: ``additionalProperties:
false`` implied), each at most once, and ``}`` only after every ``required`` key. Value checks
(``minimum``, ``maxLength``, ``pattern``, ``format``...) are not enforced; other structural
keywords (``oneOf``, ``not``, ``patternProperties``, recursive ``$ref``...) make their subtree
any JSON (of the declared type, if any). Either way ``Grammar.fully_enforced`` is False,
``Grammar.notes`` says why, and callers should post-validate (``validate_output``).

Budget: with ``max_tokens``, a candidate is kept only if the document can still close in the tokens
left (one kept for EOS): ``distance_after <= max(remaining - 2, distance_now - 1)``; far from the
limit anything valid, near it only progress (closing quotes/brackets, minimal values). Byte-level
vocabs have a token per byte and ``distance`` follows a concrete shortest completion, so progress is
always possible. Below the schema's smallest document, output is cut ("length"), unparsable.

Not covered: ``stop`` strings can still cut the JSON; sampling sees only the valid top-K
candidates (the vocabulary is scanned when none is valid): exact for greedy, a truncated tail
otherwise. Costs a request controls are bounded in ``serve_app.grammar`` (``schema``: caps on
the compiled grammar; ``postcheck``: regexes under a deadline).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from serve_app.engine.sampling import LogitsProcessor, Temperature, TokenHistory, TopK, TopP
from serve_app.grammar.nodes import ANY_OBJECT, SchemaError
from serve_app.grammar.postcheck import validate_output
from serve_app.grammar.schema import Grammar, SchemaTooComplexError, compile_schema
from serve_app.grammar.token_bytes import TokenTexts
from serve_app.grammar.validator import JsonValidator

__all__ = [
    "AnswerPrefixConstraint",
    "Grammar",
    "JsonConstraint",
    "JsonValidator",
    "SchemaError",
    "SchemaTooComplexError",
    "TokenTexts",
    "attach_constraint",
    "compile_schema",
    "constraint_for_response_format",
    "validate_output",
]

logger = logging.getLogger(__name__)

DEFAULT_TOP_K = 64
# Candidates tried per chunk when none of the top-K is valid and the vocabulary is scanned.
SCAN_CHUNK = 256
# Most candidates one scan tries before settling for the valid single-byte tokens; fewer when the
# budget forces progress (closing a string: a lone '"' always works, searching words is slow).
MAX_SCAN = 4096
MAX_SCAN_CLOSING = 256


class JsonConstraint:
    """Logits processor that only lets through tokens keeping the output valid JSON. One per
    request (it holds its parse state), after the penalties, before the warpers
    (``attach_constraint``)."""

    def __init__(
        self,
        token_texts: TokenTexts,
        eos_token_ids: Iterable[int],
        schema: Mapping[str, Any] | None = None,
        *,
        max_tokens: int | None = None,
        top_k: int = DEFAULT_TOP_K,
        validator: Any = None,
    ) -> None:
        """``validator``: what the output must be a prefix of, instead of ``schema``'s JSON
        (``tool_calls.CallValidator``: ``feed``, ``copy``, ``complete``, ``distance``)."""
        self.texts = token_texts
        self.eos_token_ids = frozenset(eos_token_ids)
        self.grammar = compile_schema(schema) if schema is not None else Grammar(ANY_OBJECT)
        self.validator = validator if validator is not None else JsonValidator(self.grammar.root)
        self.max_tokens = max_tokens
        self.top_k = top_k
        self.num_consumed = 0
        self.failed = False

    @property
    def complete(self) -> bool:
        return self.validator.complete

    def __call__(self, logits: torch.Tensor, history: Any) -> torch.Tensor:
        self.advance(history.output_ids)
        if self.failed:
            return logits
        allowed = self.allowed_ids(logits, len(history.output_ids))
        index = torch.tensor(allowed, dtype=torch.long, device=logits.device)
        values = logits[index]
        if torch.isneginf(values).all():  # an earlier rule ruled them all out: keep them anyway
            values = torch.zeros_like(values)
        return torch.full_like(logits, float("-inf")).index_copy(0, index, values)

    def advance(self, output_ids: Sequence[int]) -> None:
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
        Some single-byte token is always valid (within a budget that can be met; module doc),
        so those are a *floor*: only tokens with a higher logit and a valid first byte (one
        vectorised lookup) can beat them, tried in logit order in growing top-k windows (cheaper
        than sorting the vocabulary), at most ``MAX_SCAN`` (``MAX_SCAN_CLOSING`` when the
        budget forces progress). Greedy stays exact unless that cap is hit."""
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
    """The constraint an OpenAI ``response_format`` asks for (None for text / absent):
    ``{"type": "json_object"}`` -> any JSON object; ``{"type": "json_schema", "json_schema":
    {"schema": {...}}}`` -> that schema. Raises ``SchemaError`` (a ``ValueError``) for a
    malformed response_format or a schema that admits nothing."""
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
