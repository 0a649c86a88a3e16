"""Tool calls that always parse: Qwen2.5's ``<tool_call>`` blocks, under a grammar (below).

The embedded models' chat template (``chat_template.jinja``) has the model answer a call as
``<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>``,
both markers single tokens of its vocabulary. ``ToolCallConstraint`` lets the model write
freely (``tool_choice: auto``) until it emits the opening marker, or forces that marker first
(``required``, or a named function); from there each token must keep the block a prefix of one
whose name is one of the request's functions and whose arguments fit that function's
parameters, then the closing marker, then the end of the answer or, with ``parallel`` calls,
another block. The arguments go through ``response_format``'s JSON-schema machinery
(``serve_app.grammar``, with its caps), so every call returned is JSON that names a function of
the request and fits its schema, within what that machinery enforces.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from serve_app.engine.constraints import JsonConstraint
from serve_app.engine.protocol import ToolCallFormat
from serve_app.grammar.schema import Grammar, compile_schema
from serve_app.grammar.validator import ByteChecker, JsonValidator

OPEN_MARKER, CLOSE_MARKER = "<tool_call>", "</tool_call>"
# What a function without ``parameters`` takes: an empty object.
NO_PARAMETERS: Mapping[str, Any] = {"type": "object", "properties": {}}


def compile_functions(tool_format: ToolCallFormat) -> dict[str, Grammar]:
    """Each function's compiled arguments schema (``SchemaError`` for a bad one)."""
    return {name: compile_schema(params or NO_PARAMETERS) for name, params in tool_format.functions}


def tool_call_tokens(tokenizer: Any) -> tuple[int, int] | None:
    """The ids of the opening and closing markers where each is one token of ``tokenizer``'s
    vocabulary, else None (the model's template has no tool calls this service can read)."""
    added = getattr(tokenizer, "get_added_vocab", dict)()
    if OPEN_MARKER in added and CLOSE_MARKER in added:
        return added[OPEN_MARKER], added[CLOSE_MARKER]
    return None


class CallValidator(ByteChecker):
    """Whether bytes are a prefix of one call's body (between the markers); to ``JsonConstraint``
    a ``JsonValidator`` (``feed``, ``copy``, ``complete``, ``distance``)."""

    PREFIX = b'\n{"name": "'
    MIDDLE = b'", "arguments": '
    SUFFIX = b"}\n"
    __slots__ = ("grammars", "phase", "matched", "candidates", "arguments")

    def __init__(self, grammars: Mapping[str, Grammar]) -> None:
        self.grammars = grammars
        self.phase = 0  # prefix, name, arguments, suffix, done
        self.matched = 0  # bytes of the current literal matched
        self.candidates = [(name.encode() + self.MIDDLE, name) for name in grammars]
        self.arguments: JsonValidator | None = None
        self.dead = False

    def copy(self) -> CallValidator:
        new = CallValidator.__new__(CallValidator)
        new.grammars, new.phase, new.matched = self.grammars, self.phase, self.matched
        new.candidates, new.dead = self.candidates, self.dead
        new.arguments = self.arguments.copy() if self.arguments is not None else None
        return new

    @property
    def complete(self) -> bool:
        return self.phase == 4 and not self.dead

    @property
    def function(self) -> str | None:
        """The function named, once its name is read."""
        return self.candidates[0][1] if self.phase >= 2 else None

    def _feed_byte(self, b: int) -> bool:
        if self.phase == 0:
            return self._literal(self.PREFIX, b, next_phase=1)
        if self.phase == 1:
            at = self.matched
            kept = [c for c in self.candidates if len(c[0]) > at and c[0][at] == b]
            if not kept:
                return False
            self.candidates, self.matched = kept, self.matched + 1
            done = [c for c in kept if len(c[0]) == self.matched]
            if done:  # names end at their quote, so at most one is done
                self.candidates, self.phase = done, 2
                self.arguments = JsonValidator(self.grammars[done[0][1]].root)
            return True
        if self.phase == 2:
            assert self.arguments is not None
            if self.arguments.complete and b == self.SUFFIX[0]:
                self.phase, self.matched = 3, 1
                return True
            return self.arguments.feed(bytes((b,)))
        if self.phase == 3:
            return self._literal(self.SUFFIX, b, next_phase=4)
        return False

    def _literal(self, literal: bytes, b: int, next_phase: int) -> bool:
        if literal[self.matched] != b:
            return False
        self.matched += 1
        if self.matched == len(literal):
            self.phase, self.matched = next_phase, 0
        return True

    def distance(self) -> int:
        """Fewest bytes that complete the body."""
        suffix = len(self.SUFFIX)
        if self.phase <= 1:
            start = self.matched if self.phase == 1 else 0
            rest = min(
                len(spelled) - start + self.grammars[name].root.minlen
                for spelled, name in self.candidates
            )
            return (len(self.PREFIX) - self.matched if self.phase == 0 else 0) + rest + suffix
        if self.phase == 2:
            assert self.arguments is not None
            return self.arguments.distance() + suffix
        return suffix - self.matched if self.phase == 3 else 0


class ToolCallConstraint:
    """One request's tool-call ``LogitsProcessor`` (module docstring); it tracks where its answer
    is (text, a call's body, between calls), so one instance per request."""

    def __init__(
        self,
        tool_format: ToolCallFormat,
        markers: tuple[int, int],
        token_texts: Any,
        eos_token_ids: Iterable[int],
        *,
        max_tokens: int | None = None,
    ) -> None:
        self.format = tool_format
        self.open_id, self.close_id = markers
        self.grammars = compile_functions(tool_format)
        self.texts = token_texts
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_tokens = max_tokens
        self.state = "open" if tool_format.required else "text"
        self.calls = 0
        self.consumed = 0
        self.call_start = 0
        self.body: Any = None  # the current call's JsonConstraint over a CallValidator

    def __call__(self, logits: torch.Tensor, history: Any) -> torch.Tensor:
        self._advance(history.output_ids)
        allowed = self._allowed(logits, history.output_ids)
        if allowed is None:
            return logits
        index = torch.tensor(allowed, dtype=torch.long, device=logits.device)
        kept = torch.full_like(logits, float("-inf"))
        kept[index] = logits[index]
        return kept

    def _advance(self, output_ids: Sequence[int]) -> None:
        for position in range(self.consumed, len(output_ids)):
            token = output_ids[position]
            self.consumed = position + 1
            if self.state in ("text", "open", "between") and token == self.open_id:
                self._open(position + 1)
            elif self.state == "body":
                self.body.advance(output_ids[self.call_start : position + 1])
                if self.body.failed:
                    self.state = "text"  # a token broke the grammar: stop constraining
                elif self.body.complete:
                    self.state = "close"
            elif self.state == "close" and token == self.close_id:
                self.calls += 1
                self.state = "between"

    def _open(self, start: int) -> None:
        left = None if self.max_tokens is None else max(1, self.max_tokens - start - 2)
        validator = CallValidator(self.grammars)
        self.body = JsonConstraint(
            self.texts, self.eos_token_ids, validator=validator, max_tokens=left
        )
        self.call_start, self.state = start, "body"

    def _allowed(self, logits: torch.Tensor, output_ids: Sequence[int]) -> list[int] | None:
        if self.state == "text":
            return None
        if self.state == "open":
            return [self.open_id]
        if self.state == "body":
            return self.body.allowed_ids(logits, len(output_ids) - self.call_start)
        if self.state == "close":
            return [self.close_id]
        more = [self.open_id] if self.format.parallel else []
        return sorted(self.eos_token_ids) + more
