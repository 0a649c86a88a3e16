"""Schema fuzzing: schemathesis generates requests from the app's own /openapi.json.

The app is the real router in-process (the ``client`` fixture's FastAPI app, with the tiny
model behind Serve local-testing handles), driven by schemathesis' ASGI transport. Every
generated request carries the valid test key, so it gets past auth into validation and the
model deployments. Checks: no 5xx (``not_a_server_error``), documented status codes, documented
content types and headers, bodies that match the documented schema for their status, invalid
data rejected with a 4xx, and auth not ignored.

Two adjustments keep the run fast and deep (``_shape``):

- ``max_tokens``/``max_completion_tokens`` that the schema allows (up to 8192, default 512 or
  1024, or what the context leaves for apply; a null or absent ``max_tokens`` means that
  default) are capped at ``MAX_TOKENS``: the tiny model generates a few hundred tokens a second
  on this CPU, so uncapped cases would cost seconds each. Out-of-range values are sent as
  generated.
- The ``model`` field is a free string in the schema, so almost every generated value is
  unknown (404). In positive mode, three in four cases with a string ``model`` get the served
  model's id instead, so generation, scoring and their errors are fuzzed too (and an edit or
  apply case then carries a real prompt, since random text never has the tags).

A failing case is printed with a curl line and hypothesis' seed; the example database
(.hypothesis/) replays it on the next run.

``FUZZ_EXAMPLES`` sets the examples per operation (default 50: about 400 cases in all;
``make fuzz`` runs a longer campaign).
"""

from __future__ import annotations

import os
import time
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from tests.conftest import AUTH, TINY_ID
from tests.fixtures.edit import EXAMPLE_EDIT_CONTENT

FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "50"))
MAX_TOKENS = 8
TOKEN_FIELDS = ("max_tokens", "max_completion_tokens")
OPERATIONS = {
    "POST /v1/decisions",
    "POST /v1/edit/completions",
    "POST /v1/fim/completions",
    "POST /v1/completions",
    "POST /v1/chat/completions",
    "POST /v1/apply/completions",
    "GET /v1/models",
    "GET /v1/chat/completions/models",
    "GET /v1/fim/completions/models",
    "GET /v1/edit/completions/models",
    "GET /v1/apply/completions/models",
    "GET /v1/decisions/models",
}
# A served-model apply case carries a real apply prompt, since random text never has the tags.
APPLY_CONTENT = (
    "<|original_code|>\nx = 1\ny = 2\n<|/original_code|>\n\n"
    "<|update_snippet|>\ny = 3\n<|/update_snippet|>"
)

# The contract answers 400 to requests that fit the JSON schema but break a rule it cannot
# express (top_k is -1 or 1..1000, exactly one edit message, a tool_choice naming a function
# of tools, prompt + max_tokens over the context length), so "schema-valid means 2xx" does
# not hold here by design.
SKIPPED_CHECKS = [positive_data_acceptance]
# A listing has no parameters or body to make invalid (ignored_auth covers its header).
RUNS = [
    (label, mode)
    for label in sorted(OPERATIONS)
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if label.startswith("POST") or mode is GenerationMode.POSITIVE
]
TOTALS: Counter[str] = Counter()


@pytest.fixture(scope="module")
def fuzz_schema(client):
    started = time.monotonic()
    yield schemathesis.openapi.from_asgi("/openapi.json", client.app)
    print(
        f"\nfuzz total: {TOTALS['cases']} cases in {time.monotonic() - started:.1f}s "
        f"({FUZZ_EXAMPLES} examples per operation and mode)"
    )


def test_the_fuzzed_operations_are_the_documented_ones(fuzz_schema):
    documented = {
        f"{operation.method.upper()} {operation.path}"
        for operation in (result.ok() for result in fuzz_schema.get_all_operations())
    }
    assert documented == OPERATIONS


def _shape(case: schemathesis.Case, use_served_model: bool) -> None:
    body = case.body
    if not isinstance(body, dict):
        return
    for field in TOKEN_FIELDS:
        value = body.get(field)
        if field in body and isinstance(value, int) and not isinstance(value, bool):
            if 1 <= value <= 8192:
                body[field] = min(value, MAX_TOKENS)
        elif field == "max_tokens" and value is None and case.path != "/v1/decisions":
            body[field] = MAX_TOKENS  # absent or null: the endpoint's default, up to thousands
    if use_served_model and isinstance(body.get("model"), str):
        body["model"] = TINY_ID
        if case.path == "/v1/edit/completions":
            body["messages"] = [{"role": "user", "content": EXAMPLE_EDIT_CONTENT}]
        if case.path == "/v1/apply/completions":
            body["messages"] = [{"role": "user", "content": APPLY_CONTENT}]


@pytest.mark.parametrize("label, mode", RUNS)
def test_generated_requests_keep_the_contract(fuzz_schema, label, mode):
    method, path = label.split(" ")
    operation = fuzz_schema[path][method]
    strategy = operation.as_strategy(generation_mode=mode, headers=AUTH)
    statuses: Counter[int | str] = Counter()
    started = time.monotonic()

    @given(case=strategy, use_served_model=st.sampled_from([True, True, True, False]))
    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    def run(case: schemathesis.Case, use_served_model: bool) -> None:
        _shape(case, use_served_model and mode is GenerationMode.POSITIVE)
        response = case.call()
        # A generated body over limits.max_body_bytes is refused with 413 before it is read:
        # a rejection, though not a status schemathesis lists for invalid data.
        too_large = [negative_data_rejection] if response.status_code == 413 else []
        case.validate_response(response, excluded_checks=SKIPPED_CHECKS + too_large)
        statuses[response.status_code] += 1
        if response.headers.get("content-type", [""])[0].startswith("text/event-stream"):
            statuses["sse"] += 1
        assert "Traceback" not in response.text

    run()
    cases = sum(count for status, count in statuses.items() if status != "sse")
    TOTALS["cases"] += cases
    print(
        f"\nfuzz {label} {mode.value}: {cases} cases in {time.monotonic() - started:.1f}s, "
        f"statuses {dict(statuses)}"
    )
    # A listing has nothing to vary but extra headers, so hypothesis runs out of cases early.
    assert cases >= (1 if method == "GET" else min(FUZZ_EXAMPLES, 10))
