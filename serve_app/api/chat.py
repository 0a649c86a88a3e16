"""POST /v1/chat/completions: OpenAI-compatible chat with the spec's diffusion extensions.

The extensions (``diffusing``, ``realtime``, ``reasoning_effort``, ``reasoning_summary``) are
accepted for compatibility. The models served here are autoregressive, so they are no-ops:
a stream never resends text (``diffusing``), every request is served as fast as it can be
(``realtime``), and there are no reasoning tokens to spend or summarise.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field, field_validator, model_serializer, model_validator

from serve_app.api.common import (
    MAX_MESSAGES,
    MAX_NESTING,
    Completion,
    CompletionChunk,
    FinishReason,
    RequestModel,
    ResponseModel,
    StopSequences,
    StreamingRequest,
    json_depth,
    stop_field,
)
from serve_app.engine.protocol import SamplingParams, ToolCallFormat

# What a chat request without max_tokens may produce (capped by the model's max output): the
# model deployment applies it, and the router reserves quota for it.
DEFAULT_CHAT_MAX_TOKENS = 1024


class TextPart(RequestModel):
    type: Literal["text"]
    text: str


# OpenAI's rule for function names; no quote or marker can hide in one.
FUNCTION_NAME = r"^[A-Za-z0-9_-]{1,64}$"
MAX_TOOLS = 128


class FunctionCall(RequestModel):
    name: str = Field(pattern=FUNCTION_NAME)
    arguments: str  # JSON text, as OpenAI sends and returns it


class ToolCall(RequestModel):
    """A call an earlier assistant turn made, as the client sends it back."""

    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(RequestModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=MAX_TOOLS)

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""

    def to_template(self) -> dict[str, Any]:
        """The plain message a chat template expects (developer is OpenAI's newer system); an
        assistant's calls with their arguments as objects, as templates render them (the
        service checks they parse first: ``serving.tool_calls``)."""
        role = "system" if self.role == "developer" else self.role
        message: dict[str, Any] = {"role": role, "content": self.text}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {
                        "name": call.function.name,
                        "arguments": json.loads(call.function.arguments),
                    },
                }
                for call in self.tool_calls
            ]
        return message


def _shallow(value: Any) -> Any:
    if json_depth(value) > MAX_NESTING:
        raise ValueError(f"nests deeper than {MAX_NESTING} levels")
    return value


class JsonSchemaFormat(RequestModel):
    name: str = "response"
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None

    _schema_depth = field_validator("schema_")(_shallow)


class FunctionDefinition(RequestModel):
    name: str = Field(pattern=FUNCTION_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    _schema_depth = field_validator("parameters")(_shallow)


class ToolDefinition(RequestModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(RequestModel):
    name: str


class NamedToolChoice(RequestModel):
    type: Literal["function"]
    function: NamedFunction


class ResponseFormat(RequestModel):
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> ResponseFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("response_format.json_schema is required when type is json_schema")
        return self


class ChatCompletionRequest(StreamingRequest):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int | None = Field(default=None, ge=1, le=8192)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=8192)
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    stop: StopSequences = stop_field()
    seed: int | None = None
    n: Literal[1] = Field(default=1, description="Only one choice per request is supported.")
    response_format: ResponseFormat | None = None
    tools: list[ToolDefinition] | None = Field(default=None, max_length=MAX_TOOLS)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        default=None,
        description="none, auto (the default with tools), required, or a named function.",
    )
    parallel_tool_calls: bool = True
    # Diffusion extensions (api-notes.md), accepted as documented no-ops.
    diffusing: bool = False
    realtime: bool = False
    reasoning_effort: Literal["instant", "low", "medium", "high"] | None = None
    reasoning_summary: bool = False

    @property
    def calls_tools(self) -> bool:
        """Whether the answer may hold tool calls (tools given, tool_choice not none)."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def json_mode(self) -> Literal["json_object", "json_schema"] | None:
        fmt = self.response_format
        return None if fmt is None or fmt.type == "text" else fmt.type

    def output_token_bound(self, max_output_length: int, context_length: int) -> int:
        """Its max_tokens, else the default the model deployment applies."""
        asked = self.max_completion_tokens or self.max_tokens
        return asked or min(DEFAULT_CHAT_MAX_TOKENS, max_output_length)

    def to_sampling_params(
        self, default_max_tokens: int, tool_calls: ToolCallFormat | None = None
    ) -> SamplingParams:
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return SamplingParams(
            max_tokens=self.max_completion_tokens or self.max_tokens or default_max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            stop=tuple(stop for stop in stops if stop),
            seed=self.seed,
            response_format=(
                self.response_format.model_dump(by_alias=True) if self.json_mode else None
            ),
            tool_calls=tool_calls,
        )


class ResponseFunction(ResponseModel):
    name: str
    arguments: str


class ResponseToolCall(ResponseModel):
    id: str
    type: Literal["function"] = "function"
    function: ResponseFunction


class ChatResponseMessage(ResponseModel):
    """``content`` is null when the answer is only tool calls, as OpenAI sends it;
    ``tool_calls`` is left out when there are none."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ResponseToolCall] | None = None

    @model_serializer(mode="wrap")
    def _calls_only_when_made(self, handler: Any) -> dict[str, Any]:
        return _without_none(handler(self), "tool_calls")


# A chat answer ends as any completion's, or with the calls it made.
ChatFinishReason = FinishReason | Literal["tool_calls"]


class ChatChoice(ResponseModel):
    index: int
    message: ChatResponseMessage
    finish_reason: ChatFinishReason


class ChatCompletion(Completion):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]


class FunctionDelta(ResponseModel):
    name: str | None = None
    arguments: str

    @model_serializer(mode="wrap")
    def _name_only_first(self, handler: Any) -> dict[str, Any]:
        return _without_none(handler(self), "name")


class ToolCallDelta(ResponseModel):
    """One call's piece of a stream: its index, id, type and name first (arguments ""),
    then its arguments in pieces, as OpenAI streams them."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta

    @model_serializer(mode="wrap")
    def _id_only_first(self, handler: Any) -> dict[str, Any]:
        return _without_none(handler(self), "id", "type")


class ChatDelta(ResponseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None

    @model_serializer(mode="wrap")
    def _calls_only_when_made(self, handler: Any) -> dict[str, Any]:
        return _without_none(handler(self), "tool_calls")


def _without_none(fields: dict[str, Any], *names: str) -> dict[str, Any]:
    """``fields`` less those of ``names`` that are None (fields OpenAI leaves out, not null)."""
    return {k: v for k, v in fields.items() if k not in names or v is not None}


class ChatChunkChoice(ResponseModel):
    index: int
    delta: ChatDelta
    finish_reason: ChatFinishReason | None = None


class ChatCompletionChunk(CompletionChunk):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
