"""The service's metrics reach Ray's Prometheus endpoint on the real graph."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.graph import MODEL, auth
from tests.ray_admin import RayAdmin

pytestmark = pytest.mark.ray

EXPECTED = (
    "ray_serve_app_requests_total",
    "ray_serve_app_request_latency_ms",
    "ray_serve_app_tokens_total",
    "ray_serve_app_auth_rejections_total",
    "ray_serve_app_time_to_first_token_ms",
    "ray_serve_app_engine_running_requests",
    "ray_serve_app_engine_prefix_cache_bytes",
)


def test_metrics_are_exported(graph):
    url = graph["url"]
    body = {"model": MODEL, "prompt": "def f(", "max_tokens": 4, "stream": True}
    with httpx.stream(
        "POST", url + "/v1/fim/completions", json=body, headers=auth(), timeout=60
    ) as response:
        assert response.status_code == 200
        response.read()
    assert httpx.get(url + "/v1/models", headers=auth("sk-sa-wrong")).status_code == 401

    admin = RayAdmin(graph["ray_address"])
    try:
        ports = admin.command("metrics")["ports"]
    finally:
        admin.close()
    # Ray exports every few seconds: wait for the names and for this test's own labels (an
    # earlier test's requests may have made the names exist already).
    labels = ['reason="invalid_api_key"', 'endpoint="/v1/fim/completions"']
    deadline, missing, text = time.monotonic() + 60, [*EXPECTED, *labels], ""
    while missing and time.monotonic() < deadline:
        text = "".join(httpx.get(f"http://127.0.0.1:{p}/metrics", timeout=10).text for p in ports)
        missing = [name for name in [*EXPECTED, *labels] if name not in text]
        time.sleep(2)
    assert not missing, missing
