"""The ledger spool (``serving/spool.py``) on the real SQLite store, held locked the way a
stuck writer or a failover holds it: rows the store cannot take are kept on disk and written
once it is back, once each; a dead replica's rows are adopted by the next one on the machine;
a row cut short by a crash is dropped, the rows before it kept."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from serve_app.auth.authorizer import AuthConfig, Authorizer
from serve_app.auth.keys import generate_key, hash_key, key_hint
from serve_app.auth.sqlite import SQLiteAuthStore
from serve_app.serving import billing
from serve_app.serving.billing import BilledCall, Ledger, RequestContext, UsageMeter, ledger_write
from serve_app.serving.spool import LedgerSpool

MODEL = "m"


class InProcess:
    """A deployment's methods called in this process, as its Serve handle calls them
    (``handle.method.remote(*args)``, awaited)."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.target, name)

        class Remote:
            @staticmethod
            def remote(*args: Any) -> Any:
                return asyncio.to_thread(method, *args)

        return Remote


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict]:
    """A SQLite store with one account, an authorizer on it whose writes give up on a lock
    after 0.1 s, and a way to hold the store locked."""
    monkeypatch.setattr(billing, "SPOOL_FLUSH_S", 0.1)
    monkeypatch.setattr(billing, "WRITE_RETRY_S", 0.01)
    db = str(tmp_path / "auth.sqlite3")
    admin = SQLiteAuthStore(db)
    account = admin.create_account("acme")
    key = generate_key()
    admin.add_key(account.id, hash_key(key), key_hint(key))
    authorizer = Authorizer(SQLiteAuthStore(db, busy_timeout_ms=100), AuthConfig({MODEL}))
    yield {"db": db, "admin": admin, "account": account.id, "key": key, "auth": authorizer}
    admin.close()


def locked(db: str) -> sqlite3.Connection:
    """Another connection holding the store's write lock until it rolls back."""
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    return holder


def call(store: dict, request_id: str, tokens: tuple[int, int]) -> BilledCall:
    grant = store["auth"].authorize(store["key"], MODEL, "fim", sum(tokens))
    context = RequestContext(
        grant=grant, model=MODEL, endpoint="fim", cache_salt="s", request_id=request_id
    )
    return BilledCall(context, UsageMeter(*tokens))


def rows(store: dict) -> list[tuple[str, int, int]]:
    ledger = store["admin"].list_usage(store["account"])
    return sorted((r.request_id, r.input_tokens, r.output_tokens) for r in ledger)


async def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the timeout"
        await asyncio.sleep(0.05)


def test_rows_the_store_cannot_take_are_written_once_it_is_back(store, tmp_path) -> None:
    spool = LedgerSpool(tmp_path / "spool")
    ledger = Ledger(ledger_write(InProcess(store["auth"])), spool)
    calls = [call(store, f"r{i}", (10 + i, 5)) for i in range(3)]

    async def scenario() -> None:
        holder = locked(store["db"])
        try:
            assert all([await ledger.settle(c, 200) for c in calls])  # kept: answers go out
            assert await ledger.settle(calls[0], 200)  # the same request twice (router too)
            assert spool.held() > 0 and rows(store) == []
        finally:
            holder.rollback()
        await eventually(lambda: spool.held() == 0)
        await asyncio.sleep(0.3)  # more flushes: nothing is written twice

    asyncio.run(scenario())
    assert rows(store) == [("r0", 10, 5), ("r1", 11, 5), ("r2", 12, 5)]


def test_a_dead_replicas_rows_are_adopted_by_the_next(store, tmp_path) -> None:
    folder = tmp_path / "spool"
    dead = Ledger(ledger_write(InProcess(store["auth"])), LedgerSpool(folder))

    async def die_with_a_row() -> None:
        holder = locked(store["db"])
        try:
            assert await dead.settle(call(store, "orphan", (7, 3)), 200)
        finally:
            holder.rollback()
        dead._flusher.cancel()  # the replica's process ends before it flushes

    asyncio.run(die_with_a_row())
    dead.spool.close()  # its lock goes with its process
    (orphan,) = folder.glob("*.spool")

    async def next_replica() -> None:
        ledger = Ledger(ledger_write(InProcess(store["auth"])), LedgerSpool(folder))
        ledger.start_flushing()
        await eventually(lambda: not orphan.exists())

    asyncio.run(next_replica())
    assert rows(store) == [("orphan", 7, 3)]


def test_a_living_replicas_spool_is_left_alone(store, tmp_path) -> None:
    folder = tmp_path / "spool"
    living = LedgerSpool(folder)
    living.keep((call(store, "mine", (1, 1)).context, 1, 1, 200))
    other = LedgerSpool(folder)

    async def flush() -> int:
        return await other.flush(ledger_write(InProcess(store["auth"])))

    assert asyncio.run(flush()) == 0 and living.held() > 0 and rows(store) == []


def test_a_row_cut_short_by_a_crash_is_dropped_and_the_rest_written(store, tmp_path) -> None:
    folder = tmp_path / "spool"
    crashed = LedgerSpool(folder)
    crashed.keep((call(store, "whole", (4, 2)).context, 4, 2, 200))
    crashed.keep((call(store, "torn", (9, 9)).context, 9, 9, 200))
    crashed.close()
    size = crashed.path.stat().st_size
    with open(crashed.path, "r+b") as file:
        file.truncate(size - 5)  # the last append never finished

    async def adopt() -> int:
        return await LedgerSpool(folder).flush(ledger_write(InProcess(store["auth"])))

    assert asyncio.run(adopt()) == 1
    assert rows(store) == [("whole", 4, 2)] and not crashed.path.exists()


def test_rows_survive_a_postgres_restart(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same on PostgreSQL, stopped (``pg_ctl stop -m immediate``) and started again:
    the rows of the outage land once it is back, on the store's new connection."""
    from serve_app.auth.store import open_store
    from tests.conftest import ThrowawayPostgres

    monkeypatch.setattr(billing, "SPOOL_FLUSH_S", 0.1)
    monkeypatch.setattr(billing, "WRITE_RETRY_S", 0.01)
    server = ThrowawayPostgres.or_skip()
    try:
        admin = open_store(server.url)
        account = admin.create_account("acme")
        key = generate_key()
        admin.add_key(account.id, hash_key(key), key_hint(key))
        authorizer = Authorizer(open_store(server.url), AuthConfig({MODEL}))
        store = {"admin": admin, "account": account.id, "key": key, "auth": authorizer}
        spool = LedgerSpool(tmp_path / "spool")
        ledger = Ledger(ledger_write(InProcess(authorizer)), spool)
        calls = [call(store, f"pg{i}", (20, i)) for i in range(2)]
        server.stop()

        async def scenario() -> None:
            assert all([await ledger.settle(c, 200) for c in calls])
            assert spool.held() > 0
            server.start()
            await eventually(lambda: spool.held() == 0, timeout=30)

        asyncio.run(scenario())
        admin.close()
        store["admin"] = open_store(server.url)  # the old connection died with the server
        assert rows(store) == [("pg0", 20, 0), ("pg1", 20, 1)]
        store["admin"].close()
    finally:
        server.remove()


# --- a request cancelled as its row is written (the client went away) ------------------------


def test_a_rows_write_is_no_call_of_the_request_that_caused_it(store, tmp_path) -> None:
    """Serve cancels a cancelled request's calls still waiting for a replica: those it finds
    by the request context, a context variable every task copies. The soak lost 2 of 45 rows
    of streams their clients closed that way (bench.soak). A row's write runs outside it."""
    from ray.serve.context import _RequestContext, _serve_request_context

    seen: list[object] = []
    write = ledger_write(InProcess(store["auth"]))

    async def watching(*args: Any) -> None:
        seen.append(_serve_request_context.get())
        await write(*args)

    ledger = Ledger(watching, LedgerSpool(tmp_path / "spool"))

    async def scenario() -> None:
        _serve_request_context.set(_RequestContext(request_id="r", _internal_request_id="i"))
        assert await ledger.settle(call(store, "gone", (4, 2)), 499)

    asyncio.run(scenario())
    assert seen == [None]
    assert rows(store) == [("gone", 4, 2)]


def test_a_write_cancelled_by_someone_else_is_retried(store, tmp_path) -> None:
    """A handle call cancelled from outside raises ``CancelledError`` in the writer: a failed
    write like any other (retried), not the end of the row."""
    write = ledger_write(InProcess(store["auth"]))
    attempts: list[int] = []

    async def cancelled_once(*args: Any) -> None:
        attempts.append(1)
        if len(attempts) == 1:
            raise asyncio.CancelledError
        await write(*args)

    ledger = Ledger(cancelled_once, LedgerSpool(tmp_path / "spool"))
    assert asyncio.run(ledger.settle(call(store, "retried", (3, 1)), 499))
    assert len(attempts) == 2 and rows(store) == [("retried", 3, 1)]


# --- a replica that billed a whole stream, then died before the router got all of it ---------


@pytest.fixture(params=["sqlite", "postgres"])
def either_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict]:
    """An account with a key on SQLite, then on PostgreSQL (a schema of its own)."""
    from serve_app.auth.store import open_store

    if request.param == "sqlite":
        db = str(tmp_path / "auth.sqlite3")
    else:
        from tests.conftest import new_postgres_schema

        db = new_postgres_schema(request.getfixturevalue("postgres_server"))
    admin = open_store(db)
    account = admin.create_account("acme")
    key = generate_key()
    admin.add_key(account.id, hash_key(key), key_hint(key))
    authorizer = Authorizer(open_store(db), AuthConfig({MODEL}))
    yield {"admin": admin, "account": account.id, "key": key, "auth": authorizer}
    admin.close()


def test_the_routers_delivered_row_caps_the_replicas_and_refunds_the_rest(either_store) -> None:
    """Seen killing an EditModel replica under load (bench.soak --kill): it had generated
    and billed 2,000 tokens when it died, 541 of them had reached the client, whose usage
    chunk said 541. The router's row (``delivered``) now cuts the replica's to that, once."""
    from serve_app.auth.records import Usage

    auth, admin = either_store["auth"], either_store["admin"]
    grant = auth.authorize(either_store["key"], MODEL, "chat", 3000)
    auth.record_usage(grant, Usage(MODEL, "chat", 64, 2000, 200, "cut"))
    used_before = admin.get_account(either_store["account"]).tokens_used_at(admin.now())
    delivered = Usage(MODEL, "chat", 64, 541, 503, "cut", delivered=True)
    auth.record_usage(grant, delivered)
    auth.record_usage(grant, delivered)  # sent again (a retry, the spool): no second refund
    auth.record_usage(grant, Usage(MODEL, "chat", 64, 900, 503, "cut", delivered=True))
    auth.record_usage(grant, Usage(MODEL, "chat", 64, 10, 200, "cut"))  # not delivered: dropped
    (row,) = admin.list_usage(either_store["account"])
    assert (row.input_tokens, row.output_tokens, row.status) == (64, 541, 503)
    used = admin.get_account(either_store["account"]).tokens_used_at(admin.now())
    assert used == used_before - (2000 - 541) == 64 + 541


def test_a_delivered_row_first_is_the_row(either_store) -> None:
    """The router's row written before the replica's (a spooled row adopted later): the
    replica's is dropped, as any second row of a request."""
    from serve_app.auth.records import Usage

    auth, admin = either_store["auth"], either_store["admin"]
    grant = auth.authorize(either_store["key"], MODEL, "chat", 3000)
    auth.record_usage(grant, Usage(MODEL, "chat", 64, 541, 503, "first", delivered=True))
    auth.record_usage(grant, Usage(MODEL, "chat", 64, 2000, 200, "first"))
    (row,) = admin.list_usage(either_store["account"])
    assert (row.output_tokens, row.status) == (541, 503)
    assert admin.get_account(either_store["account"]).tokens_used_at(admin.now()) == 64 + 541
