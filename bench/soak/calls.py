"""What a client of the soak got: one ``Call`` per request, sent and read as the clients
send and read them."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from bench.soak import LEDGER_ENDPOINTS


@dataclass
class Call:
    """One request and what its client got: the status, the error code (a JSON body's, or a
    stream's error event's), the usage it was told (input, output), how many events carried
    text, whether the client closed the stream itself, and a transport failure's name."""

    account: str
    kind: str
    path: str
    stream: bool
    started: float  # time.time()
    seconds: float = 0.0
    status: int = 0
    code: str | None = None
    usage: tuple[int, int] | None = None
    error_event: bool = False
    text_events: int = 0
    cancelled: bool = False
    failure: str | None = None
    retry_after: str | None = None  # a refusal's Retry-After header

    @property
    def endpoint(self) -> str:
        return LEDGER_ENDPOINTS[self.path]

    @property
    def ended(self) -> float:
        return self.started + self.seconds

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error_event and not self.failure

    @property
    def outcome(self) -> str:
        if self.failure:
            return self.failure
        if self.cancelled:
            return "cancelled"
        if self.error_event:
            return f"200+{self.code}"
        return str(self.status) if self.status == 200 else f"{self.status} {self.code}"


def usage_of(usage: dict | None) -> tuple[int, int] | None:
    if not usage:
        return None
    if "input_tokens" in usage:  # decisions
        return usage["input_tokens"], usage["output_tokens"]
    return usage["prompt_tokens"], usage["completion_tokens"]


def chunk_text(chunk: dict) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    return choice.get("text") or (choice.get("delta") or {}).get("content") or ""


def send(
    client: httpx.Client, url: str, key: str, account: str, kind: str, path: str, body: dict,
    cancel: bool = False, on_headers: Callable[[], None] = lambda: None,
) -> Call:  # fmt: skip
    """One request as its client sends it; a stream is read to ``[DONE]``, or closed after
    its first text when ``cancel``. ``on_headers`` is called once a stream's status is in
    (the kill run waits for that, so its kill lands mid-stream)."""
    call = Call(account, kind, path, bool(body.get("stream")), time.time())
    start = time.monotonic()
    headers = {"Authorization": f"Bearer {key}"}
    try:
        if not call.stream:
            response = client.post(url + path, json=body, headers=headers)
            call.status = response.status_code
            if call.status == 200:
                call.usage = usage_of(response.json().get("usage"))
            else:
                call.code = error_code(response.content)
                call.retry_after = response.headers.get("retry-after")
        else:
            with client.stream("POST", url + path, json=body, headers=headers) as response:
                call.status = response.status_code
                on_headers()
                if call.status != 200:
                    call.code = error_code(response.read())
                    call.retry_after = response.headers.get("retry-after")
                else:
                    read_stream(response, call, cancel)
    except (httpx.HTTPError, ValueError) as exc:
        call.failure = type(exc).__name__
    call.seconds = time.monotonic() - start
    return call


def error_code(body: bytes) -> str:
    """The contract error's code; Ray's proxy answers some failures in plain text."""
    try:
        return str((json.loads(body).get("error") or {}).get("code"))
    except (ValueError, AttributeError):
        return f"text: {body[:40].decode(errors='replace')!r}"


def read_stream(response: httpx.Response, call: Call, cancel: bool) -> None:
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        if line[6:] == "[DONE]":
            return
        chunk = json.loads(line[6:])
        if "error" in chunk:
            call.error_event = True
            call.code = chunk["error"].get("code")
        call.usage = usage_of(chunk.get("usage")) or call.usage
        if chunk_text(chunk):
            call.text_events += 1
            if cancel:
                call.cancelled = True
                return  # leaving the `with` closes the connection: the client went away
    call.failure = "no [DONE]"
