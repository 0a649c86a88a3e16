"""The envelope every endpoint's answer shares: one id, creation time and model per answer or
stream, and usage from the engine's counts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from serve_app.api.common import CompletionUsage, new_id, now
from serve_app.engine.protocol import GenerationChunk

T = TypeVar("T")


def chunk_maker(chunk_type: Callable[..., T], id_prefix: str, model: str) -> Callable[..., T]:
    """``chunk(choices, usage=None)`` for one stream: every chunk of a stream carries the
    same id, creation time and model."""
    completion_id, created = new_id(id_prefix), now()

    def chunk(choices: list[Any], usage: CompletionUsage | None = None) -> T:
        return chunk_type(
            id=completion_id, created=created, model=model, choices=choices, usage=usage
        )

    return chunk


def completion(
    response_type: Callable[..., T], id_prefix: str, model: str, choice: Any, usage: CompletionUsage
) -> T:
    """A whole (non-streamed) answer of one choice, with a new id and creation time: the
    envelope every endpoint's completion shares, as ``chunk_maker`` is for its chunks."""
    return response_type(
        id=new_id(id_prefix), created=now(), model=model, choices=[choice], usage=usage
    )


def usage_of(chunk: GenerationChunk) -> CompletionUsage:
    return CompletionUsage.from_counts(
        chunk.prompt_tokens, chunk.completion_tokens, chunk.cached_tokens
    )
