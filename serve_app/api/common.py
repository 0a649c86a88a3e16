"""Wire models shared by every endpoint: base classes, usage and the error body."""

from __future__ import annotations

import functools
import time
import types
import typing
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# JSON text values the contract allows wherever a question carries free-form content.
JsonText = str | dict[str, Any] | list[Any]

# How deep free-form JSON in a request may nest (api-notes.md: state/instructions at most 64).
# Deeper values are refused at validation: rendering them is a denial-of-service vector, and
# handing them to a model deployment fails in pickle (excessively deep recursion) as a 500.
MAX_NESTING = 64

# How many values a request may carry, checked as it is validated on the router's one event
# loop, where every other request waits: the body's byte limit alone let a list of millions of
# zeros or empty chat messages hold it for tens of seconds (and be refused, unbilled, later;
# docs/security.md).
# Real requests are far below: a decision's text is at most a few hundred KiB, and a chat that
# fits a 32k-token context has a few thousand messages at most.
MAX_JSON_VALUES = 262_144  # in one free-form field (state, criteria, tool call history, ...)
MAX_MESSAGES = 10_000

# Stop sequences are matched against every generated chunk and held back as prefixes, so their
# count and length bound per-token work (one very long stop cost seconds and hundreds of MB).
MAX_STOP_SEQUENCES = 16
MAX_STOP_CHARS = 256
StopSequence = Annotated[str, Field(max_length=MAX_STOP_CHARS)]
StopSequences = (
    StopSequence | Annotated[list[StopSequence], Field(max_length=MAX_STOP_SEQUENCES)] | None
)


def stop_field(lead: str = "Stop sequences") -> Any:
    """The ``stop`` field of a generating request (``StopSequences``), bounds documented."""
    bounds = f"at most {MAX_STOP_SEQUENCES} sequences of at most {MAX_STOP_CHARS} characters"
    return Field(default=None, description=f"{lead}: {bounds}.")


class RequestModel(BaseModel):
    """Base of request bodies: unknown fields are ignored, as OpenAI-style clients send extras.

    Every string must be encodable as UTF-8: JSON can spell a lone surrogate (``"\\ud800"``),
    which no tokenizer or response can carry (it was a 500). Nested request models check
    their own fields, so each string is looked at once.
    """

    model_config = ConfigDict(extra="ignore")

    def output_token_bound(self, max_output_length: int, context_length: int) -> int:
        """The most output tokens this request may make on a model with these limits: what
        admission reserves for its answer. 0: it generates none (a decision scores)."""
        return 0

    @model_validator(mode="before")
    @classmethod
    def _null_means_left_out(cls, data: Any) -> Any:
        """OpenAI's API reads ``null`` on an optional field as the field left out (the
        ``openai`` SDK sends null for an argument passed as None): such a field takes its
        default. Fields where null means something of its own keep it."""
        if not isinstance(data, dict):
            return data
        refuse_null = _fields_refusing_null(cls)
        return {k: v for k, v in data.items() if v is not None or k not in refuse_null}

    @model_validator(mode="after")
    def _encodable_text(self) -> RequestModel:
        for name in type(self).model_fields:
            try:
                encodable = _encodable(getattr(self, name))
            except ValueError as e:
                raise ValueError(f"{name} {e}") from None
            if not encodable:
                raise ValueError(
                    f"{name} contains text that is not valid Unicode (a lone surrogate such as "
                    "\\ud800); send UTF-8 text"
                )
        return self


@functools.cache
def _fields_refusing_null(model: type[BaseModel]) -> frozenset[str]:
    """The wire names of ``model``'s optional fields whose type does not admit None."""
    return frozenset(
        field.alias or name
        for name, field in model.model_fields.items()
        if not field.is_required() and not _admits_none(field.annotation)
    )


def _admits_none(annotation: Any) -> bool:
    if annotation is Any or annotation is None or annotation is type(None):
        return True
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        return _admits_none(args[0])
    if origin is Literal:
        return None in args
    if origin is typing.Union or origin is types.UnionType:
        return any(_admits_none(arg) for arg in args)
    return False


def _encodable(value: Any) -> bool:
    """Whether every string in ``value`` (not inside a nested model) encodes as UTF-8.
    Raises ``ValueError`` past ``MAX_JSON_VALUES`` values."""
    stack, seen = [value], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > MAX_JSON_VALUES:
            raise ValueError(f"holds more than {MAX_JSON_VALUES} JSON values")
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return False
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)
    return True


class ResponseModel(BaseModel):
    """Base of response bodies: exactly the listed fields, nothing else."""

    model_config = ConfigDict(extra="forbid")


class CompletionUsage(ResponseModel):
    prompt_tokens: int = Field(ge=0)
    completion_tokens: int = Field(ge=0)
    total_tokens: int = Field(ge=0)
    reasoning_tokens: int = Field(default=0, ge=0)
    cached_input_tokens: int = Field(default=0, ge=0)

    @classmethod
    def from_counts(cls, prompt: int, completion: int, cached: int = 0) -> CompletionUsage:
        return cls(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            cached_input_tokens=cached,
        )

    @property
    def token_counts(self) -> tuple[int, int]:
        """(input, output) tokens: what every usage shape reports for the token metric."""
        return self.prompt_tokens, self.completion_tokens


# Why a choice ended: its stop (or the end of the model's answer), or its token budget.
FinishReason = Literal["stop", "length"]


class CompletionEnvelope(ResponseModel):
    """What every completion and stream chunk carries, in this order; a subclass narrows
    ``object`` to its literal and ``choices`` to its choice type."""

    id: str
    object: str
    created: int
    model: str
    choices: list[Any]


class Completion(CompletionEnvelope):
    """A whole answer: its usage is always there."""

    usage: CompletionUsage


class CompletionChunk(CompletionEnvelope):
    """One SSE event; the usage chunk has no choices (``stream_options.include_usage``)."""

    usage: CompletionUsage | None = None


class StreamOptions(RequestModel):
    include_usage: bool = False


class StreamingRequest(RequestModel):
    """The fields every generating endpoint that streams (chat, FIM, apply) defines alike:
    the model, the sampling knobs with the same bounds and defaults, and streaming."""

    model: str = Field(min_length=1)
    top_p: float = Field(default=1.0, ge=0.0, le=1.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    stream: bool = False
    stream_options: StreamOptions | None = None

    @property
    def include_usage(self) -> bool:
        """Whether the stream sends its usage chunk to the client."""
        return bool(self.stream_options and self.stream_options.include_usage)


class ErrorInfo(ResponseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(ResponseModel):
    error: ErrorInfo


class ValidationErrorItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str
    input: Any = None
    ctx: dict[str, Any] | None = None


class HTTPValidationError(BaseModel):
    detail: list[ValidationErrorItem]


def json_depth(value: Any, limit: int = MAX_NESTING + 1) -> int:
    """Nesting depth of a JSON value, counted iteratively (no recursion limit to hit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, depth)
            if depth > limit:
                return depth
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    return deepest


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())
