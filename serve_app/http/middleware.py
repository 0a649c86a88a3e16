"""ASGI middleware: authentication from the header, the bounded body and the request id."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app import metrics
from serve_app.errors import RequestTimeoutError, RequestTooLargeError
from serve_app.http.errors import as_service_error, error_response


class Authenticate:
    """Answer 401 (no or unknown key) or 402 (inactive account) from the Authorization header
    alone, before a byte of the body is read, let alone parsed and validated.

    ``authenticate`` is the auth deployment's key check, the same lookup (and short-lived
    cache) as the routes' ``authorize``, which still checks the model and the rate limits once
    the body is known. Only ``paths`` are guarded: /health stays open and unknown paths 404.
    """

    def __init__(
        self,
        app: ASGIApp,
        authenticate: Callable[[str | None], Awaitable[None]],
        paths: frozenset[str],
    ) -> None:
        self.app = app
        self.authenticate = authenticate
        self.paths = paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        try:
            await self.authenticate(bearer_key(scope))
        except Exception as exc:
            error = as_service_error(exc)
            metrics.auth_rejections().inc(tags={"reason": error.code or "unknown"})
            await error_response(error)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def bearer_key(scope: Scope) -> str | None:
    """The key of ``Authorization: Bearer <key>`` (None without one), as HTTPBearer reads it."""
    header = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
    scheme, _, key = header.partition(" ")
    return (key.strip() or None) if scheme.lower() == "bearer" else None


class BoundedBody:
    """Read the whole body before the app sees it: at most ``max_bytes`` (else 413, whether
    the size was declared or the body came chunked) within ``timeout_s`` (else 408), so a slow
    or endless upload cannot hold a request open. The app then reads it from memory.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        try:
            if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
                raise self._too_large()
            first = await asyncio.wait_for(self._read(receive), self.timeout_s)
        except TimeoutError:
            await error_response(RequestTimeoutError())(scope, receive, send)
            return
        except RequestTooLargeError as error:
            await error_response(error)(scope, receive, send)
            return
        await self.app(scope, _replay(first, receive), send)

    async def _read(self, receive: Receive) -> Message:
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return message  # the client went away; the app sees that
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_bytes:
                raise self._too_large()
            chunks.append(chunk)
            if not message.get("more_body", False):
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

    def _too_large(self) -> RequestTooLargeError:
        return RequestTooLargeError(
            f"The request body exceeds the limit of {self.max_bytes} bytes."
        )


def _replay(first: Message, receive: Receive) -> Receive:
    """The body read already, then the client's own messages (a disconnect, later)."""
    pending = [first]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed


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
