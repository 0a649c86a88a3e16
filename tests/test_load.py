"""A bounded load test on the real graph: every answer is 200, 429 or 503 in the contract shape.

``LOAD_REQUESTS`` requests (default 500) at concurrency ``LOAD_CONCURRENCY`` (32) over one
shared aiohttp session (httpx's async client costs ~5 ms CPU per request on this box and
would be the bottleneck), mixing every endpoint, JSON and streamed, with ``max_tokens`` <= 4.
No request may outlive ``REQUEST_TIMEOUT_S`` and the whole run ``RUN_TIMEOUT_S``; afterwards
the service must answer a normal request.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import time
from collections import Counter

import aiohttp
import pytest

from serve_app.api.common import ErrorResponse
from tests.fixtures.edit import EXAMPLE_EDIT_CONTENT
from tests.graph import MODEL, auth

pytestmark = pytest.mark.ray

LOAD_REQUESTS = int(os.environ.get("LOAD_REQUESTS", "500"))
LOAD_CONCURRENCY = int(os.environ.get("LOAD_CONCURRENCY", "32"))
REQUEST_TIMEOUT_S = 30
RUN_TIMEOUT_S = 120
ALLOWED = {200, 429, 503}
OVERLOAD_CODES = {429: "rate_limit_reached", 503: "service_unavailable"}

CHAT = [{"role": "user", "content": "Say hi."}]
# (name, method, path, body, streamed); cycled through, so every kind gets its share.
MIX = [
    ("fim", "POST", "/v1/fim/completions", {"prompt": "def f(x):\n", "max_tokens": 4}, False),
    (
        "fim-stream",
        "POST",
        "/v1/fim/completions",
        {
            "prompt": "def add(a, b):\n",
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        True,
    ),
    ("chat", "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 4}, False),
    (
        "chat-stream",
        "POST",
        "/v1/chat/completions",
        {"messages": CHAT, "max_tokens": 4, "stream": True},
        True,
    ),
    (
        "edit",
        "POST",
        "/v1/edit/completions",
        {"messages": [{"role": "user", "content": EXAMPLE_EDIT_CONTENT}], "max_tokens": 4},
        False,
    ),
    (
        "decisions",
        "POST",
        "/v1/decisions",
        {
            "state": {"ticket": "Login fails after deploy"},
            "questions": {
                "bug": {"type": "noul"},
                "team": {"type": "choice", "criteria": {"backend": None, "frontend": None}},
            },
        },
        False,
    ),
    ("models", "GET", "/v1/models", None, False),
    ("fim-models", "GET", "/v1/fim/completions/models", None, False),
]
EXPECTED_OBJECT = {
    "fim": "text_completion",
    "chat": "chat.completion",
    "edit": "edit.completion",
}


def check_answer(kind: str, status: int, content_type: str, text: str) -> None:
    """One answer against the contract; raises AssertionError naming what is wrong."""
    assert status in ALLOWED, (kind, status, text[:300])
    assert "Traceback" not in text, (kind, text[:300])
    if status != 200:
        error = ErrorResponse.model_validate_json(text).error
        assert error.code == OVERLOAD_CODES[status], (kind, status, text[:300])
        return
    if kind.endswith("-stream"):
        assert content_type.startswith("text/event-stream"), (kind, content_type)
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", (kind, text[-300:])
        chunks = [json.loads(event) for event in events[:-1]]
        assert chunks and all("error" not in chunk for chunk in chunks), (kind, text[-300:])
        return
    body = json.loads(text)
    if kind in EXPECTED_OBJECT:
        assert body["object"] == EXPECTED_OBJECT[kind], (kind, text[:300])
        assert body["usage"]["completion_tokens"] <= 4, (kind, body["usage"])
    elif kind == "decisions":
        assert set(body["answers"]) == {"bug", "team"}, text[:300]
    else:
        assert body["data"][0]["id"] == MODEL, text[:300]


async def run_load(url: str) -> tuple[Counter, Counter, list[float], list[str]]:
    statuses: Counter[int] = Counter()
    kinds: Counter[str] = Counter()
    latencies: list[float] = []
    failures: list[str] = []
    semaphore = asyncio.Semaphore(LOAD_CONCURRENCY)
    connector = aiohttp.TCPConnector(limit=LOAD_CONCURRENCY)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(index: int) -> None:
            kind, method, path, body, _ = MIX[index % len(MIX)]
            payload = None if body is None else {"model": MODEL, **body}
            async with semaphore:
                started = time.monotonic()
                try:
                    async with session.request(
                        method, url + path, json=payload, headers=auth()
                    ) as response:
                        text = await response.text()
                        status, content_type = response.status, response.content_type
                except TimeoutError:
                    failures.append(f"{kind}: no answer within {REQUEST_TIMEOUT_S}s")
                    return
                except aiohttp.ClientError as exc:
                    failures.append(f"{kind}: {exc!r}")
                    return
                latencies.append(time.monotonic() - started)
            statuses[status] += 1
            kinds[kind] += 1
            try:
                check_answer(kind, status, content_type, text)
            except (AssertionError, ValueError, KeyError) as exc:
                failures.append(f"{kind}: {exc!r}"[:500])

        await asyncio.gather(*(one(index) for index in range(LOAD_REQUESTS)))
    return statuses, kinds, latencies, failures


def test_mixed_load_gets_only_contract_answers_and_the_service_stays_up(graph):
    url = graph["url"]
    started = time.monotonic()
    statuses, kinds, latencies, failures = asyncio.run(
        asyncio.wait_for(run_load(url), RUN_TIMEOUT_S)
    )
    wall = time.monotonic() - started
    latencies.sort()
    print(
        f"\nload: {LOAD_REQUESTS} requests at concurrency {LOAD_CONCURRENCY} in {wall:.1f}s "
        f"({LOAD_REQUESTS / wall:.1f} req/s); statuses {dict(statuses)}; "
        f"latency p50 {statistics.median(latencies):.2f}s "
        f"p95 {latencies[int(0.95 * (len(latencies) - 1))]:.2f}s max {latencies[-1]:.2f}s; "
        f"per kind {dict(kinds)}"
    )
    assert not failures, failures[:10]
    assert sum(statuses.values()) == LOAD_REQUESTS
    assert statuses[200] > 0

    # afterwards: a normal request is served normally
    async def normal() -> tuple[int, str]:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
            session.post(
                url + "/v1/fim/completions",
                json={"model": MODEL, "prompt": "def f(x):\n", "max_tokens": 4},
                headers=auth(),
            ) as response,
        ):
            return response.status, await response.text()

    status, text = asyncio.run(normal())
    assert status == 200, text
    assert json.loads(text)["object"] == "text_completion"
