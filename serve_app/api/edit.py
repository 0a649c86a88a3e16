"""POST /v1/edit/completions: next-edit rewriting from a tagged prompt (api-spec.md 4.2,
api-notes.md "Edit": sections in any order, the answer fenced)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from serve_app.api.common import (
    MAX_MESSAGES,
    Completion,
    FinishReason,
    RequestModel,
    ResponseModel,
)
from serve_app.engine.protocol import SamplingParams


class InputMessage(RequestModel):
    role: str
    content: Any = None


class EditCompletionRequest(RequestModel):
    model: str = Field(min_length=1)
    messages: list[InputMessage] = Field(
        max_length=MAX_MESSAGES,
        description=(
            "Exactly one user message whose content holds the tagged sections "
            "recently_viewed_code_snippets, edit_diff_history and current_file_content (in any "
            "order; snippets and history may be empty or left out), with code_to_edit and its "
            "one <|cursor|> inside current_file_content."
        ),
    )
    max_tokens: int = Field(default=1024, ge=1, le=8192)
    temperature: float = Field(default=0.2, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, ge=0.0, le=1.0)
    presence_penalty: float = Field(default=1.0, ge=-2.0, le=2.0)
    stream: Literal[False] = Field(default=False, description="Streaming is not supported.")

    @field_validator("messages")
    @classmethod
    def _one_user_message(cls, messages: list[InputMessage]) -> list[InputMessage]:
        if len(messages) != 1:
            raise ValueError(f"messages must contain exactly one message; got {len(messages)}")
        if messages[0].role != "user":
            raise ValueError(f"the message role must be 'user'; got {messages[0].role!r}")
        if not isinstance(messages[0].content, str):
            raise ValueError("the message content must be a string holding the edit prompt tags")
        return messages

    @property
    def content(self) -> str:
        return self.messages[0].content

    def output_token_bound(self, max_output_length: int, context_length: int) -> int:
        return self.max_tokens

    def to_sampling_params(self) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            presence_penalty=self.presence_penalty,
        )


class AssistantMessage(ResponseModel):
    role: Literal["assistant"] = "assistant"
    content: str = Field(
        description=(
            'The rewritten code_to_edit region in a plain fence: "```\\n" + region + '
            '"\\n```" (no language tag, no section tags, no cursor marker). A region the '
            "model leaves alone comes back unchanged."
        )
    )


class EditChoice(ResponseModel):
    index: int
    finish_reason: FinishReason
    message: AssistantMessage


class EditCompletion(Completion):
    id: str = Field(description='Starts with "cmpl-".')
    object: Literal["edit.completion"] = "edit.completion"
    choices: list[EditChoice]
