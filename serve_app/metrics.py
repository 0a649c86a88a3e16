"""Prometheus metrics, through Ray Serve's metrics API (exported by every Ray node).

Ray prefixes names with ``ray_`` and counters get ``_total`` in Prometheus, so
``serve_app_requests`` is scraped as ``ray_serve_app_requests_total``. Ray Serve adds the
``deployment``, ``replica`` and ``application`` tags itself (they are reserved). Objects are
created on first use in each process (each replica has its own), never at import time.
"""

from __future__ import annotations

from functools import cache

from ray.serve import metrics

LATENCY_MS = [5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 120000]
GAP_MS = [10, 25, 50, 100, 150, 250, 400, 700, 1000, 2000, 5000]


@cache
def requests() -> metrics.Counter:
    return metrics.Counter(
        "serve_app_requests",
        description="HTTP requests by endpoint, model and status code.",
        tag_keys=("endpoint", "model", "status"),
    )


@cache
def request_latency() -> metrics.Histogram:
    return metrics.Histogram(
        "serve_app_request_latency_ms",
        description="Time from request to complete response (ms), by endpoint.",
        boundaries=LATENCY_MS,
        tag_keys=("endpoint",),
    )


@cache
def tokens() -> metrics.Counter:
    return metrics.Counter(
        "serve_app_tokens",
        description="Tokens processed, by direction (input/output), endpoint and model.",
        tag_keys=("direction", "endpoint", "model"),
    )


@cache
def auth_rejections() -> metrics.Counter:
    return metrics.Counter(
        "serve_app_auth_rejections",
        description="Requests refused by the auth service, by reason (the error code).",
        tag_keys=("reason",),
    )


@cache
def time_to_first_token() -> metrics.Histogram:
    return metrics.Histogram(
        "serve_app_time_to_first_token_ms",
        description="Time from admission to the first generated text (ms).",
        boundaries=LATENCY_MS,
    )


@cache
def inter_token_latency() -> metrics.Histogram:
    return metrics.Histogram(
        "serve_app_inter_token_latency_ms",
        description="Gap between consecutive streamed pieces of one request (ms).",
        boundaries=GAP_MS,
    )


@cache
def engine_gauge(name: str) -> metrics.Gauge:
    return metrics.Gauge(
        f"serve_app_engine_{name}",
        description=f"Engine {name.replace('_', ' ')} in this replica.",
    )


@cache
def prefix_cache_hits() -> metrics.Counter:
    return metrics.Counter(
        "serve_app_prefix_cache_hit_tokens",
        description="Prompt tokens served from the prefix cache instead of recomputed.",
    )


@cache
def speculative_tokens() -> metrics.Counter:
    """Acceptance rate = rate(outcome="accepted") / rate(outcome="drafted"); the draft
    model's alone: model_accepted / model_drafted (included in the first two)."""
    return metrics.Counter(
        "serve_app_speculative_tokens",
        description="Draft tokens by outcome: drafted/accepted (every draft), "
        "model_drafted/model_accepted (the draft model's).",
        tag_keys=("outcome",),
    )


@cache
def edit_rejections() -> metrics.Counter:
    return metrics.Counter(
        "serve_app_edit_rejections",
        description="Next-edit answers replaced by 'no change' before they were sent, by "
        "reason (serve_app/prompts/next_edit/checks.py).",
        tag_keys=("reason",),
    )
