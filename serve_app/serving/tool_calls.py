"""Chat tool calls on the serving side: a request's tools checked and put to the engine, and
the answer's ``<tool_call>`` blocks turned into OpenAI's ``tool_calls``, whole or streamed.

The engine decodes each block under its function's schema (``engine.tool_call_grammar``), so a block
the answer holds is ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` by
construction; what a stream sends is read off that layout as it arrives: a call's index, id
and name once its name is read, then its arguments in pieces, as OpenAI streams them.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from serve_app.api.chat import (
    ChatCompletionRequest,
    FunctionDelta,
    ResponseFunction,
    ResponseToolCall,
    ToolCallDelta,
)
from serve_app.engine.protocol import ToolCallFormat
from serve_app.engine.tool_call_grammar import (
    ARGUMENTS_START,
    BODY_END,
    CLOSE_MARKER,
    NAME_START,
    OPEN_MARKER,
)
from serve_app.errors import InvalidRequestError
from serve_app.prompts.chat_encoding import spells_control_token


def tool_format(body: ChatCompletionRequest, tokenizer: Any) -> ToolCallFormat | None:
    """What the engine decodes the answer's calls under (None: no calls), after checking
    what a template would otherwise render or a client would misread. 400s name the field."""
    check_history(body, tokenizer)
    if not body.tools:
        if body.tool_choice not in (None, "none", "auto"):
            raise InvalidRequestError(
                "tool_choice needs tools to choose from.", param="tool_choice"
            )
        return None
    names = [tool.function.name for tool in body.tools]
    if len(set(names)) != len(names):
        raise InvalidRequestError("Each function in tools needs a name of its own.", param="tools")
    definitions = json.dumps([tool.model_dump(exclude_none=True) for tool in body.tools])
    if spells_control_token(tokenizer, definitions):
        raise InvalidRequestError(
            "tools spell one of the model's control tokens, which a prompt cannot carry.",
            param="tools",
        )
    if body.tool_choice == "none":
        return None
    if body.json_mode is not None:
        raise InvalidRequestError(
            "response_format cannot be combined with tools unless tool_choice is none.",
            param="response_format",
        )
    functions = tuple((tool.function.name, tool.function.parameters) for tool in body.tools)
    choice = body.tool_choice
    if choice is not None and not isinstance(choice, str):
        if choice.function.name not in names:
            raise InvalidRequestError(
                f"tool_choice names {choice.function.name!r}, which is not in tools.",
                param="tool_choice",
            )
        functions = tuple(f for f in functions if f[0] == choice.function.name)
    required = choice not in (None, "auto")
    return ToolCallFormat(functions, required=required, parallel=body.parallel_tool_calls)


def check_history(body: ChatCompletionRequest, tokenizer: Any) -> None:
    """Calls of earlier assistant turns must have arguments that parse and spell no control
    token; each tool result must answer a call made before it."""
    made: set[str] = set()
    for index, message in enumerate(body.messages):
        for call in message.tool_calls or []:
            try:
                json.loads(call.function.arguments)
            except ValueError:
                raise InvalidRequestError(
                    f"messages[{index}]: the arguments of call {call.id!r} are not JSON.",
                    param="messages",
                ) from None
            if spells_control_token(tokenizer, call.function.arguments):
                raise InvalidRequestError(
                    f"messages[{index}]: call {call.id!r} spells a control token.", param="messages"
                )
            made.add(call.id)
        if message.role == "tool" and message.tool_call_id not in made:
            raise InvalidRequestError(
                f"messages[{index}]: a tool message must answer an earlier call by its "
                f"tool_call_id; {message.tool_call_id!r} matches none.",
                param="messages",
            )


def template_tools(body: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The tools as the chat template renders them (None: no tools block)."""
    if not body.calls_tools or body.tools is None:
        return None
    return [tool.model_dump(exclude_none=True) for tool in body.tools]


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def split_calls(text: str) -> tuple[str | None, list[ResponseToolCall]]:
    """An answer's text before its first call (None when empty) and its whole calls. A block
    cut short (the token limit) is left out; a block that does not read as a call (the model
    spelled the marker in plain text) stays text."""
    start = text.find(OPEN_MARKER)
    if start < 0:
        return text, []
    content = text[:start].rstrip("\n")
    calls = []
    for block in text[start:].split(OPEN_MARKER)[1:]:
        call = read_call(block.split(CLOSE_MARKER, 1)[0]) if CLOSE_MARKER in block else None
        if call is not None:
            calls.append(call)
        elif CLOSE_MARKER in block:
            content += OPEN_MARKER + block
    return content or None, calls


def read_call(body: str) -> ResponseToolCall | None:
    """``{"name": ..., "arguments": ...}`` between the markers, or None."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = json.dumps(value.get("arguments", {}), ensure_ascii=False)
    return ResponseToolCall(
        id=new_call_id(), function=ResponseFunction(name=value["name"], arguments=arguments)
    )


@dataclass
class CallStream:
    """Reads a streamed answer's text: what is content, and each call's deltas."""

    buffer: str = ""
    in_call: bool = False
    calls: int = 0
    named: bool = False
    sent: int = 0  # characters of the current call's arguments already sent
    call_id: str = ""
    deltas: list[ToolCallDelta] = field(default_factory=list)

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        """New content and call deltas for the next piece of the answer."""
        self.buffer += text
        content = ""
        self.deltas = []
        while True:
            if not self.in_call:
                if self.calls:  # the newlines between blocks are not content
                    self.buffer = self.buffer.lstrip("\n")
                start = self.buffer.find(OPEN_MARKER)
                if start < 0:
                    keep = _partial_marker(self.buffer, OPEN_MARKER)
                    content += self.buffer[: len(self.buffer) - keep]
                    self.buffer = self.buffer[len(self.buffer) - keep :]
                    return content, self.deltas
                content += self.buffer[:start]
                self.buffer = self.buffer[start + len(OPEN_MARKER) :]
                self.in_call, self.named, self.sent = True, False, 0
                self.call_id = new_call_id()
            end = self.buffer.find(CLOSE_MARKER)
            body = self.buffer if end < 0 else self.buffer[:end]
            self._call_pieces(body, closed=end >= 0)
            if end < 0:
                return content, self.deltas
            self.buffer = self.buffer[end + len(CLOSE_MARKER) :]
            self.in_call = False
            self.calls += 1

    def finish(self) -> str:
        """What is left once the answer ends: text held back because it might have begun a
        marker (``a <tool`` at the very end) is content after all; an unclosed call's rest
        was cut short and is not sent."""
        rest, self.buffer = ("" if self.in_call else self.buffer), ""
        return rest

    def _call_pieces(self, body: str, closed: bool) -> None:
        """The current call's deltas from its body so far (the engine's layout)."""
        if not self.named:
            at = body.find(ARGUMENTS_START)
            if at < 0 or not body.startswith(NAME_START):
                return
            name = body[len(NAME_START) : at]
            function = FunctionDelta(name=name, arguments="")
            first = ToolCallDelta(
                index=self.calls, id=self.call_id, type="function", function=function
            )
            self.deltas.append(first)
            self.named = True
        arguments = body[body.find(ARGUMENTS_START) + len(ARGUMENTS_START) :]
        # The body ends with the call object's brace and a newline, held back until the
        # block closes, and so is what may be the start of the closing marker.
        upto = len(arguments) - len(BODY_END)
        if closed and not arguments.endswith(BODY_END):
            upto = len(arguments)
        elif not closed:
            upto -= _partial_marker(arguments, CLOSE_MARKER)
        if upto > self.sent:
            piece = arguments[self.sent : upto]
            delta = ToolCallDelta(index=self.calls, function=FunctionDelta(arguments=piece))
            self.deltas.append(delta)
            self.sent = upto


def _partial_marker(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` may begin ``marker``."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0
