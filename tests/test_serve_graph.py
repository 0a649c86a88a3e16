"""End to end: ``serve run`` on configs/local.yaml (model swapped for the tiny one), over HTTP.

The graph runs with 2 Router and 2 AuthService replicas, so the auth tests check that limits
hold in total across replicas, not per process.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import pytest

from serve_app.auth.cli import main as keys_cli
from serve_app.auth.store import open_store
from tests.conftest import LONG_CONTEXT
from tests.fixtures.edit import EXAMPLE_EDIT_CONTENT
from tests.graph import MODEL, auth

pytestmark = pytest.mark.ray


def new_key(db: str, capsys: pytest.CaptureFixture, account: str, *options: str) -> str:
    keys_cli(["--db", db, "create-account", account, *options])
    keys_cli(["--db", db, "create-key", account])
    output = capsys.readouterr().out
    return next(word for word in output.split() if word.startswith("sk-sa-") and "..." not in word)


# --- every endpoint through the real graph -----------------------------------------------------


def test_each_endpoint_answers_through_the_graph(graph):
    url = graph["url"]
    calls = {
        "/v1/decisions": {
            "model": MODEL,
            "state": {"x": 1},
            "questions": {
                "a": {"type": "noul"},
                "b": {"type": "choice", "criteria": {"yes": None, "no": None}},
                "c": {"type": "score", "criteria": ["low", "high"]},
            },
        },
        "/v1/edit/completions": {
            "model": MODEL,
            "max_tokens": 4,
            "messages": [{"role": "user", "content": EXAMPLE_EDIT_CONTENT}],
        },
        "/v1/fim/completions": {"model": MODEL, "prompt": "def f(", "max_tokens": 4},
        "/v1/chat/completions": {
            "model": MODEL,
            "max_tokens": 4,
            "messages": [{"role": "user", "content": "hi"}],
        },
    }
    expected_object = {
        "/v1/edit/completions": "edit.completion",
        "/v1/fim/completions": "text_completion",
        "/v1/chat/completions": "chat.completion",
    }
    for path, body in calls.items():
        response = httpx.post(url + path, json=body, headers=auth(), timeout=120)
        assert response.status_code == 200, (path, response.text)
        if path in expected_object:
            assert response.json()["object"] == expected_object[path]
        else:
            assert set(response.json()["answers"]) == {"a", "b", "c"}
        assert len(response.headers.get_list("x-request-id")) == 1
    for path in (
        "/v1/models",
        "/v1/chat/completions/models",
        "/v1/fim/completions/models",
        "/v1/edit/completions/models",
    ):
        response = httpx.get(url + path, headers=auth(), timeout=30)
        assert response.status_code == 200 and response.json()["data"][0]["id"] == MODEL


def test_the_graph_runs_without_the_dashboard(graph):
    """``make run``'s launcher (``serve_app.launch``): Serve up, none of the dashboard's
    module processes, and its head (Ray keeps one for usage stats) without its web frontend."""
    commands = session_commands(graph["pid"])
    assert any("ServeController" in command for command in commands)
    assert not [c for c in commands if "ray-dashboard-" in c]
    heads = [c for c in commands if "dashboard/dashboard.py" in c]
    assert all("--disable-frontend" in c for c in heads)


def session_commands(session: int) -> list[str]:
    """The command lines of the processes in ``session`` (Linux /proc)."""
    commands = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.getsid(int(entry.name)) == session:
                commands.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except OSError:  # gone meanwhile
            continue
    return commands


def test_fim_stream_through_the_graph(graph):
    body = {
        "model": MODEL,
        "prompt": "def f(",
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    lines = []
    with httpx.stream(
        "POST", graph["url"] + "/v1/fim/completions", json=body, headers=auth(), timeout=120
    ) as response:
        assert response.status_code == 200
        lines = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    usage = json.loads(lines[-2][6:])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] >= 1


def test_errors_through_the_graph_keep_the_contract_shape(graph):
    url = graph["url"]
    # A chat over the context (FIM would cut it near the cursor instead: docs/fim.md).
    message = {"role": "user", "content": "x " * (LONG_CONTEXT + 1000)}
    body = {"model": MODEL, "messages": [message], "max_tokens": 4}
    response = httpx.post(url + "/v1/chat/completions", json=body, headers=auth(), timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "context_length_exceeded"
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


# --- auth across replicas ---------------------------------------------------------------------


def test_rpm_limit_holds_in_total_across_replicas(graph, capsys):
    key = new_key(graph["db"], capsys, "rpm-five", "--rpm", "5")
    statuses = []
    for _ in range(8):
        response = httpx.get(graph["url"] + "/v1/models", headers=auth(key), timeout=30)
        statuses.append(response.status_code)
        if response.status_code == 429:
            assert int(response.headers["retry-after"]) >= 1
            assert response.json()["error"]["code"] == "rate_limit_reached"
    assert statuses == [200] * 5 + [429] * 3


def test_revoked_key_stops_within_one_second(graph, capsys):
    key = new_key(graph["db"], capsys, "revoke-me")
    for _ in range(4):  # warm every replica's cache
        assert httpx.get(graph["url"] + "/v1/models", headers=auth(key)).status_code == 200
    keys_cli(["--db", graph["db"], "list"])
    listing = capsys.readouterr().out
    key_id = next(
        line.split()[1]
        for line in listing.splitlines()
        if line.strip().startswith("key") and key[-4:] in line
    )
    keys_cli(["--db", graph["db"], "revoke", key_id])
    revoked_at = time.monotonic()
    time.sleep(1.0)
    for _ in range(4):
        response = httpx.get(graph["url"] + "/v1/models", headers=auth(key))
        assert response.status_code == 401, time.monotonic() - revoked_at


def test_quota_exhausted_is_402_and_usage_is_recorded(graph, capsys):
    """Each request reserves its estimate (prompt bytes + template + max_tokens) before it
    starts and settles to what it used: requests run while a reservation fits, then 402,
    and the quota is never overdrawn."""
    quota = 400
    key = new_key(graph["db"], capsys, "small-quota", "--quota", str(quota))
    body = {"model": MODEL, "prompt": "def f(x):\n    return", "max_tokens": 4}
    statuses = []
    for _ in range(60):
        response = httpx.post(
            graph["url"] + "/v1/fim/completions", json=body, headers=auth(key), timeout=60
        )
        statuses.append(response.status_code)
        if response.status_code == 402:
            break
    assert statuses[0] == 200 and statuses[-1] == 402, statuses
    assert set(statuses[:-1]) == {200}
    assert response.json()["error"] == {
        "message": response.json()["error"]["message"],
        "type": "account_error",
        "param": None,
        "code": "account_error",
    }
    keys_cli(["--db", graph["db"], "usage", "small-quota"])
    usage = capsys.readouterr().out
    assert "fim.completions" in usage
    store = open_store(graph["db"])
    try:
        account = store.get_account_by_name("small-quota")
        assert 0 < account.tokens_used_at(store.now()) <= quota
    finally:
        store.close()
