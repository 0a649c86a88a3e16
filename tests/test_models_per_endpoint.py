"""Each endpoint serves its role's model: a model another endpoint serves is a 404 that says
where it is served and names this endpoint's model; every endpoint's listing, decisions' too,
names its models. On a graph of two tiny models: FIM and decisions on one, edit on the other."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from serve_app.config import ModelConfig, Roles
from tests.conftest import AUTH, TEST_KEY, tiny_config

COMPLETER, EDITOR = "tiny-completer", "tiny-editor"


@pytest.fixture(scope="module")
def two_models(tiny_source: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    from fastapi.testclient import TestClient

    from serve_app.testing import local_router_app

    models = [
        ModelConfig(id=name, source=tiny_source, context_length=4096)
        for name in (COMPLETER, EDITOR)
    ]
    config = tiny_config(
        tiny_source,
        Path(tmp_path_factory.mktemp("data")),
        models=models,
        roles=Roles(fim=COMPLETER, edit=EDITOR, decisions=COMPLETER),
    )
    os.environ["SERVE_APP_API_KEY"] = TEST_KEY
    with TestClient(local_router_app(config), raise_server_exceptions=False) as client:
        yield client


def not_found(response) -> str:
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "model_not_found",
        "model",
    )
    return error["message"]


@pytest.mark.parametrize(
    ("path", "body", "served_here", "served_there"),
    [
        ("/v1/fim/completions", {"prompt": "x", "max_tokens": 1}, COMPLETER,
         "chat.completions, edit.completions, apply.completions"),
        ("/v1/decisions", {"state": "s", "questions": {"q": {"type": "noul"}}}, COMPLETER,
         "chat.completions, edit.completions, apply.completions"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1},
         EDITOR, "fim.completions, decisions"),
    ],
)  # fmt: skip
def test_a_model_of_another_endpoint_is_a_404_that_says_where_it_is_served(
    two_models, path: str, body: dict, served_here: str, served_there: str
) -> None:
    other = EDITOR if served_here == COMPLETER else COMPLETER
    message = not_found(two_models.post(path, json={**body, "model": other}, headers=AUTH))
    assert f"it serves {served_there}" in message
    assert f"this endpoint serves '{served_here}'" in message


def test_an_unknown_model_names_nothing(two_models) -> None:
    body = {"model": "nope", "prompt": "x", "max_tokens": 1}
    message = not_found(two_models.post("/v1/fim/completions", json=body, headers=AUTH))
    assert COMPLETER not in message and EDITOR not in message


@pytest.mark.parametrize(
    ("path", "model", "endpoint"),
    [
        ("/v1/decisions/models", COMPLETER, "decisions"),
        ("/v1/fim/completions/models", COMPLETER, "fim.completions"),
        ("/v1/apply/completions/models", EDITOR, "apply.completions"),
        ("/v1/edit/completions/models", EDITOR, "edit.completions"),
    ],
)
def test_each_endpoint_lists_the_model_it_serves(two_models, path, model, endpoint) -> None:
    response = two_models.get(path, headers=AUTH)
    assert response.status_code == 200, response.text
    (card,) = response.json()["data"]
    assert card["id"] == model and endpoint in card["supported_endpoints"]


def test_the_overall_listing_keeps_the_contracts_fields(two_models) -> None:
    cards = two_models.get("/v1/models", headers=AUTH).json()["data"]
    assert {card["id"] for card in cards} == {COMPLETER, EDITOR}
    assert all("supported_endpoints" not in card for card in cards)
