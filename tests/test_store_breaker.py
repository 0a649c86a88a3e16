"""The auth store under an outage refuses at once instead of queueing callers on a store that
does not answer (``serve_app.auth.breaker``), and answers again once the store is back. The
real SQLite store, held by another connection's exclusive transaction."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from serve_app.auth.breaker import COOLDOWN_S, StoreUnavailable
from serve_app.auth.sqlite import SQLiteAuthStore

BUSY_MS = 1000  # long beside a refusal's microseconds, on any machine


def held(path: Path) -> sqlite3.Connection:
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    return other


def test_a_locked_store_fails_once_then_refuses_at_once_until_it_is_back(tmp_path: Path) -> None:
    store = SQLiteAuthStore(tmp_path / "auth.sqlite3", busy_timeout_ms=BUSY_MS)
    store.create_account("before")
    other = held(store.path)
    started = time.monotonic()
    with pytest.raises(sqlite3.OperationalError):
        store.create_account("waits")  # the first call waits out busy_timeout
    assert time.monotonic() - started >= BUSY_MS / 1000 * 0.9
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        store.create_account("refused")
    assert time.monotonic() - started < BUSY_MS / 1000 / 2  # it waited on no lock
    other.execute("ROLLBACK")
    other.close()
    time.sleep(COOLDOWN_S)
    store.create_account("after")  # the probe reaches the store and closes the breaker
    store.create_account("again")
    assert {a.name for a in store.list_accounts()} == {"before", "after", "again"}


def test_while_one_call_tries_the_store_the_others_are_refused_at_once(tmp_path: Path) -> None:
    store = SQLiteAuthStore(tmp_path / "auth.sqlite3", busy_timeout_ms=BUSY_MS)
    other = held(store.path)
    with pytest.raises(sqlite3.OperationalError):
        store.create_account("trips")
    time.sleep(COOLDOWN_S)
    probe_failed = threading.Event()

    def probe() -> None:
        try:
            store.create_account("probe")
        except sqlite3.OperationalError:
            probe_failed.set()

    thread = threading.Thread(target=probe)
    thread.start()
    # Reads pass after a cooldown until a write tries the store: the first refused read
    # shows the probe under way (it waits out busy_timeout, the read returns at once).
    deadline = time.monotonic() + BUSY_MS / 1000
    while time.monotonic() < deadline:
        try:
            store.list_accounts()
        except StoreUnavailable:
            break
    else:
        pytest.fail("no write tried the store")
    with pytest.raises(StoreUnavailable):
        store.create_account("meanwhile")
    thread.join()
    assert probe_failed.is_set()
    other.execute("ROLLBACK")
    other.close()


def test_calls_that_waited_behind_the_failing_one_are_refused_when_it_fails(
    tmp_path: Path,
) -> None:
    """The soak's case: requests that came while the first write still waited on the lock
    queue for the connection; once that write fails they are refused, not made to wait
    ``busy_timeout`` each in turn."""
    store = SQLiteAuthStore(tmp_path / "auth.sqlite3", busy_timeout_ms=BUSY_MS)
    other = held(store.path)
    outcomes: dict[str, tuple[str, float]] = {}

    def call(name: str) -> None:
        started = time.monotonic()
        try:
            store.create_account(name)
            outcome = "written"
        except StoreUnavailable:
            outcome = "refused"
        except sqlite3.OperationalError:
            outcome = "failed"
        outcomes[name] = (outcome, time.monotonic() - started)

    threads = [threading.Thread(target=call, args=(f"a{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
        time.sleep(0.02)
    for thread in threads:
        thread.join()
    assert sorted(outcome for outcome, _ in outcomes.values()) == ["failed"] + ["refused"] * 3
    # each waited for the first write at most, never a busy_timeout of its own after it
    assert max(seconds for _, seconds in outcomes.values()) < 1.9 * BUSY_MS / 1000
    time.sleep(COOLDOWN_S)
    assert store.list_accounts() == []  # after the cooldown reads answer while writes cannot
    other.execute("ROLLBACK")
    other.close()
