"""ASGI middleware: the body-size limit and the request id."""

from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

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
