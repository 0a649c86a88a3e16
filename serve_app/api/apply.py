"""POST /v1/apply/completions: merge an update snippet into original code.

Answers use the chat shapes (``chat.completion`` / ``chat.completion.chunk``), as the public
service does; the content is the whole merged code as
``<|updated_code|>\\n{code}\\n<|/updated_code|>``.
"""

from __future__ import annotations

from pydantic import Field

from serve_app.api.chat import ChatMessage
from serve_app.api.common import MAX_MESSAGES, StopSequences, StreamingRequest, stop_field
from serve_app.engine.protocol import SamplingParams

DEFAULT_APPLY_MAX_TOKENS = 8192


class ApplyCompletionRequest(StreamingRequest):
    messages: list[ChatMessage] = Field(
        min_length=1,
        max_length=MAX_MESSAGES,
        description="The last user message holds the original code and the update snippet "
        "(<|original_code|>/<|update_snippet|> tags, or ORIGINAL CODE / SUGGESTED EDIT "
        "blocks); an assistant prefill is accepted and ignored.",
    )
    max_tokens: int | None = Field(
        default=None,
        ge=1,
        le=8192,
        description="Default 8192, or what the model's context leaves after the prompt.",
    )
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    stop: StopSequences = stop_field("Stop sequences, besides the closing tag")
    diffusing: bool = Field(default=False, description="Accepted; a no-op (autoregressive model).")

    @property
    def content(self) -> str:
        """The last user message: where both client layouts put the code."""
        users = [message for message in self.messages if message.role == "user"]
        return users[-1].text if users else ""

    def output_token_bound(self, max_output_length: int, context_length: int) -> int:
        """Its max_tokens, else the model deployment's default: everything the context leaves."""
        return self.max_tokens or min(max_output_length, context_length)

    def to_sampling_params(self, max_tokens: int, stops: tuple[str, ...]) -> SamplingParams:
        extra = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return SamplingParams(
            max_tokens=self.max_tokens or max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            stop=stops + tuple(stop for stop in extra if stop),
        )
