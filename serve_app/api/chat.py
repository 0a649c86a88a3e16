"""POST /v1/chat/completions: OpenAI-compatible chat with the spec's diffusion extensions.

The extensions (``diffusing``, ``realtime``, ``reasoning_effort``, ``reasoning_summary``) are
accepted for compatibility. The models served here are autoregressive, so they are no-ops:
a stream never resends text (``diffusing``), every request is served as fast as it can be
(``realtime``), and there are no reasoning tokens to spend or summarise.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

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
from serve_app.engine.protocol import SamplingParams

# What a chat request without max_tokens may produce (capped by the model's max output): the
# model deployment applies it, and the router reserves quota for it.
DEFAULT_CHAT_MAX_TOKENS = 1024


class TextPart(RequestModel):
    type: Literal["text"]
    text: str


class ChatMessage(RequestModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""

    def to_template(self) -> dict[str, str]:
        """The plain message a chat template expects (developer is OpenAI's newer system)."""
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": self.text}


def _shallow(value: Any) -> Any:
    if json_depth(value) > MAX_NESTING:
        raise ValueError(f"nests deeper than {MAX_NESTING} levels")
    return value


class JsonSchemaFormat(RequestModel):
    name: str = "response"
    schema_: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None

    _schema_depth = field_validator("schema_")(_shallow)


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
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = Field(
        default=None, description="Only none or auto (tool calling is not supported)."
    )
    # Diffusion extensions (api-notes.md), accepted as documented no-ops.
    diffusing: bool = False
    realtime: bool = False
    reasoning_effort: Literal["instant", "low", "medium", "high"] | None = None
    reasoning_summary: bool = False

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if tools:
            raise ValueError("tool calling is not supported by the models of this service")
        return tools

    @field_validator("tool_choice")
    @classmethod
    def _no_required_tools(cls, choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        if choice not in (None, "none", "auto"):
            raise ValueError(
                "tool calling is not supported by the models of this service: tool_choice can "
                "only be none or auto"
            )
        return choice

    @property
    def json_mode(self) -> Literal["json_object", "json_schema"] | None:
        fmt = self.response_format
        return None if fmt is None or fmt.type == "text" else fmt.type

    def to_sampling_params(self, default_max_tokens: int) -> SamplingParams:
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
        )


class ChatResponseMessage(ResponseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(ResponseModel):
    index: int
    message: ChatResponseMessage
    finish_reason: FinishReason


class ChatCompletion(Completion):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]


class ChatDelta(ResponseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChatChunkChoice(ResponseModel):
    index: int
    delta: ChatDelta
    finish_reason: FinishReason | None = None


class ChatCompletionChunk(CompletionChunk):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChatChunkChoice]
