"""Tool calls that always parse: Qwen2.5's ``<tool_call>`` blocks, under a grammar (below).

The embedded models' chat template (``chat_template.jinja``) has the model answer a call as
``<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>``,
both markers single tokens of its vocabulary. ``ToolCallConstraint`` lets the model write
freely (``tool_choice: auto``) until it emits the opening marker, or forces that marker first
(``required``, or a named function); from there the block's body decodes under one Lark
grammar (``call_grammar``): a function of the request by name, then arguments that fit that
function's parameters (each a ``%json`` schema, checked as ``response_format``'s are), then
the closing marker, then the end of the answer or, with ``parallel`` calls, another block.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from serve_app.engine.constraints import GrammarConstraint
from serve_app.engine.protocol import ToolCallFormat
from serve_app.grammar.matcher import GrammarTokenizer
from serve_app.grammar.schema import (
    Grammar,
    cached_grammar,
    checked_grammar,
    compile_schema,
    enforced,
)

OPEN_MARKER, CLOSE_MARKER = "<tool_call>", "</tool_call>"
# The body between the markers, as the template shows it: its pieces around name and arguments.
NAME_START = '\n{"name": "'
ARGUMENTS_START = '", "arguments": '
BODY_END = "}\n"
# What a function without ``parameters`` takes: an empty object.
NO_PARAMETERS: Mapping[str, Any] = {"type": "object", "properties": {}}


def call_grammar(functions: Sequence[tuple[str, Mapping[str, Any] | None]]) -> Grammar:
    """One call's body for any of ``functions`` (cached: the chat service builds it off the
    event loop, the engine then looks it up); ``SchemaError`` names the function's
    ``tools[i].function.parameters`` (its place in ``functions``) and what is wrong there."""

    def build() -> Grammar:
        rules = []
        for index, (name, parameters) in enumerate(functions):
            schema = parameters or NO_PARAMETERS
            compile_schema(schema, f"tools[{index}].function.parameters")  # the checks: a 400
            head = json.dumps(name + ARGUMENTS_START)[1:]  # a Lark string: name + '", ...: '
            rules.append(f'f{index}: "{head} %json {json.dumps(enforced(schema))}')
        alternatives = " | ".join(f"f{index}" for index in range(len(functions)))
        start = f"start: {json.dumps(NAME_START)} call {json.dumps(BODY_END)}"
        return checked_grammar("\n".join([start, f"call: {alternatives}", *rules]), "tools")

    return cached_grammar("calls " + json.dumps(functions), build)


def tool_call_tokens(tokenizer: Any) -> tuple[int, int] | None:
    """The ids of the opening and closing markers where each is one token of ``tokenizer``'s
    vocabulary, else None (the model's template has no tool calls this service can read)."""
    added = getattr(tokenizer, "get_added_vocab", dict)()
    if OPEN_MARKER in added and CLOSE_MARKER in added:
        return added[OPEN_MARKER], added[CLOSE_MARKER]
    return None


class ToolCallConstraint:
    """One request's tool-call ``LogitsProcessor`` (module docstring); it tracks where its answer
    is (text, a call's body, between calls), so one instance per request."""

    def __init__(
        self,
        tool_format: ToolCallFormat,
        markers: tuple[int, int],
        tokenizer: GrammarTokenizer,
        eos_token_ids: Iterable[int],
    ) -> None:
        self.format = tool_format
        self.open_id, self.close_id = markers
        self.grammar = call_grammar(tool_format.functions)
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset(eos_token_ids)
        self.state = "open" if tool_format.required else "text"
        self.calls = 0
        self.consumed = 0
        self.call_start = 0
        self.body: GrammarConstraint | None = None  # the current call's

    def __call__(self, logits: torch.Tensor, history: Any) -> torch.Tensor:
        self._advance(history.output_ids)
        if self.state == "body":
            assert self.body is not None
            return self.body(logits, _BodyHistory(history.output_ids[self.call_start :]))
        allowed = self._allowed()
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
                assert self.body is not None
                self.body.advance(output_ids[self.call_start : position + 1])
                if self.body.failed:
                    self.state = "text"  # a token broke the grammar: stop constraining
                elif self.body.matcher.is_stopped():
                    self.state = "close"
            elif self.state == "close" and token == self.close_id:
                self.calls += 1
                self.state = "between"

    def _open(self, start: int) -> None:
        # A body ends only by its grammar (then the closing marker comes), never by a marker
        # or the end of the answer written inside it.
        never = (self.open_id, self.close_id, *self.eos_token_ids)
        self.body = GrammarConstraint(self.grammar, self.tokenizer, (), forbidden=never)
        self.call_start, self.state = start, "body"

    def _allowed(self) -> list[int] | None:
        if self.state == "text":
            return None
        if self.state == "open":
            return [self.open_id]
        if self.state == "close":
            return [self.close_id]
        more = [self.open_id] if self.format.parallel else []
        return sorted(self.eos_token_ids) + more


class _BodyHistory:
    """What a call's ``GrammarConstraint`` reads of the history: the body's tokens so far."""

    __slots__ = ("output_ids",)

    def __init__(self, output_ids: Sequence[int]) -> None:
        self.output_ids = output_ids
