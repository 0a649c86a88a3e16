"""Authorizer over both stores: error order, limits across replicas, ledger, CLI.

"Replicas" are separate Authorizer + store objects on one database, as separate Ray replica
processes would be; one test uses real processes to check the locking itself. Rate-limit
tests drive a fake wall clock, so they neither sleep nor depend on when they run.

Every test runs on SQLite and, where PostgreSQL can be had, on PostgreSQL: a throwaway
server started from the local ``initdb``/``pg_ctl`` (as user ``postgres`` when run as root),
or the server of ``SERVE_APP_TEST_POSTGRES_DSN`` (a ``postgresql://`` URL; each test creates
its own schema there): ``postgres_server`` in conftest.py. Without psycopg or a server those
cases are skipped.
"""

from __future__ import annotations

import multiprocessing
import time

import pytest

from serve_app.auth import cli, ratelimit
from serve_app.auth.authorizer import AuthConfig, Authorizer, bootstrap_local
from serve_app.auth.keys import KEY_PREFIX, generate_key, hash_key, key_hint
from serve_app.auth.migrations import MIGRATIONS
from serve_app.auth.records import StoreError, Usage
from serve_app.auth.store import open_store
from serve_app.errors import AccountError, AuthenticationError, ModelNotFoundError, RateLimitError
from tests.conftest import new_postgres_schema
from tests.fixtures.auth import FakeClock

MODELS = frozenset({"m1", "m2"})


@pytest.fixture(params=["sqlite", "postgres"])
def db(request, tmp_path) -> str:
    """A fresh, empty store location: a SQLite path, or a PostgreSQL URL whose search_path
    is a new schema (much cheaper than a database per test)."""
    if request.param == "sqlite":
        return str(tmp_path / "auth.sqlite3")
    # skips without psycopg or a server
    return new_postgres_schema(request.getfixturevalue("postgres_server"))


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def store(db):
    store = open_store(db)
    yield store
    store.close()


def replica(db, clock=None, ttl: float = 0.5) -> Authorizer:
    """Another Authorizer with its own connection to the same store: a second replica."""
    config = AuthConfig(MODELS, cache_ttl=ttl)
    return Authorizer(open_store(db, clock=clock), config)


def new_key(store, account_name: str, **account_fields) -> str:
    account = store.get_account_by_name(account_name) or store.create_account(
        account_name, **account_fields
    )
    key = generate_key()
    store.add_key(account.id, hash_key(key), key_hint(key))
    return key


# -- keys


def test_keys_are_prefixed_random_and_stored_hashed(store):
    key = new_key(store, "acme")
    assert key.startswith(KEY_PREFIX) and len(key) > 40 and key != generate_key()
    stored = store.list_keys()[0]
    assert stored.key_hash == hash_key(key) and key not in repr(stored)
    assert stored.hint == f"{KEY_PREFIX}...{key[-4:]}"
    assert key_hint("local-dev-key") == "..."  # a short chosen key: no characters shown


# -- errors, in order


def test_missing_unknown_and_revoked_keys_are_authentication_errors(store, db):
    key = new_key(store, "acme")
    service = replica(db, ttl=0)
    for bad in (None, "", "sk-sa-not-a-key", key + "x", "with space"):
        with pytest.raises(AuthenticationError) as caught:
            service.authorize(bad, "m1", "/v1/chat/completions")
        assert (caught.value.status_code, caught.value.code) == (401, "invalid_api_key")
        assert not bad or bad not in caught.value.message
    store.revoke_key(store.list_keys()[0].id)
    with pytest.raises(AuthenticationError) as caught:
        service.authorize(key, "m1", "/v1/chat/completions")
    assert key not in caught.value.message


def test_inactive_account_is_account_error_before_model_check(store, db):
    key = new_key(store, "acme", status="inactive", models=["m1"])
    with pytest.raises(AccountError) as caught:
        replica(db).authorize(key, "nope", "/v1/chat/completions")
    assert (caught.value.status_code, caught.value.code) == (402, "account_error")


@pytest.mark.parametrize("model", ["unknown-model", "m2"])
def test_unknown_or_not_allowed_model_is_model_not_found(store, db, model):
    key = new_key(store, "acme", models=["m1"], rpm=0)  # rpm 0: the model check comes first
    with pytest.raises(ModelNotFoundError) as caught:
        replica(db).authorize(key, model, "/v1/chat/completions")
    error = caught.value
    assert (error.status_code, error.code, error.param) == (404, "model_not_found", "model")
    assert model in error.message


def test_allow_list_and_listing_endpoint(store, db):
    limited = new_key(store, "limited", models=["m1"])
    everything = new_key(store, "everything")
    service = replica(db)
    grant = service.authorize(limited, "m1", "/v1/chat/completions")
    assert set(grant.models) == {"m1"}
    listing = service.authorize(limited, None, "/v1/models")  # no model check
    assert set(listing.models) == {"m1"}
    assert service.authorize(everything, None, "/v1/models").models is None
    assert service.authorize(everything, "m2", "/v1/completions").account_name == "everything"


# -- rate limits across replicas


def test_rpm_holds_in_total_across_two_replicas(store, db, clock):
    key = new_key(store, "acme", rpm=5)
    first, second = replica(db, clock), replica(db, clock)
    grants = [(first if i % 2 else second).authorize(key, "m1", "/v1/chat") for i in range(5)]
    assert [g.headers["x-ratelimit-remaining-requests"] for g in grants] == list("43210")
    assert grants[0].headers["x-ratelimit-limit-requests"] == "5"
    with pytest.raises(RateLimitError) as caught:
        first.authorize(key, "m1", "/v1/chat")
    error = caught.value
    assert (error.status_code, error.code) == (429, "rate_limit_reached")
    retry_after = int(error.headers["Retry-After"])
    assert 1 <= retry_after <= ratelimit.WINDOW_SECONDS + ratelimit.BUCKET_SECONDS
    assert error.headers["x-ratelimit-remaining-requests"] == "0"
    with pytest.raises(RateLimitError):
        second.authorize(key, "m1", "/v1/chat")
    clock.advance(retry_after)
    second.authorize(key, "m1", "/v1/chat")  # Retry-After was long enough


def _authorize_many(db: str, key: str, count: int, results) -> None:
    service = replica(db)
    allowed = 0
    for _ in range(count):
        try:
            service.authorize(key, "m1", "/v1/chat")
            allowed += 1
        except RateLimitError:
            pass
    results.put(allowed)


def test_rpm_holds_across_processes(store, db):
    key = new_key(store, "acme", rpm=7)
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    workers = [
        context.Process(target=_authorize_many, args=(db, key, 10, results)) for _ in range(3)
    ]
    for worker in workers:
        worker.start()
    allowed = sum(results.get(timeout=30) for _ in workers)
    for worker in workers:
        worker.join(timeout=30)
    assert allowed == 7


def test_tpm_counts_recorded_tokens_across_replicas(store, db, clock):
    key = new_key(store, "acme", tpm=100)
    first, second = replica(db, clock), replica(db, clock)
    grant = first.authorize(key, "m1", "/v1/chat", estimated_tokens=50)
    assert grant.headers["x-ratelimit-remaining-tokens"] == "100"
    first.record_usage(grant, Usage("m1", "/v1/chat", 40, 30, 200))
    assert (
        second.authorize(key, "m1", "/v1/chat", estimated_tokens=30).headers[
            "x-ratelimit-remaining-tokens"
        ]
        == "30"
    )
    with pytest.raises(RateLimitError) as caught:
        second.authorize(key, "m1", "/v1/chat", estimated_tokens=31)
    assert int(caught.value.headers["Retry-After"]) >= 1
    with pytest.raises(RateLimitError) as caught:  # can never fit: says so
        second.authorize(key, "m1", "/v1/chat", estimated_tokens=101)
    assert "too large" in caught.value.message
    clock.advance(int(ratelimit.WINDOW_SECONDS + ratelimit.BUCKET_SECONDS))
    second.authorize(key, "m1", "/v1/chat", estimated_tokens=100)


def test_sliding_window_has_no_burst_at_window_boundary(store, db, clock):
    key = new_key(store, "acme", rpm=4)
    service = replica(db, clock)
    clock.now = 1_800_000_055.0  # late in a minute
    for _ in range(4):
        service.authorize(key, "m1", "/v1/chat")
    clock.now = 1_800_000_061.0  # a fixed per-minute window would allow 4 more here
    with pytest.raises(RateLimitError):
        service.authorize(key, "m1", "/v1/chat")


# -- quota and ledger


def test_quota_exhausted_is_account_error_and_ledger_is_complete(store, db, clock):
    key = new_key(store, "acme", quota_tokens=100)
    service = replica(db, clock)
    for status, tokens in ((200, 60), (500, 0), (200, 45)):
        grant = service.authorize(key, "m1", "/v1/completions")
        usage = Usage("m1", "/v1/completions", tokens // 3, tokens - tokens // 3, status)
        service.record_usage(grant, usage)
    with pytest.raises(AccountError) as caught:
        service.authorize(key, "m1", "/v1/completions")
    assert "quota" in caught.value.message
    with pytest.raises(AccountError):  # the other replica agrees
        replica(db, clock).authorize(key, None, "/v1/models")
    account = store.get_account_by_name("acme")
    assert account.tokens_used_at(clock()) == 105
    ledger = store.list_usage(account.id)
    assert [(r.status, r.total_tokens, r.model) for r in reversed(ledger)] == [
        (200, 60, "m1"),
        (500, 0, "m1"),
        (200, 45, "m1"),
    ]
    assert {r.key_id for r in ledger} == {store.list_keys()[0].id}
    store.update_account(account.id, quota_tokens=None)
    replica(db, clock).authorize(key, "m1", "/v1/completions")


def test_a_request_is_billed_once_however_many_write_its_row(store, db, clock):
    """The router bills a stream whose replica died; a replica that was not dead after all
    writes too. The first row of a request id stands, and only it charges; rows without an
    id (older writers) are all kept."""
    key = new_key(store, "acme", quota_tokens=1000)
    router, model_replica = replica(db, clock), replica(db, clock)
    grant = router.authorize(key, "m1", "fim", estimated_tokens=200)
    router.record_usage(grant, Usage("m1", "fim", 30, 7, 503, request_id="req-1"))
    model_replica.record_usage(grant, Usage("m1", "fim", 30, 90, 499, request_id="req-1"))
    for _ in range(2):
        grant = router.authorize(key, "m1", "fim")
        router.record_usage(grant, Usage("m1", "fim", 1, 1, 200))
    account = store.get_account_by_name("acme")
    rows = [
        (r.status, r.input_tokens, r.output_tokens, r.request_id)
        for r in store.list_usage(account.id)
    ]
    assert sorted(rows, key=str) == sorted(
        [(503, 30, 7, "req-1"), (200, 1, 1, None), (200, 1, 1, None)], key=str
    )
    assert account.tokens_used_at(clock()) == 37 + 2 * 2  # the reservation settled once


def test_monthly_quota_restarts_next_month(store, db):
    clock = FakeClock(1_798_761_599.0)  # 2026-12-31T23:59:59Z
    key = new_key(store, "acme", quota_tokens=10, quota_period="monthly")
    service = replica(db, clock)
    service.record_usage(
        service.authorize(key, "m1", "/v1/chat"), Usage("m1", "/v1/chat", 5, 5, 200)
    )
    with pytest.raises(AccountError):
        service.authorize(key, "m1", "/v1/chat")
    clock.advance(2)  # January
    service.authorize(key, "m1", "/v1/chat")


# -- replicas see changes


def test_revocation_reaches_another_replica_within_its_cache_ttl(store, db):
    ttl = 0.5  # the default
    key = new_key(store, "acme")
    other = replica(db, ttl=ttl)  # real clock
    other.authorize(key, "m1", "/v1/chat")  # now cached there, for at most ttl from here
    cached_by = time.monotonic()
    store.revoke_key(store.list_keys()[0].id)
    # However slow the box, once ttl has passed the replica asks the store again.
    time.sleep(max(0.0, cached_by + ttl - time.monotonic()) + 0.01)
    with pytest.raises(AuthenticationError):
        other.authorize(key, "m1", "/v1/chat")


def test_last_used_is_recorded_and_throttled(store, db, clock):
    key = new_key(store, "acme")
    service = replica(db, clock)
    service.authorize(key, "m1", "/v1/chat")
    first_use = store.list_keys()[0].last_used_at
    assert first_use == clock()
    clock.advance(30)
    service.authorize(key, "m1", "/v1/chat")
    assert store.list_keys()[0].last_used_at == first_use  # within a minute: no write
    clock.advance(31)
    service.clear_cache()
    service.authorize(key, "m1", "/v1/chat")
    assert store.list_keys()[0].last_used_at == clock()


def test_reopening_keeps_accounts_keys_and_usage(db, clock):
    store = open_store(db, clock=clock)
    key = new_key(store, "acme", rpm=10, models=["m1"])
    service = Authorizer(store, AuthConfig(MODELS))
    service.record_usage(
        service.authorize(key, "m1", "/v1/chat"), Usage("m1", "/v1/chat", 3, 4, 200)
    )
    store.close()
    reopened = open_store(db, clock=clock)
    assert reopened.schema_version() == max(MIGRATIONS)
    account = reopened.get_account_by_name("acme")
    assert (account.rpm, account.models, account.tokens_used_at(clock())) == (10, ("m1",), 7)
    assert len(reopened.list_usage(account.id)) == 1
    grant = Authorizer(reopened, AuthConfig(MODELS)).authorize(key, "m1", "/v1/chat")
    assert grant.headers["x-ratelimit-remaining-requests"] == "8"  # the earlier request counts
    reopened.close()


def test_store_rejects_bad_values(store):
    with pytest.raises(StoreError):
        store.create_account("acme", rpm=-1)
    store.create_account("acme")
    with pytest.raises(StoreError):
        store.create_account("acme")
    with pytest.raises(StoreError):
        store.update_account(1, status="gone")


# -- bootstrap


def test_bootstrap_with_env_key(store, db):
    assert bootstrap_local(store, "local-dev-key") is None  # known to the caller: not returned
    assert [a.name for a in store.list_accounts()] == ["local"]
    assert replica(db).authorize("local-dev-key", "m2", "/v1/chat").account_name == "local"
    assert bootstrap_local(store, "local-dev-key") is None
    assert len(store.list_keys()) == 1


def test_bootstrap_generates_once_and_adds_new_env_key(store, db):
    generated = bootstrap_local(store, None)
    assert generated and generated.startswith(KEY_PREFIX)
    assert bootstrap_local(store, None) is None  # non-empty store: nothing
    bootstrap_local(store, "another-dev-key")
    service = replica(db)
    for key in (generated, "another-dev-key"):
        assert service.authorize(key, None, "/v1/models").account_name == "local"
    assert len(store.list_accounts()) == 1


# -- CLI


def test_cli_round_trip(db, capsys, monkeypatch):
    monkeypatch.setenv("SERVE_APP_AUTH_DB", str(db))
    assert (
        cli.main(["create-account", "acme", "--models", "m1", "--rpm", "5", "--quota", "99"]) == 0
    )
    assert cli.main(["create-key", "acme"]) == 0
    key = capsys.readouterr().out.strip().splitlines()[-1]
    assert key.startswith(KEY_PREFIX)
    assert cli.main(["--db", str(db), "list"]) == 0
    listing = capsys.readouterr().out
    assert "acme" in listing and key[-4:] in listing and key not in listing
    assert "rpm 5" in listing and "models m1" in listing

    service = replica(db)
    service.record_usage(
        service.authorize(key, "m1", "/v1/chat"), Usage("m1", "/v1/chat", 2, 3, 200)
    )
    assert cli.main(["usage", "acme"]) == 0
    assert "5 tokens used" in capsys.readouterr().out

    assert cli.main(["set-limits", "acme", "--rpm", "none", "--models", "all"]) == 0
    assert "all models, rpm unlimited" in capsys.readouterr().out
    assert cli.main(["set-status", "acme", "inactive"]) == 0
    assert cli.main(["set-status", "acme", "active"]) == 0
    key_id = open_store(db).list_keys()[0].id
    assert cli.main(["revoke", str(key_id)]) == 0
    assert cli.main(["revoke", str(key_id)]) == 1
    assert cli.main(["create-key", "nobody"]) == 1
    output = capsys.readouterr()
    assert key not in output.out + output.err
    with pytest.raises(AuthenticationError):
        replica(db, ttl=0).authorize(key, "m1", "/v1/chat")
