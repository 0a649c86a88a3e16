"""The HTTP surface: auth errors, listings, OpenAPI, unknown paths, body limit."""

from __future__ import annotations

import json

import pytest

from tests.conftest import AUTH, TINY_ID

SPEC_PATHS = {
    "/v1/decisions": "post",
    "/v1/edit/completions": "post",
    "/v1/fim/completions": "post",
    "/v1/chat/completions": "post",
    "/v1/models": "get",
    "/v1/chat/completions/models": "get",
    "/v1/fim/completions/models": "get",
    "/v1/edit/completions/models": "get",
}
MODEL_FIELDS = {
    "id",
    "name",
    "created",
    "description",
    "input_modalities",
    "output_modalities",
    "context_length",
    "max_output_length",
    "pricing",
    "supported_sampling_parameters",
    "supported_features",
    "openrouter",
    "datacenters",
}


@pytest.mark.parametrize("path, method", sorted(SPEC_PATHS.items()))
@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer sk-sa-wrong"}])
def test_every_endpoint_needs_a_valid_key(client, path, method, headers):
    body = {"model": TINY_ID, "state": "s", "questions": {"q": {"type": "noul"}}}
    if path != "/v1/decisions":
        body = {"model": TINY_ID, "prompt": "x", "messages": [{"role": "user", "content": "x"}]}
    response = client.request(
        method.upper(), path, json=body if method == "post" else None, headers=headers
    )
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
    assert error["param"] is None
    assert "sk-sa-wrong" not in response.text


def test_overall_listing_has_no_supported_endpoints(client):
    response = client.get("/v1/models", headers=AUTH)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"data"}
    (model,) = body["data"]
    assert set(model) == MODEL_FIELDS
    assert model["id"] == TINY_ID
    assert model["openrouter"] == {"slug": "test/tiny-qwen2"}
    assert model["datacenters"] == [{"country_code": "US"}, {"country_code": "DE"}]
    assert all(isinstance(price, str) for price in model["pricing"].values())
    assert set(model["pricing"]) == {
        "prompt",
        "completion",
        "input_cache_reads",
        "input_cache_writes",
    }
    assert "text" in model["input_modalities"] and "text" in model["output_modalities"]


@pytest.mark.parametrize(
    "path, needed",
    [
        ("/v1/chat/completions/models", {"chat.completions"}),
        ("/v1/fim/completions/models", {"fim.completions", "edit.completions"}),
        ("/v1/edit/completions/models", {"edit.completions"}),
    ],
)
def test_endpoint_listings_carry_supported_endpoints(client, path, needed):
    response = client.get(path, headers=AUTH)
    assert response.status_code == 200
    (model,) = response.json()["data"]
    assert set(model) == MODEL_FIELDS | {"supported_endpoints"}
    assert needed <= set(model["supported_endpoints"])


def test_openapi_documents_every_path(client):
    document = client.get("/openapi.json").json()
    assert document["openapi"].startswith("3.1")
    assert document["info"]["version"] == "1.0.0"
    for path, method in SPEC_PATHS.items():
        assert method in document["paths"][path], path
    for path, method in SPEC_PATHS.items():
        documented = set(document["paths"][path][method]["responses"])
        assert ("422" in documented) == (path == "/v1/decisions"), (path, documented)
    schemas = document["components"]["schemas"]
    for name in (
        "DecisionRequest",
        "DecisionResponse",
        "ErrorResponse",
        "FimCompletion",
        "EditCompletion",
        "ChatCompletion",
        "ModelList",
        "EndpointModelList",
    ):
        assert name in schemas, name


def test_unknown_path_is_a_404_error_response(client):
    response = client.get("/v1/nothing-here", headers=AUTH)
    assert response.status_code == 404
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_body_over_the_limit_is_413_before_parsing(client):
    oversized = b"{" + b" " * 1_100_000 + b"}"
    response = client.post(
        "/v1/decisions", content=oversized, headers={**AUTH, "Content-Type": "application/json"}
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


def test_invalid_json_elsewhere_is_400(client):
    response = client.post(
        "/v1/fim/completions",
        content=b"{oops",
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_answers_carry_a_request_id(client):
    response = client.get("/v1/models", headers={**AUTH, "x-request-id": "abc123"})
    assert response.headers["x-request-id"] == "abc123"
    assert len(client.get("/v1/models", headers=AUTH).headers["x-request-id"]) >= 16


def test_health_needs_no_key(client):
    assert client.get("/health").json() == {"status": "ok"}


def test_an_unavailable_backend_is_a_503_that_says_when_to_retry():
    """A replica or node that died (Ray's ActorDiedError) or a full queue: 503 with
    Retry-After, the contract's body, no internals."""
    from ray.exceptions import ActorDiedError
    from ray.serve.exceptions import BackPressureError

    from serve_app.http.errors import as_service_error, error_response

    full = BackPressureError(num_queued_requests=1, max_queued_requests=1)
    for failure in (ActorDiedError(), full):
        response = error_response(as_service_error(failure))
        assert response.status_code == 503
        assert int(response.headers["Retry-After"]) >= 1
        assert json.loads(response.body)["error"]["code"] == "service_unavailable"


def test_an_errors_class_headers_reach_the_wire_and_cross_ray():
    """Headers an error class declares (Retry-After on 503 and 429) are on every answer of it,
    a raise adds to or overrides them, and they survive the pickling that crosses Ray."""
    import pickle

    from serve_app.errors import RateLimitError, UpstreamUnavailableError
    from serve_app.http.errors import error_response

    declared = pickle.loads(pickle.dumps(UpstreamUnavailableError(headers={"X-Why": "full"})))
    assert declared.headers == {"Retry-After": "1", "X-Why": "full"}
    assert error_response(declared).headers["Retry-After"] == "1"
    assert RateLimitError(headers={"Retry-After": "7"}).headers == {"Retry-After": "7"}
