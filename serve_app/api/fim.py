"""POST /v1/fim/completions: fill-in-the-middle, JSON or SSE (api-spec.md 4.3, api-notes.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from serve_app.api.common import (
    Completion,
    CompletionChunk,
    FinishReason,
    ResponseModel,
    StopSequences,
    StreamingRequest,
    stop_field,
)
from serve_app.engine.protocol import SamplingParams

DEFAULT_FIM_STOP = ("\n\n", "\n \n")


class FimCompletionRequest(StreamingRequest):
    prompt: str
    suffix: str | None = None
    max_tokens: int = Field(default=512, ge=1, le=8192)
    temperature: float | None = Field(
        default=None, ge=0.0, le=2.0, description="Defaults to the model's default (0 = greedy)."
    )
    top_k: int = Field(default=-1, description="-1 (no cutoff) or 1..1000.")
    presence_penalty: float = Field(default=1.5, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    stop: StopSequences = stop_field('Stop sequences; default ["\\n\\n", "\\n \\n"]')
    seed: int | None = None
    # OpenAI legacy-completion fields that clients of POST /v1/completions send: accepted at
    # the values this service honours (one choice, no echo, no logprobs), refused otherwise.
    n: int = Field(default=1, description="Only 1 is supported.")
    best_of: int | None = Field(default=None, description="Only 1 (or omitted) is supported.")
    echo: bool = Field(default=False, description="Only false is supported.")
    logprobs: int | None = Field(default=None, description="Not supported: omit it or send null.")
    user: str | None = Field(default=None, description="Accepted and ignored.")

    @field_validator("n", "best_of")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        if value is not None and value != 1:
            raise ValueError("only one choice per request is supported; send 1 or omit it")
        return value

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, echo: bool) -> bool:
        if echo:
            raise ValueError("echoing the prompt is not supported; send false or omit it")
        return echo

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, logprobs: int | None) -> int | None:
        if logprobs is not None:
            raise ValueError("log probabilities are not supported; send null or omit it")
        return logprobs

    @field_validator("top_k")
    @classmethod
    def _top_k_range(cls, top_k: int) -> int:
        if top_k != -1 and not 1 <= top_k <= 1000:
            raise ValueError("top_k must be -1 (no cutoff) or between 1 and 1000")
        return top_k

    @property
    def stop_sequences(self) -> tuple[str, ...]:
        if self.stop is None:
            return DEFAULT_FIM_STOP
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return tuple(stop for stop in stops if stop)

    def output_token_bound(self, max_output_length: int, context_length: int) -> int:
        return self.max_tokens

    def to_sampling_params(self, default_temperature: float = 0.0) -> SamplingParams:
        temperature = default_temperature if self.temperature is None else self.temperature
        return SamplingParams(
            max_tokens=self.max_tokens,
            temperature=temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            frequency_penalty=self.frequency_penalty,
            presence_penalty=self.presence_penalty,
            repetition_penalty=self.repetition_penalty,
            stop=self.stop_sequences,
            seed=self.seed,
        )


class FimChoice(ResponseModel):
    index: int
    text: str
    finish_reason: FinishReason


class FimCompletion(Completion):
    object: Literal["text_completion"] = "text_completion"
    choices: list[FimChoice]


class FimChunkChoice(FimChoice):
    """A streamed choice: the same text piece, its finish reason null until the last."""

    finish_reason: FinishReason | None = None


class FimCompletionChunk(CompletionChunk):
    object: Literal["text_completion"] = "text_completion"
    choices: list[FimChunkChoice]
