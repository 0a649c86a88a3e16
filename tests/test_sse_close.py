"""A streamed answer whose client leaves closes the model stream behind it at once.

Closing the chunks' iterator is what cancels the model request (the router's
``_cancel_on_close``) and so bills it 499 and frees its engine slot. Starlette never closes a
streaming body: when the client leaves while the response awaits ``send``, the body was left
suspended until the garbage collector found it, and the model request ran on to its end. Both
ways a client leaves are driven here through the real ASGI response: ``send`` failing (ASGI
2.4, what a server does once the socket is gone) and ``http.disconnect`` arriving while a
``send`` is in progress (ASGI 2.0, Starlette's disconnect listener cancels the send).
"""

from __future__ import annotations

import asyncio
import itertools

import pytest
from starlette.requests import ClientDisconnect

from serve_app.http.sse import open_event_stream


class ModelStream:
    """An endless model stream that records whether it was closed."""

    def __init__(self) -> None:
        self.closed = False
        self.sent = 0

    async def chunks(self):
        try:
            for index in itertools.count():
                self.sent = index
                yield {"index": index}
                await asyncio.sleep(0)
        finally:
            self.closed = True


def scope(spec_version: str) -> dict:
    return {"type": "http", "asgi": {"spec_version": spec_version}, "method": "POST"}


def test_a_send_that_fails_closes_the_model_stream() -> None:
    model = ModelStream()

    async def main() -> None:
        response = await open_event_stream(model.chunks(), lambda c: f"data: {c}\n\n")
        bodies = 0

        async def send(message: dict) -> None:
            nonlocal bodies
            if message["type"] == "http.response.body":
                bodies += 1
                if bodies == 3:
                    raise OSError("the client is gone")

        async def receive() -> dict:
            await asyncio.Event().wait()
            return {}

        with pytest.raises(ClientDisconnect):
            await response(scope("2.4"), receive, send)
        # closed when the response returns, not when the loop or the collector gets to it
        assert model.closed and model.sent < 10

    asyncio.run(asyncio.wait_for(main(), timeout=10))


def test_a_disconnect_during_a_send_closes_the_model_stream() -> None:
    model = ModelStream()

    async def main() -> None:
        response = await open_event_stream(model.chunks(), lambda c: f"data: {c}\n\n")
        sending = asyncio.Event()

        async def send(message: dict) -> None:
            if message["type"] == "http.response.body" and message["body"]:
                sending.set()
                await asyncio.Event().wait()  # a slow client: this send never completes

        async def receive() -> dict:
            await sending.wait()
            return {"type": "http.disconnect"}

        await response(scope("2.0"), receive, send)
        assert model.closed and model.sent < 10

    asyncio.run(asyncio.wait_for(main(), timeout=10))
