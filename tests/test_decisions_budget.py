"""Decision budgets from the app config (``limits.decision_max_*``), over HTTP.

The in-process app on the tiny model with both budgets lowered: the 422 names the configured
limit and its value, and a request within the budget still runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from serve_app.config import HttpLimits
from serve_app.serving.scoring import DecisionBudget
from tests.conftest import AUTH, TEST_KEY, TINY_ID, tiny_config

LABELS = {f"l{i}": None for i in range(255)}

LOW_SCORED_TOKENS = 4_500  # one noul question runs ~1,900 here; two 255-label choices ~5,900
LOW_INPUT_BYTES = 8_000  # above the two 255-label choices (~5,500 bytes)


@pytest.fixture(scope="module")
def low_budget_client(tiny_source: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """The in-process app on the tiny model with both decision budgets lowered in the config."""
    from fastapi.testclient import TestClient

    from serve_app.testing import local_router_app

    limits = HttpLimits(
        max_body_bytes=1_000_000,
        decision_max_scored_tokens=LOW_SCORED_TOKENS,
        decision_max_input_bytes=LOW_INPUT_BYTES,
    )
    config = tiny_config(tiny_source, tmp_path_factory.mktemp("budget-data"), limits=limits)
    os.environ["SERVE_APP_API_KEY"] = TEST_KEY
    with TestClient(local_router_app(config), raise_server_exceptions=False) as client:
        yield client


def post_decision(client, state: str, questions: dict) -> Any:
    body = {"model": TINY_ID, "state": state, "questions": questions}
    return client.post("/v1/decisions", json=body, headers=AUTH)


def test_configured_scored_token_budget_is_the_422s_limit(low_budget_client) -> None:
    small = post_decision(low_budget_client, "small", {"ok": {"type": "noul"}})
    assert small.status_code == 200, small.text
    assert small.json()["usage"]["input_tokens"] <= LOW_SCORED_TOKENS
    two = {name: {"type": "choice", "criteria": LABELS} for name in ("a", "b")}
    response = post_decision(low_budget_client, "small", two)
    assert response.status_code == 422, response.text
    message = response.json()["error"]["message"]
    assert "max_scored_tokens" in message and str(LOW_SCORED_TOKENS) in message


def test_configured_input_byte_budget_is_the_422s_limit(low_budget_client) -> None:
    response = post_decision(low_budget_client, "x" * 9_000, {"ok": {"type": "noul"}})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert "max_input_bytes" in error["message"] and str(LOW_INPUT_BYTES) in error["message"]
    assert error["param"] == "state"


def test_config_defaults_are_the_scorers_defaults() -> None:
    assert HttpLimits().decision_max_scored_tokens == DecisionBudget().max_scored_tokens
    assert HttpLimits().decision_max_input_bytes == DecisionBudget().max_input_bytes
