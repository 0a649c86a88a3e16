"""ASGI middleware: the body-size limit and the request id."""

from __future__ import annotations

import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app import metrics
from serve_app.errors import RequestTooLargeError
from serve_app.http.errors import error_response


class BodySizeLimit:
    """Answer 413 for bodies over ``max_bytes`` without reading (let alone parsing) them.

    A declared Content-Length over the limit is refused before any byte is read; a chunked
    body is counted as it arrives and refused as soon as it passes the limit.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        await self.app(scope, self._counting(receive), send)

    def _counting(self, receive: Receive) -> Receive:
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                raise self._error()
            return message

        return counted

    def _error(self) -> RequestTooLargeError:
        return RequestTooLargeError(
            f"The request body exceeds the limit of {self.max_bytes} bytes."
        )

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        await error_response(self._error())(scope, receive, send)


class RequestId:
    """Give every answer an ``x-request-id`` (the client's own when it sent one)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        request_id = given[:128] or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode("latin-1")))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_id)


class RequestMetrics:
    """Count every answer (auth failures and validation errors included) and time it.

    The endpoint label is the route's path, or ``other`` for unknown paths, so a scan of random
    URLs cannot blow up the metric's label set. The model is what the route recorded in
    ``request.state.model`` once it read the body (``-`` before that).
    """

    def __init__(self, app: ASGIApp, paths: frozenset[str]) -> None:
        self.app = app
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500
        scope.setdefault("state", {})  # shared with the route, which records the model here

        async def send_and_watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_watch)
        finally:
            endpoint = scope["path"] if scope["path"] in self.paths else "other"
            model = str(scope.get("state", {}).get("model", "-"))
            tags = {"endpoint": endpoint, "model": model, "status": str(status)}
            metrics.requests().inc(tags=tags)
            elapsed_ms = (time.perf_counter() - start) * 1000
            metrics.request_latency().observe(elapsed_ms, tags={"endpoint": endpoint})
