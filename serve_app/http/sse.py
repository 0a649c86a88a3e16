"""Server-sent events: peek first, then stream, then ``[DONE]``.

The first item is awaited before the HTTP status is sent, so an error that happens before any
output (context too long, model unavailable) still gets its real status and JSON body. An error
after that point can only travel inside the stream: it becomes one ``error`` event and the
stream ends (llama.cpp's server does the same).

However the response ends, the chunks' iterator is closed before the response returns: that
is what cancels the model request behind it. Starlette never closes a streaming body itself;
when the client leaves while the response awaits ``send``, the body generator is left
suspended at its ``yield`` until the garbage collector finds it, and the engine went on
writing the whole answer meanwhile, unbilled until it ended (docs/security.md).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from serve_app.http.errors import as_service_error, error_body

logger = logging.getLogger(__name__)

DONE = "data: [DONE]\n\n"


def sse_event(payload: BaseModel | dict[str, Any]) -> str:
    if isinstance(payload, BaseModel):
        data = payload.model_dump_json(exclude_none=False)
    else:
        data = json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"


async def open_event_stream(
    chunks: AsyncIterator[Any],
    render: Callable[[Any], str | None],
    on_finish: Callable[[Any | None], Awaitable[None]] | None = None,
    headers: dict[str, str] | None = None,
    first_within_s: float | None = None,
) -> StreamingResponse:
    """Await the first chunk (errors raise here), then stream the rest as SSE.

    ``render`` turns a chunk into an event string, or None to skip it (the internal usage chunk
    when the client did not ask for usage). ``on_finish`` gets the last chunk seen. No first
    chunk within ``first_within_s`` raises ``TimeoutError`` (the wait for it is cancelled).
    """
    first = await within(anext(chunks), first_within_s)

    async def events() -> AsyncIterator[str]:
        last = first
        try:
            if (event := render(first)) is not None:
                yield event
            async for chunk in chunks:
                last = chunk
                if (event := render(chunk)) is not None:
                    yield event
        except Exception as exc:  # mid-stream: the status line is already sent
            error = as_service_error(exc)
            logger.warning("stream failed after the first chunk: %s", type(exc).__name__)
            yield sse_event(error_body(error))
            last = None
        finally:
            await _close(chunks)
            if on_finish is not None:
                await _quietly(on_finish(last))
        yield DONE

    return _ClosingStreamingResponse(
        events(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})},
    )


class _ClosingStreamingResponse(StreamingResponse):
    """A streaming response that closes its body generator when it ends, sent whole or not."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await _close(self.body_iterator)


async def _close(iterator: Any) -> None:
    """Close an async generator now (its ``finally`` runs here, not at garbage collection)."""
    aclose = getattr(iterator, "aclose", None)
    if aclose is not None:
        await aclose()


async def _quietly(awaitable: Awaitable[None]) -> None:
    """Run end-of-stream bookkeeping without letting it break the stream's shutdown."""
    try:
        await awaitable
    except BaseException:  # includes CancelledError when the client has gone
        logger.debug("end-of-stream hook did not complete", exc_info=True)


async def within(awaitable: Awaitable[Any], seconds: float | None) -> Any:
    """``awaitable``'s result, or ``TimeoutError`` after ``seconds`` (None: no limit), the
    awaitable then cancelled. Unlike ``asyncio.wait_for``, a timeout is a ``TimeoutError`` even
    where the awaitable answers its cancellation with an error of its own: a Serve handle's
    response raises ``RequestCancelledError``, which ``wait_for`` passed on instead."""
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:
        _abandon(task)
        raise
    if not done:
        _abandon(task)
        raise TimeoutError
    return task.result()


def _abandon(task: asyncio.Future) -> None:
    """Cancel ``task``; whatever it ends with is read, so asyncio logs nothing about it."""
    task.cancel()
    task.add_done_callback(lambda done: done.cancelled() or done.exception())
