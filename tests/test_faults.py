"""Faults: a model replica dies mid-request; a streaming client goes away.

- On the real graph (``graph`` fixture): the FimModel replica's actor is killed with
  ``ray.kill`` while FIM requests run on it. Requests in flight get a contract-shaped 503
  (502 allowed; 504 for one that waited on the replacement past its deadline), a stream
  already under way ends with an error event and ``[DONE]``, the other deployments keep
  answering, Serve replaces the replica without the app restarting, and new
  requests succeed. The test waits for that recovery, so later tests get a healthy graph.
- In-process, at the service level: closing a FIM stream after one chunk frees the engine
  slot at the loop's next step (``num_running`` back to 0).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from deployments.fim_model import FimModel
from serve_app.api.common import ErrorResponse
from serve_app.auth.store import open_store
from serve_app.config import AppConfig, HttpLimits
from tests.conftest import AUTH, LONG_FIM, TEST_KEY, TINY_ID, tiny_config
from tests.graph import MODEL, auth
from tests.ray_admin import RayAdmin

RECOVERY_TIMEOUT_S = 120
# Ray notices the dead actor and fails its calls within seconds (about 7 s on a loaded 2-core
# box); a generous bound that still tells a prompt failure from a hang.
FAILURE_SEEN_WITHIN_S = 30
REPLICA_PREFIX = "SERVE_REPLICA::llm#"


def replicas(actors: list[str], deployment: str) -> list[str]:
    return [name for name in actors if name.startswith(f"{REPLICA_PREFIX}{deployment}#")]


def fim_body(max_tokens: int = LONG_FIM["max_tokens"], **extra) -> dict:
    """LONG_FIM (seconds of decoding, so in flight when the replica dies), or a short one."""
    return {"model": MODEL, **LONG_FIM, "max_tokens": max_tokens, **extra}


def assert_unavailable(body: dict) -> None:
    """The contract body of a model component that stopped: 503 (or 502) server_error."""
    error = ErrorResponse.model_validate(body).error
    assert error.type == "server_error", body
    assert error.code in ("service_unavailable", "bad_gateway"), body
    assert "Traceback" not in error.message


@pytest.mark.ray
def test_killing_the_fim_replica_fails_in_flight_requests_cleanly_and_recovers(graph):
    url, address = graph["url"], graph["ray_address"]
    if address is None and not sys.platform.startswith("linux"):
        pytest.skip("finding the graph's Ray cluster needs /proc")
    assert address, "could not find the graph's Ray cluster"
    admin = RayAdmin(address)
    try:
        before = admin.actors
        (fim_replica,) = replicas(before, "FimModel")
        with ThreadPoolExecutor(max_workers=3) as pool, httpx.Client(timeout=300) as client:

            def blocking_fim(index: int) -> tuple[httpx.Response, float]:
                response = client.post(f"{url}/v1/fim/completions", json=fim_body(), headers=auth())
                return response, time.monotonic()

            in_flight = [pool.submit(blocking_fim, index) for index in range(3)]
            stream_body = fim_body(stream=True)
            with client.stream(
                "POST", f"{url}/v1/fim/completions", json=stream_body, headers=auth()
            ) as stream:
                assert stream.status_code == 200
                lines = stream.iter_lines()
                first = next(line for line in lines if line.startswith("data: "))
                assert json.loads(first[6:])["choices"], first
                assert not any(future.done() for future in in_flight)
                killed_at = time.monotonic()
                assert admin.command(f"kill {fim_replica}") == {"killed": fim_replica}
                rest = [line for line in lines if line.startswith("data: ")]
            stream_ended = time.monotonic() - killed_at
            answers = [future.result(timeout=600) for future in in_flight]

        # the stream was under way: its status line is sent, so the error travels as an event
        assert rest[-1] == "data: [DONE]", rest[-3:]
        assert_unavailable(json.loads(rest[-2][6:]))
        # a blocking request running on the replica gets a 503 (or 502). One still on its way
        # there when it died (two routers: the three need not arrive before the stream's
        # first chunk) is served by the new replica instead: a whole answer, never a cut one;
        # or, where the new replica starts past the request's deadline on a loaded box, a
        # contract-shaped 504.
        failed = [(r, at) for r, at in answers if r.status_code in (502, 503)]
        for response, _ in answers:
            if response.status_code == 200:
                assert response.json()["usage"]["completion_tokens"] == LONG_FIM["max_tokens"]
            elif response.status_code == 504:
                assert ErrorResponse.model_validate(response.json()).error.code == "timeout"
            else:
                assert response.status_code in (502, 503), response.text
                assert_unavailable(response.json())
        assert failed, "no blocking request was on the replica when it was killed"
        answered = max(at for _, at in failed) - killed_at
        print(
            f"\nfaults: blocking statuses {[r.status_code for r, _ in answers]}, failures within "
            f"{answered:.1f}s of the kill; the stream ended {stream_ended:.1f}s after it"
        )
        # failing fast, not by the client's timeout or the 8192 tokens running out
        assert answered < FAILURE_SEEN_WITHIN_S and stream_ended < FAILURE_SEEN_WITHIN_S

        # the rest of the graph is untouched meanwhile
        decision = {"model": MODEL, "state": "s", "questions": {"q": {"type": "noul"}}}
        response = httpx.post(f"{url}/v1/decisions", json=decision, headers=auth(), timeout=60)
        assert response.status_code == 200, response.text

        recovered_in = wait_for_fim(url, killed_at)
        print(f"faults: FIM answered 200 again {recovered_in:.1f}s after the kill")

        after = admin.command("list")["actors"]
        (new_replica,) = replicas(after, "FimModel")
        assert new_replica != fim_replica
        # no app restart: every other actor (controller, proxy, other replicas) is the same
        assert set(before) - {fim_replica} == set(after) - {new_replica}
    finally:
        admin.close()


def wait_for_fim(url: str, since: float) -> float:
    """Poll a small FIM request until Serve has a new replica answering; seconds since kill."""
    deadline = since + RECOVERY_TIMEOUT_S
    statuses = []
    while time.monotonic() < deadline:
        try:
            response = httpx.post(
                f"{url}/v1/fim/completions", json=fim_body(1), headers=auth(), timeout=30
            )
            statuses.append(response.status_code)
            if response.status_code == 200:
                return time.monotonic() - since
            assert response.status_code in (502, 503, 504), response.text
            assert_unavailable(response.json()) if response.status_code != 504 else None
        except httpx.TimeoutException:
            statuses.append("timeout")
        time.sleep(0.5)
    pytest.fail(f"FIM did not recover in {RECOVERY_TIMEOUT_S}s: {statuses[-10:]}")


# --- client disconnect frees the engine slot (service level, in-process) -------------------------


def test_closing_a_fim_stream_frees_its_engine_slot_at_the_next_step(app_config):
    from serve_app.api.fim import FimCompletionRequest
    from serve_app.engine.engine import LLMEngine
    from serve_app.serving.billing import BilledCall, RequestContext, UsageMeter
    from serve_app.serving.engine_client import EngineClient
    from serve_app.serving.fim import FimService

    model = app_config.model(app_config.roles.fim)
    engine = LLMEngine.from_config(app_config, "fim", model=model)
    service = FimService(EngineClient(engine, model))
    # max_tokens within app_config's 4,096-token context; the stream is closed after one chunk
    body = FimCompletionRequest(model=model.id, **{**LONG_FIM, "max_tokens": 3000})

    async def scenario() -> int:
        context = RequestContext(grant=None, model=model.id, endpoint="fim", cache_salt="a")
        stream = service.stream(body, BilledCall(context, UsageMeter()))
        first = await anext(stream)
        assert first.choices and first.choices[0].finish_reason is None  # under way
        steps_at_close = engine.stats().steps
        await stream.aclose()  # what the router does when the HTTP client disconnects
        # Waited for without yielding to the event loop: the close itself must have aborted
        # the engine's request, not a finalizer the loop would run later.
        deadline = time.monotonic() + 30
        while engine.num_running + engine.num_waiting and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.num_running + engine.num_waiting == 0
        return engine.stats().steps - steps_at_close

    try:
        # freed at the loop's next step (counted in steps: a loaded box stretches seconds)
        steps = asyncio.run(scenario())
        stats = engine.stats()
        assert stats.requests_aborted == 1 and stats.requests_finished == 0, stats
        assert steps <= 2, steps
    finally:
        engine.shutdown()


@pytest.mark.ray
def test_restarting_the_auth_service_keeps_accounts_keys_and_usage(graph, capsys):
    """Kill every AuthService replica: Serve starts new ones on the same store, and the key,
    its account and its usage ledger are all still there."""
    from serve_app.auth.cli import main as keys_cli

    url, address = graph["url"], graph["ray_address"]
    assert address, "could not find the graph's Ray cluster"
    keys_cli(["--db", graph["db"], "create-account", "survivor"])
    keys_cli(["--db", graph["db"], "create-key", "survivor"])
    key = next(
        w for w in capsys.readouterr().out.split() if w.startswith("sk-sa-") and "." not in w
    )
    body = {"model": MODEL, "prompt": "def f(", "max_tokens": 2}
    assert (
        httpx.post(
            f"{url}/v1/fim/completions", json=body, headers=auth(key), timeout=60
        ).status_code
        == 200
    )

    admin = RayAdmin(address)
    try:
        killed = replicas(admin.actors, "AuthService")
        for replica in killed:
            admin.command(f"kill {replica}")
        deadline = time.monotonic() + 120
        status = None
        while time.monotonic() < deadline:
            try:
                status = httpx.get(f"{url}/v1/models", headers=auth(key), timeout=10).status_code
            except httpx.HTTPError:
                status = None
            if status == 200:
                break
            time.sleep(1)
        assert status == 200, "the restarted auth service does not know the key"
        restarted = replicas(admin.command("list")["actors"], "AuthService")
    finally:
        admin.close()
    assert restarted and not set(restarted) & set(killed), "the AuthService was not restarted"
    keys_cli(["--db", graph["db"], "usage", "survivor"])
    assert "fim.completions" in capsys.readouterr().out


# --- a model deployment that never answers: the router's backstop (in-process) ---------------


class SilentModel:
    """A FIM deployment whose replica takes requests and never answers: what the router sees
    from a replica that hangs, or while no replica runs (a lost node, replicas starting),
    when Serve keeps the request queued."""

    def __init__(self, config: AppConfig) -> None:
        self.config = config

    async def complete(self, body: Any, context: Any = None) -> None:
        await asyncio.Event().wait()

    async def stream(self, body: Any, context: Any = None) -> AsyncIterator[None]:
        await asyncio.Event().wait()
        yield None

    @staticmethod
    def get_deployment_options(config: AppConfig) -> dict[str, Any]:
        return {"name": "SilentModel"}


def test_no_answer_from_the_model_is_a_503_with_retry_after_at_the_backstop(
    tiny_source, tmp_path, monkeypatch
):
    from fastapi.testclient import TestClient

    from deployments.auth import AuthService
    from serve_app.http.app import BACKSTOP_GRACE_S, Backends, build_router_app
    from serve_app.testing import local_handle

    monkeypatch.setenv("SERVE_APP_API_KEY", TEST_KEY)
    limits = HttpLimits(request_timeout_s=1, max_body_bytes=1_000_000, max_questions=32)
    config = tiny_config(tiny_source, tmp_path, limits=limits)
    silent = local_handle(SilentModel, config)
    auth_handle = local_handle(AuthService, config)
    backends = Backends(auth=auth_handle, scorer=silent, edit=silent, fim=silent)
    with TestClient(build_router_app(config, backends)) as client:

        def send(stream: bool) -> tuple[Any, float]:
            body = {"model": TINY_ID, "prompt": "x", "max_tokens": 4, "stream": stream}
            started = time.monotonic()
            response = client.post("/v1/fim/completions", json=body, headers=AUTH)
            return response, time.monotonic() - started

        with ThreadPoolExecutor(max_workers=2) as pool:  # both wait out the backstop at once
            answers = list(pool.map(send, (False, True)))
    for response, waited in answers:
        assert response.status_code == 503, response.text
        assert int(response.headers["Retry-After"]) >= 1
        assert_unavailable(response.json())
        assert waited < limits.request_timeout_s + BACKSTOP_GRACE_S + 5, waited


# --- a replica lost mid-stream: the router bills what was delivered (in-process) ------------


class FimModelLosingItsNode(FimModel):
    """The real FIM deployment (engine, service, billing) whose replica dies in a stream:
    after ``die_after`` chunks, or once its stream has ended (None), Ray fails the stream
    with ``ActorDiedError``, as it does when the replica's node is lost. ``auth`` None: the
    replica dies before it bills (a killed process runs no ``finally``)."""

    deployment_name = "FimModelLosingItsNode"

    def __init__(self, config: AppConfig, auth: Any, die_after: int | None) -> None:
        super().__init__(config, auth)
        self.die_after = die_after

    async def stream(self, body: Any, context: Any) -> AsyncIterator[Any]:
        from ray.exceptions import ActorDiedError

        sent = 0
        async for chunk in super().stream(body, context):
            yield chunk
            sent += 1
            if sent == self.die_after:
                raise ActorDiedError()
        raise ActorDiedError()


def read_events(client: Any, body: dict, headers: dict) -> list[dict]:
    """A stream read to its end: its events' payloads; it must end with [DONE]."""
    with client.stream("POST", "/v1/fim/completions", json=body, headers=headers) as response:
        assert response.status_code == 200, response.read()
        data = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]", data[-3:]
    return [json.loads(event) for event in data[:-1]]


def billed_to(config: AppConfig, account: int) -> tuple[list, int]:
    """``account``'s ledger rows, and the tokens its quota has used now."""
    store = open_store(config.auth_db)
    try:
        return store.list_usage(account), store.get_account(account).tokens_used_at(store.now())
    finally:
        store.close()


@pytest.mark.parametrize(
    ("die_after", "replica_bills", "status"),
    [(5, False, 503), (None, True, 200)],
    ids=["dies-mid-stream-unbilled", "dies-after-billing-its-row"],
)
def test_a_stream_whose_replica_dies_is_billed_once_for_what_it_delivered(
    tiny_source, tmp_path, monkeypatch, die_after, replica_bills, status
):
    """The replica dies with text delivered: the client gets a usage chunk of what it
    received, then the 503 error event and [DONE], and the ledger one row of exactly that
    usage (503), settling the reservation. A replica that wrote its row before it died
    (200, the whole answer) keeps that row: the router's adds nothing."""
    from fastapi.testclient import TestClient

    from deployments.auth import AuthService
    from serve_app.app import deploy
    from serve_app.http.app import Backends, build_router_app
    from serve_app.testing import local_handle
    from tests.fixtures.auth import new_account

    monkeypatch.setenv("SERVE_APP_API_KEY", TEST_KEY)
    config = tiny_config(tiny_source, tmp_path)
    billing = deploy(AuthService, config).bind(config) if replica_bills else None
    fim = local_handle(FimModelLosingItsNode, config, billing, die_after)
    auth_handle = local_handle(AuthService, config)
    backends = Backends(auth=auth_handle, scorer=fim, edit=fim, fim=fim)
    key, account = new_account(config.auth_db, "loses-a-node", quota_tokens=100_000)
    body = {"model": TINY_ID, **LONG_FIM, "max_tokens": 40 if die_after else 6,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    with TestClient(build_router_app(config, backends)) as client:
        events = read_events(client, body, {"Authorization": f"Bearer {key}"})

    *content, usage_chunk, error_event = events
    assert_unavailable(error_event)
    assert usage_chunk["choices"] == []  # one usage chunk, the replica's or the router's
    assert all(chunk["choices"] and "usage" not in chunk for chunk in content)
    usage = usage_chunk["usage"]
    texts = [chunk for chunk in content if chunk["choices"][0]["text"]]
    assert 0 < len(texts) <= usage["completion_tokens"]  # each text event: a token or more
    if die_after is not None:
        assert len(content) == die_after
    rows, used = billed_to(config, account)
    ((row_status, input_tokens, output_tokens),) = [
        (row.status, row.input_tokens, row.output_tokens) for row in rows
    ]
    assert (input_tokens, output_tokens) == (usage["prompt_tokens"], usage["completion_tokens"])
    assert row_status == status
    assert used == input_tokens + output_tokens  # the reservation settled to the row, once


class FimModelLosingItsAnswer(FimModel):
    """The real FIM deployment whose replica dies once a plain call is done (billed, where
    ``auth`` is given), before its answer gets back: Ray fails the call with
    ``ActorDiedError``."""

    deployment_name = "FimModelLosingItsAnswer"

    async def complete(self, body: Any, context: Any) -> Any:
        from ray.exceptions import ActorDiedError

        await super().complete(body, context)
        raise ActorDiedError()


@pytest.mark.parametrize("replica_bills", [True, False], ids=["billed-then-died", "unbilled"])
def test_a_plain_answer_lost_with_its_replica_is_a_503_billed_nothing(
    tiny_source, tmp_path, monkeypatch, replica_bills
):
    """The client of a plain call whose replica died gets a 503 and nothing else, so its
    account pays nothing: the router's row of no tokens cuts the replica's whole-answer row
    (written just before it died) and refunds it, or stands alone."""
    from fastapi.testclient import TestClient

    from deployments.auth import AuthService
    from serve_app.app import deploy
    from serve_app.http.app import Backends, build_router_app
    from serve_app.testing import local_handle
    from tests.fixtures.auth import new_account

    monkeypatch.setenv("SERVE_APP_API_KEY", TEST_KEY)
    config = tiny_config(tiny_source, tmp_path)
    billing = deploy(AuthService, config).bind(config) if replica_bills else None
    fim = local_handle(FimModelLosingItsAnswer, config, billing)
    backends = Backends(auth=local_handle(AuthService, config), scorer=fim, edit=fim, fim=fim)
    key, account = new_account(config.auth_db, "loses-an-answer", quota_tokens=100_000)
    body = {"model": TINY_ID, **LONG_FIM, "max_tokens": 6}
    with TestClient(build_router_app(config, backends)) as client:
        response = client.post(
            "/v1/fim/completions", json=body, headers={"Authorization": f"Bearer {key}"}
        )
    assert response.status_code == 503, response.text
    assert_unavailable(response.json())
    rows, used = billed_to(config, account)
    assert [(row.status, row.input_tokens, row.output_tokens) for row in rows] == [(503, 0, 0)]
    assert used == 0


def test_only_ray_saying_the_replica_is_gone_makes_the_router_bill():
    """An error the replica raised (even one about another actor) reaches the router as a
    ``RayTaskError``: the replica lived and bills it. Ray's own actor errors mean it did not."""
    from ray import exceptions as ray_errors
    from ray.serve.exceptions import ReplicaUnavailableError

    from serve_app.errors import UpstreamTimeoutError
    from serve_app.http.errors import replica_lost

    gone = [ray_errors.ActorDiedError(), ray_errors.ActorUnavailableError("gone", None)]
    gone.append(ReplicaUnavailableError("the replica stopped"))
    assert all(replica_lost(error) for error in gone)
    raised_by_replica = ray_errors.RayTaskError("stream", "traceback", ray_errors.ActorDiedError())
    assert not replica_lost(raised_by_replica.as_instanceof_cause())
    assert not replica_lost(UpstreamTimeoutError()) and not replica_lost(RuntimeError())
