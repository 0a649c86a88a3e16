"""Abuse suite, billing and isolation: the bounds that hold below HTTP (issue 15, finding 3
and the store's clock; the HTTP half is tests/test_abuse_billing.py).

- a reservation is checked and taken in one transaction, settles to the count, and is
  refunded at most once; concurrent requests per account are capped;
- rate windows follow the store's clock, never a replica's;
- the deadline counts from the router: a request past it is refused unbilled.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from serve_app.auth.authorizer import AuthConfig, Authorizer
from serve_app.auth.records import Usage
from serve_app.auth.store import open_store
from serve_app.errors import RateLimitError, UpstreamTimeoutError, UpstreamUnavailableError
from serve_app.serving.billing import BilledCall, RequestContext, UsageRecorder
from tests.fixtures.auth import FakeClock, new_account


def test_concurrent_requests_per_account_are_capped(tmp_path: Path):
    store = open_store(tmp_path / "auth.sqlite3")
    key, _ = new_account(str(tmp_path / "auth.sqlite3"), "busy")
    service = Authorizer(store, AuthConfig({"m"}, max_concurrent=2))
    first = service.authorize(key, "m", "fim", estimated_tokens=10)
    service.authorize(key, "m", "fim", estimated_tokens=10)
    with pytest.raises(RateLimitError) as caught:
        service.authorize(key, "m", "fim", estimated_tokens=10)
    assert caught.value.headers["Retry-After"] == "1"
    service.record_usage(first, Usage("m", "fim", 3, 4, 200))  # settling frees the slot
    service.authorize(key, "m", "fim", estimated_tokens=10)


def test_reservations_settle_to_the_actual_count_and_refunds_are_idempotent(tmp_path: Path):
    db = str(tmp_path / "auth.sqlite3")
    key, account = new_account(db, "settle", quota_tokens=1000, tpm=10_000)
    store = open_store(db)
    service = Authorizer(store, AuthConfig({"m"}))
    grant = service.authorize(key, "m", "fim", estimated_tokens=600)
    assert store.get_account(account).tokens_used_at(store.now()) == 600  # reserved up front
    service.record_usage(grant, Usage("m", "fim", 50, 20, 200))
    service.release(grant)  # after settlement: a no-op, never a second refund
    assert store.get_account(account).tokens_used_at(store.now()) == 70
    other = service.authorize(key, "m", "fim", estimated_tokens=900)
    service.release(other)
    service.release(other)
    assert store.get_account(account).tokens_used_at(store.now()) == 70


def test_rate_windows_follow_the_store_clock_not_the_replicas(tmp_path: Path):
    """Replicas read time from the store, inside its transaction: a replica cannot slide a
    window forward with its own clock, and the store's clock alone reopens it."""
    db = str(tmp_path / "auth.sqlite3")
    key, _ = new_account(db, "clocked", rpm=1)
    clock = FakeClock(1_900_000_000.0)  # years away from this machine's wall clock
    first = Authorizer(open_store(db, clock=clock), AuthConfig({"m"}))
    second = Authorizer(open_store(db, clock=clock), AuthConfig({"m"}))
    first.authorize(key, "m", "fim")
    with pytest.raises(RateLimitError):
        second.authorize(key, "m", "fim")
    clock.now += 65
    second.authorize(key, "m", "fim")


def test_the_deadline_counts_from_the_router_and_a_request_past_it_is_refused_unbilled():
    """Time queued for a replica counts (a replica starting after a node was lost): a request
    whose deadline passed before it reached one is a 503 with no work and no ledger row (the
    router has given up on it: an answer would be billed and never delivered); one with 0.3 s
    left is cut at 0.3 s, not at the recorder's own 30 s, and billed as a 504."""
    rows: list[int] = []
    ran: list[str] = []

    async def write(context, input_tokens, output_tokens, status) -> None:
        rows.append(status)

    async def work(call: BilledCall) -> None:
        ran.append("work")
        await asyncio.sleep(10)

    async def chunks(call: BilledCall):
        ran.append("stream")
        yield "chunk"

    recorder = UsageRecorder(write, timeout_s=30)

    def context(seconds_left: float) -> RequestContext:
        deadline = time.time() + seconds_left
        return RequestContext(
            grant=None, model="m", endpoint="fim", cache_salt="a", deadline=deadline
        )

    async def first_chunk(ctx: RequestContext) -> str:
        return await anext(recorder.stream(ctx, chunks))

    for late in (lambda: recorder.run(context(-1), work), lambda: first_chunk(context(-1))):
        with pytest.raises(UpstreamUnavailableError) as caught:
            asyncio.run(late())
        assert int(caught.value.headers["Retry-After"]) >= 1
    assert ran == [] and rows == []

    started = time.monotonic()
    with pytest.raises(UpstreamTimeoutError):
        asyncio.run(recorder.run(context(0.3), work))
    assert time.monotonic() - started < 5 and ran == ["work"] and rows == [504]
