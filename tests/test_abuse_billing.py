"""Abuse suite, billing and isolation over HTTP (issue 15, findings 1-3; the bounds that hold
below HTTP, the authorizer's and the recorder's, are in tests/test_abuse_admission.py).

Each test is an attack a stranger with a valid key could run, and asserts its bound:

- the prefix cache is no oracle across accounts (cached_input_tokens, decision input_tokens);
- every way a request ends leaves one ledger row with the tokens processed and its status;
- limits hold under concurrency: a reservation is checked and taken in one transaction.

The in-process app (real router, real deployments, tiny model) serves the HTTP tests that do
not need the Serve proxy; the client-disconnect tests run on the real graph (``-m ray``),
since it is the proxy that turns a closed connection into a cancelled request.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import httpx
import pytest

from serve_app.api.fim import FimCompletionRequest
from serve_app.auth.records import UsageRecord
from serve_app.auth.store import open_store
from serve_app.config import AppConfig, HttpLimits
from serve_app.engine.engine import LLMEngine
from serve_app.engine_config import SpeculationConfig
from serve_app.http.app import BACKSTOP_GRACE_S
from serve_app.serving.billing import RequestContext, UsageRecorder
from serve_app.serving.engine_client import EngineClient
from serve_app.serving.fim import FimService
from tests.conftest import LONG_CONTEXT, TEST_KEY, TINY_ID, tiny_config
from tests.conftest import LONG_FIM as LONG
from tests.fixtures.auth import new_account

# A deadline LONG cannot meet by construction, on any CPU: with speculation off (below) it
# decodes one token a step, and writing its 8,192 tokens in 0.5 s would take 16k steps a second
# (a step of the tiny model takes ~1.5 ms on the AVX2 box, ~0.6 ms on the AVX-512 one), while its
# first token comes ~10 ms after the request: both sides at least 6x clear of the deadline.
DEADLINE_S = 0.5
SECRET = "API_TOKEN = 'hunter2-7f3a9c' # deploy key for the payments cluster, rotate monthly"


@pytest.fixture(scope="module")
def billing_config(tiny_source: str, tmp_path_factory: pytest.TempPathFactory) -> AppConfig:
    config = tiny_config(
        tiny_source,
        tmp_path_factory.mktemp("billing-data"),
        context_length=LONG_CONTEXT,
        limits=HttpLimits(max_body_bytes=1_000_000),
    )
    # FIM speculation off: one token a step, so LONG's length in steps is its length in tokens.
    speculation = SpeculationConfig(fim=0)
    engine = config.engine.model_copy(update={"speculation": speculation})
    return config.model_copy(update={"engine": engine})


def serve_in_process(config: AppConfig) -> Iterator:
    import os

    from fastapi.testclient import TestClient

    from serve_app.testing import local_router_app

    os.environ["SERVE_APP_API_KEY"] = TEST_KEY
    with TestClient(local_router_app(config), raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="module")
def billing_client(billing_config: AppConfig) -> Iterator:
    yield from serve_in_process(billing_config)


@pytest.fixture(scope="module")
def deadline_client(billing_config: AppConfig) -> Iterator:
    """The same service (same auth store) with a request deadline of DEADLINE_S."""
    limits = billing_config.limits.model_copy(update={"request_timeout_s": DEADLINE_S})
    yield from serve_in_process(billing_config.model_copy(update={"limits": limits}))


def ledger(db: str, account_id: int) -> list[UsageRecord]:
    store = open_store(db)
    try:
        return list(reversed(store.list_usage(account_id)))
    finally:
        store.close()


def wait_for_ledger(db: str, account_id: int, rows: int = 1, timeout: float = 20) -> list:
    """Rows written by a detached task (after a client went away) land a moment later."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = ledger(db, account_id)
        if len(found) >= rows:
            return found
        time.sleep(0.1)
    return ledger(db, account_id)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


# -- finding 1: the prefix cache is no oracle across accounts -----------------------------


def fim_cached(client, key: str, prompt: str) -> int:
    body = {"model": TINY_ID, "prompt": prompt, "max_tokens": 1}
    response = client.post("/v1/fim/completions", json=body, headers=bearer(key))
    assert response.status_code == 200, response.text
    return response.json()["usage"]["cached_input_tokens"]


def test_cache_oracle_reveals_nothing_across_accounts(billing_client, billing_config):
    victim, _ = new_account(billing_config.auth_db, "oracle-victim")
    fim_cached(billing_client, victim, SECRET)
    guesses = {"right": SECRET[:40], "wrong": "API_TOKEN = 'aaaaaaa-0000000' # " + "z" * 8}
    cached = {}
    for name, guess in guesses.items():  # each from a fresh account: no history of its own
        attacker, _ = new_account(billing_config.auth_db, f"oracle-attacker-{name}")
        cached[name] = fim_cached(billing_client, attacker, guess)
    # The right guess reads exactly like a wrong one (on a shared cache: 30+ against 13).
    assert cached["right"] == cached["wrong"] == 0
    # The cache still works within one account.
    assert fim_cached(billing_client, victim, SECRET + " and more") > 0


def decide(client, key: str, state: dict) -> dict:
    body = {
        "model": TINY_ID,
        "state": state,
        "questions": {"leaked": {"type": "noul", "instructions": "Is a token shown?"}},
    }
    response = client.post("/v1/decisions", json=body, headers=bearer(key))
    assert response.status_code == 200, response.text
    return response.json()["usage"]


def test_decisions_bill_a_shared_state_to_whoever_sends_it(billing_client, billing_config):
    victim, _ = new_account(billing_config.auth_db, "decide-victim")
    attacker, _ = new_account(billing_config.auth_db, "decide-attacker")
    state = {"notes": SECRET}
    first = decide(billing_client, victim, state)
    # The attacker pays the whole state, as if nobody had sent it before: no signal, no ride.
    assert decide(billing_client, attacker, state)["input_tokens"] == first["input_tokens"]
    assert decide(billing_client, victim, state)["input_tokens"] == first["input_tokens"]


# -- finding 2: every ending leaves a ledger row ------------------------------------------


def test_a_finished_and_a_timed_out_request_are_billed_what_they_processed(
    billing_client, deadline_client, billing_config
):
    key, account = new_account(billing_config.auth_db, "timed-out")
    short = {"model": TINY_ID, "prompt": "def f(", "max_tokens": 3}
    finished = billing_client.post("/v1/fim/completions", json=short, headers=bearer(key))
    assert finished.status_code == 200, finished.text
    usage = finished.json()["usage"]
    started = time.monotonic()
    response = deadline_client.post(
        "/v1/fim/completions", json={"model": TINY_ID, **LONG}, headers=bearer(key)
    )
    assert response.status_code == 504, response.text
    # the replica's own deadline answered, not the router's backstop (BACKSTOP_GRACE_S later)
    assert time.monotonic() - started < DEADLINE_S + BACKSTOP_GRACE_S
    done, row = ledger(billing_config.auth_db, account)
    assert (done.status, done.input_tokens, done.output_tokens) == (
        200,
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
    assert row.status == 504
    assert row.input_tokens > 0 and 0 < row.output_tokens < LONG["max_tokens"]


def test_a_timeout_cancels_the_engine_request_and_frees_its_slot(billing_config):
    """What the 504 above does on the model side: the engine request is aborted, not left
    generating until max_tokens, and the write gets the tokens it processed."""
    model = billing_config.model(billing_config.roles.fim)
    engine = LLMEngine.from_config(billing_config, "fim", model=model)
    service = FimService(EngineClient(engine, model))
    rows: list[tuple[int, int, int]] = []

    async def write(context, input_tokens, output_tokens, status) -> None:
        rows.append((input_tokens, output_tokens, status))

    recorder = UsageRecorder(write, timeout_s=DEADLINE_S)
    context = RequestContext(grant=None, model=model.id, endpoint="fim", cache_salt="a")
    body = FimCompletionRequest(model=model.id, **LONG)

    async def scenario() -> None:
        with pytest.raises(Exception) as caught:
            await recorder.run(context, partial(service.complete, body))
        assert getattr(caught.value, "status_code", None) == 504
        assert await engine.wait_until_idle(timeout=30)  # the abort lands at the next step

    try:
        asyncio.run(scenario())
        stats = engine.stats()
        assert stats.num_running == 0 and stats.requests_aborted == 1, stats
        ((input_tokens, output_tokens, status),) = rows
        assert status == 504 and input_tokens > 0
        assert 0 < output_tokens < LONG["max_tokens"]
    finally:
        engine.shutdown()


def test_a_usage_write_that_fails_is_no_silent_200(billing_config):
    model = billing_config.model(billing_config.roles.fim)
    engine = LLMEngine.from_config(billing_config, "fim", model=model)
    service = FimService(EngineClient(engine, model))
    attempts = []

    async def broken_write(context, input_tokens, output_tokens, status) -> None:
        attempts.append(status)
        raise ConnectionError("auth store unreachable")

    recorder = UsageRecorder(broken_write, timeout_s=30)
    context = RequestContext(grant=None, model=model.id, endpoint="fim", cache_salt="a")
    body = FimCompletionRequest(model=model.id, prompt="def f(", max_tokens=2)
    try:
        with pytest.raises(Exception) as caught:
            asyncio.run(recorder.run(context, partial(service.complete, body)))
        assert getattr(caught.value, "status_code", None) == 503
        assert len(attempts) > 1 and set(attempts) == {200}  # retried before giving up
    finally:
        engine.shutdown()


# -- finding 3: limits that hold under concurrency ----------------------------------------


def test_a_request_larger_than_the_token_window_is_refused_before_any_work(
    billing_client, billing_config
):
    key, account = new_account(billing_config.auth_db, "small-window", tpm=1000)
    # The max_tokens=8192 is past the tiny model's 4096-token context (a 400 on any
    # branch); 3000 fits the context, so only the reservation can refuse it.
    body = {
        "model": TINY_ID,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 3000,
    }
    response = billing_client.post("/v1/chat/completions", json=body, headers=bearer(key))
    assert response.status_code == 429, response.text
    assert int(response.headers["Retry-After"]) >= 1
    assert ledger(billing_config.auth_db, account) == []  # nothing ran, nothing billed
    store = open_store(billing_config.auth_db)
    try:
        assert store.get_account(account).tokens_used_at(store.now()) == 0
    finally:
        store.close()


def test_concurrent_requests_cannot_overrun_the_quota(billing_client, billing_config):
    quota = 400
    key, account = new_account(billing_config.auth_db, "small-quota", quota_tokens=quota)
    # Each writes all its 100 tokens (LONG's sampling never ends early), so the ten together
    # cost over twice the quota: some must be refused however the requests interleave, on
    # any CPU, and the reservation (~270 tokens) still lets the first one in.
    body = {"model": TINY_ID, **LONG, "max_tokens": 100}
    barrier = threading.Barrier(10)

    def one(_: int) -> int:
        barrier.wait()
        response = billing_client.post("/v1/fim/completions", json=body, headers=bearer(key))
        return response.status_code

    with ThreadPoolExecutor(10) as pool:
        statuses = list(pool.map(one, range(10)))
    assert statuses.count(200) >= 1 and statuses.count(402) >= 1, statuses
    assert set(statuses) <= {200, 402}, statuses
    rows = ledger(billing_config.auth_db, account)
    charged = sum(row.total_tokens for row in rows)
    # Every reservation is an upper bound settled downwards: never past the quota itself
    # (the bound, quota + one reservation, a fortiori).
    assert charged <= quota, (charged, statuses)
    store = open_store(billing_config.auth_db)
    try:
        assert store.get_account(account).tokens_used_at(store.now()) == charged
    finally:
        store.close()


def test_decisions_cannot_overrun_the_quota_or_the_token_window(billing_client, billing_config):
    """A decision is bounded by its scoring budget, not the context (its reservation was
    capped at the 4,096-token context while one request scored 61k tokens), and its fixed
    system turn and examples count in its usage (small decisions reserved a fifth of it)."""
    key, account = new_account(billing_config.auth_db, "decisions-big", quota_tokens=5000)
    questions = {f"q{i}": {"type": "noul", "instructions": "lorem " * 300} for i in range(32)}
    big = {"model": TINY_ID, "state": "s", "questions": questions}
    response = billing_client.post("/v1/decisions", json=big, headers=bearer(key))
    assert response.status_code == 402, response.text
    assert ledger(billing_config.auth_db, account) == []  # refused before any work
    quota = 3000
    key, account = new_account(billing_config.auth_db, "decisions-small", quota_tokens=quota)
    small = {"model": TINY_ID, "state": "s", "questions": {"q": {"type": "noul"}}}
    barrier = threading.Barrier(6)

    def one(_: int) -> int:
        barrier.wait()
        return billing_client.post("/v1/decisions", json=small, headers=bearer(key)).status_code

    with ThreadPoolExecutor(6) as pool:
        statuses = list(pool.map(one, range(6)))
    assert statuses.count(200) >= 1 and set(statuses) <= {200, 402}, statuses
    charged = sum(row.total_tokens for row in ledger(billing_config.auth_db, account))
    assert 0 < charged <= quota, (charged, statuses)
    key, _ = new_account(billing_config.auth_db, "decisions-window", tpm=5000)
    response = billing_client.post("/v1/decisions", json=big, headers=bearer(key))
    assert response.status_code == 429, response.text


def test_a_request_refused_after_admission_keeps_no_reservation(billing_client, billing_config):
    """Admission reserved its estimate; a refusal before any model work refunds it."""
    key, account = new_account(billing_config.auth_db, "refused-late", quota_tokens=100_000)
    questions = {
        f"q{i}": {"type": "noul", "instructions": "Is it?"}
        for i in range(billing_config.limits.max_questions + 1)
    }
    body = {"model": TINY_ID, "state": {"x": 1}, "questions": questions}
    response = billing_client.post("/v1/decisions", json=body, headers=bearer(key))
    assert response.status_code == 422, response.text
    store = open_store(billing_config.auth_db)
    try:
        deadline = time.monotonic() + 10  # the refund is sent detached
        while store.get_account(account).tokens_used_at(store.now()) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
        assert store.get_account(account).tokens_used_at(store.now()) == 0
    finally:
        store.close()


# -- clients that go away (real graph: the Serve proxy cancels the request) ---------------


@pytest.mark.ray
def test_a_stream_read_partly_then_dropped_is_billed_499(graph):
    key, account = new_account(graph["db"], "drops-stream")
    body = {"model": TINY_ID, **LONG, "stream": True, "include_usage": True}
    events = 0
    with (
        httpx.Client(base_url=graph["url"], timeout=60) as client,
        client.stream("POST", "/v1/fim/completions", json=body, headers=bearer(key)) as response,
    ):
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                events += 1
            if events == 5:
                break
    # The proxy tells the replica the client left at its next write; on a loaded 2-core box
    # the row once took longer than the default 20 s wait to appear.
    (row,) = wait_for_ledger(graph["db"], account, timeout=60)
    assert row.status == 499
    assert row.input_tokens > 0
    assert events <= row.output_tokens < LONG["max_tokens"]


@pytest.mark.ray
def test_a_non_streamed_request_whose_client_left_is_billed_499(graph):
    # The client leaves after `wait` seconds. If the call has not reached the model by then
    # (admitting a new key, a replica still busy on a shared 2-core box), nothing ran and
    # nothing is billed: no row, rightly. So each next try waits longer; a row that is never
    # written after the model worked fails them all. Short waits: LONG must still be running
    # when the client leaves, and takes ~5 s on a fast CPU (conftest.py).
    for attempt, wait in enumerate((0.5, 1.0, 2.0)):
        key, account = new_account(graph["db"], f"drops-call-{attempt}")
        with pytest.raises(httpx.ReadTimeout):  # only the answer's wait is cut short
            httpx.post(
                f"{graph['url']}/v1/fim/completions",
                json={"model": TINY_ID, **LONG},
                headers=bearer(key),
                timeout=httpx.Timeout(30.0, read=wait),
            )
        rows = wait_for_ledger(graph["db"], account)
        if rows:
            break
    (row,) = rows
    assert row.status == 499
    assert row.input_tokens > 0 and 0 < row.output_tokens < LONG["max_tokens"]
