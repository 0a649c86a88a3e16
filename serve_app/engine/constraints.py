"""Constrained decoding for ``response_format``: JSON that always parses, and fits its schema.

Three layers, each usable on its own (modules of ``serve_app.grammar``):

- ``TokenTexts`` (``token_bytes``): the exact bytes of every token id of a tokenizer, built
  once per tokenizer. Byte-level BPE tokens are often *partial* UTF-8 characters, so
  everything below works on bytes, never on decoded text.
- ``JsonValidator`` (``validator``, ``automaton``, ``nodes``, ``schema``): an incremental
  JSON prefix checker, a small pushdown automaton (a stack of frames: object, array, string,
  number, literal) driven by a *grammar* node tree. Plain JSON is the grammar ``ANY_OBJECT``;
  a JSON schema is compiled (``compile_schema``) into a grammar that only admits the schema's
  keys and value types. ``copy()`` is cheap, so candidate tokens are tried on copies.
  ``distance()`` is the fewest bytes that still complete the document, which drives the token
  budget (below).
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

Every cost a request controls is bounded: see ``serve_app.grammar.schema`` (caps on the
compiled grammar) and ``serve_app.grammar.postcheck`` (regexes under a deadline).
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
# Most candidates tried by one scan before settling for the valid single-byte tokens; fewer
# when the budget forces progress (closing a long string: valid tokens need a '"', and
# trying thousands of words to find one costs ~25 ms while a single '"' always works).
MAX_SCAN = 4096
MAX_SCAN_CLOSING = 256

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
        validator: Any = None,
    ) -> None:
        """``validator``: what the output must be a prefix of, where it is not ``schema``'s
        JSON (``tool_calls.CallValidator``: ``feed``, ``copy``, ``complete``, ``distance``)."""
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


class AnswerPrefixConstraint:
    """The output begins with ``text`` (``GenerationRequest.answer_prefix``): until it is
    spelled, each token must spell the rest of it (and may go on) or a beginning of the rest,
    so the model picks its own tokens for it (``"        "`` as ``"       "`` + ``" if"``)."""

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
    top-p must only renormalise among valid tokens (a top-k taken before masking could keep
    nothing valid). Greedy samplers have no warpers, so this appends.
    """
    if constraint is None:
        return
    warpers = (Temperature, TopK, TopP)
    processors = sampler.processors
    index = next((i for i, p in enumerate(processors) if isinstance(p, warpers)), len(processors))
    processors.insert(index, constraint)
