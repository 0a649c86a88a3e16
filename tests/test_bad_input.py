"""Hostile and malformed input over HTTP: always a contract-shaped 4xx, never a 500.

Every answer here must be 400/413/422 with the contract's bodies (ErrorResponse, or
HTTPValidationError on /v1/decisions, api-spec.md 7), carry no traceback, and come back fast.
The router runs in-process with the tiny model (``client`` fixture).
"""

from __future__ import annotations

import json
import time

import pytest

from serve_app.api.common import ErrorResponse, HTTPValidationError
from tests.conftest import AUTH, TINY_ID
from tests.fixtures.edit import EXAMPLE_EDIT_CONTENT

DECISIONS = "/v1/decisions"
POSTS = [DECISIONS, "/v1/edit/completions", "/v1/fim/completions", "/v1/chat/completions"]
JSON = {**AUTH, "Content-Type": "application/json"}


def valid_body(path: str) -> dict:
    return {
        DECISIONS: {"model": TINY_ID, "state": "s", "questions": {"q": {"type": "noul"}}},
        "/v1/edit/completions": {
            "model": TINY_ID,
            "max_tokens": 2,
            "messages": [{"role": "user", "content": EXAMPLE_EDIT_CONTENT}],
        },
        "/v1/fim/completions": {"model": TINY_ID, "prompt": "def f(", "max_tokens": 2},
        "/v1/chat/completions": {
            "model": TINY_ID,
            "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}],
        },
    }[path]


def post(client, path: str, content: bytes, headers: dict | None = None):
    return client.post(path, content=content, headers=headers or JSON)


def assert_contract_error(response, path: str, param: str | None = "any") -> dict:
    """A 4xx in the contract's shape; returns the parsed body.

    ``param``: the ``param`` an ErrorResponse must name ("any" = don't check).
    """
    assert response.status_code in (400, 413, 422), (response.status_code, response.text[:500])
    assert "Traceback" not in response.text and 'File "' not in response.text
    body = response.json()
    if path == DECISIONS and response.status_code != 413:
        assert response.status_code == 422, response.text[:500]  # 7.1 lists no 400
        if "detail" in body:
            HTTPValidationError.model_validate(body)
            return body
    else:
        assert response.status_code in (400, 413), response.text[:500]
    error = ErrorResponse.model_validate(body).error
    assert error.type == "invalid_request_error"
    if param != "any":
        assert error.param == param, body
    return body


# --- not JSON at all ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", POSTS)
@pytest.mark.parametrize(
    "content",
    [b'{"model": ', b"{", b"{'model': 'x'}", b'{"model": "x",}', b"NaN", b"\x00\x01", b""],
    ids=["truncated", "open-brace", "single-quotes", "trailing-comma", "nan", "binary", "empty"],
)
def test_invalid_json_is_a_contract_error(client, path, content):
    body = assert_contract_error(post(client, path, content), path)
    if path != DECISIONS and content not in (b"", b"NaN"):
        # the offset of the syntax error is not a request field
        assert body["error"]["param"] is None
        assert body["error"]["message"].startswith("The request body ")


@pytest.mark.parametrize("path", POSTS)
@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
)
def test_a_json_body_under_another_content_type_is_a_contract_error(client, path, content_type):
    content = json.dumps(valid_body(path)).encode()
    response = post(client, path, content, {**AUTH, "Content-Type": content_type})
    body = assert_contract_error(response, path)
    # The error says what to change (FastAPI's own: "a valid dictionary or object").
    assert "Content-Type: application/json" in json.dumps(body)


@pytest.mark.parametrize("path", POSTS)
def test_a_form_body_is_a_contract_error(client, path):
    response = client.post(path, data={"model": TINY_ID, "prompt": "x"}, headers=AUTH)
    assert_contract_error(response, path)


@pytest.mark.parametrize("path", POSTS)
@pytest.mark.parametrize(
    "raw",
    [b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"],
    ids=["bom-bytes", "bad-continuation", "surrogate", "five-byte"],
)
def test_invalid_utf8_is_a_contract_error(client, path, raw):
    content = b'{"model": "' + raw + b'", "prompt": "x", "state": "s"}'
    body = assert_contract_error(post(client, path, content), path)
    assert "server_error" not in json.dumps(body)


# --- valid JSON, wrong shape ---------------------------------------------------------------


@pytest.mark.parametrize("path", POSTS)
@pytest.mark.parametrize("document", ["null", "[]", "[{}]", '"text"', "42", "true"])
def test_a_body_that_is_not_an_object_is_a_contract_error(client, path, document):
    assert_contract_error(post(client, path, document.encode()), path)


@pytest.mark.parametrize("path", POSTS)
def test_the_valid_body_wrapped_in_an_array_is_a_contract_error(client, path):
    assert_contract_error(post(client, path, json.dumps([valid_body(path)]).encode()), path)


@pytest.mark.parametrize(
    "path, field, value",
    [
        (DECISIONS, "questions", []),
        (DECISIONS, "questions", [{"type": "noul"}]),
        (DECISIONS, "questions", {"q": []}),
        (DECISIONS, "state", None),
        ("/v1/edit/completions", "messages", {"role": "user", "content": "x"}),
        ("/v1/edit/completions", "messages", None),
        ("/v1/fim/completions", "prompt", ["def f("]),
        ("/v1/fim/completions", "stop", {"a": "b"}),
        ("/v1/fim/completions", "stream_options", []),
        ("/v1/chat/completions", "messages", {"role": "user", "content": "x"}),
        ("/v1/chat/completions", "messages", [["user", "hi"]]),
        ("/v1/chat/completions", "response_format", []),
    ],
)
def test_arrays_for_objects_and_back_name_the_field(client, path, field, value):
    body = {**valid_body(path), field: value}
    answer = assert_contract_error(post(client, path, json.dumps(body).encode()), path)
    if path == DECISIONS:
        assert any(item["loc"][:2] == ["body", field] for item in answer["detail"]), answer
    else:
        assert answer["error"]["param"] == field


@pytest.mark.parametrize("path", POSTS)
def test_null_for_every_field_is_a_contract_error(client, path):
    body = {field: None for field in valid_body(path)}
    assert_contract_error(post(client, path, json.dumps(body).encode()), path)


# --- numbers JSON can write but Python floats and ints cannot hold ----------------------------


@pytest.mark.parametrize(
    "path, field",
    [
        (DECISIONS, "state"),
        ("/v1/edit/completions", "temperature"),
        ("/v1/edit/completions", "max_tokens"),
        ("/v1/fim/completions", "temperature"),
        ("/v1/fim/completions", "top_p"),
        ("/v1/fim/completions", "max_tokens"),
        ("/v1/chat/completions", "temperature"),
        ("/v1/chat/completions", "max_tokens"),
    ],
)
@pytest.mark.parametrize(
    "literal",
    ["1e309", "-1e309", "1" + "0" * 400, "1" + "0" * 5000],
    ids=["1e309", "-1e309", "10**400", "10**5000"],
)
def test_huge_numbers_are_contract_errors(client, path, field, literal):
    """1e309 parses to inf (JSON cannot write it back: rendering the 422 echo was a 500);
    10**400 is a fine Python int; 10**5000 passes Python's int-parsing digit limit."""
    body = {**valid_body(path), field: "__number__"}
    content = json.dumps(body).replace('"__number__"', literal).encode()
    answer = assert_contract_error(post(client, path, content), path)
    if path != DECISIONS and len(literal) < 4300:
        assert answer["error"]["param"] == field


@pytest.mark.parametrize("path", ["/v1/fim/completions", "/v1/chat/completions"])
@pytest.mark.parametrize(
    "seed", [10**400, 2**64, -(2**70), -1], ids=["10**400", "2**64", "-2**70", "-1"]
)
def test_any_integer_seed_is_accepted_and_reproducible(client, path, seed):
    """Seeds beyond torch's 64 bits overflowed manual_seed (a 500); now reduced mod 2**64."""
    body = {**valid_body(path), "temperature": 1.0, "max_tokens": 4, "seed": "__seed__"}
    content = json.dumps(body).replace('"__seed__"', str(seed)).encode()
    first, second = post(client, path, content), post(client, path, content)
    assert first.status_code == second.status_code == 200, first.text[:300]
    text = "text" if path == "/v1/fim/completions" else "message"
    assert first.json()["choices"][0][text] == second.json()["choices"][0][text]


@pytest.mark.parametrize(
    "path, params",
    [
        ("/v1/edit/completions", {"temperature": 1e-300}),
        ("/v1/fim/completions", {"temperature": 5e-324}),
        ("/v1/fim/completions", {"temperature": 1.0, "repetition_penalty": 1e-300}),
        ("/v1/fim/completions", {"temperature": 2.0, "repetition_penalty": 1e300}),
        ("/v1/fim/completions", {"temperature": 2.0, "top_p": 5e-324, "top_k": 1000}),
        ("/v1/chat/completions", {"temperature": 1e-300}),
    ],
)
def test_extreme_but_valid_sampling_parameters_generate(client, path, params):
    """Overflowing logits to inf made softmax NaN and multinomial raise: a 500 before."""
    body = {**valid_body(path), **params, "max_tokens": 4}
    response = post(client, path, json.dumps(body).encode())
    assert response.status_code == 200, response.text[:300]
    assert response.json()["usage"]["completion_tokens"] >= 1


# --- nesting ---------------------------------------------------------------------------------


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize(
    "path, field",
    [
        (DECISIONS, "state"),
        ("/v1/edit/completions", "messages"),
        ("/v1/fim/completions", "prompt"),
        ("/v1/chat/completions", "messages"),
    ],
)
@pytest.mark.parametrize("depth", [10_000, 100_000])
def test_json_nested_past_the_parser_limit_is_a_contract_error(client, path, field, depth):
    body = {**valid_body(path), field: "__deep__"}
    content = json.dumps(body).replace('"__deep__"', nested(depth)).encode()
    started = time.monotonic()
    response = post(client, path, content)
    assert time.monotonic() - started < 5
    answer = assert_contract_error(response, path)
    if response.status_code == 400:
        assert answer["error"]["message"] == "The request body could not be read as JSON."


@pytest.mark.parametrize(
    "path, body, param, says",
    [
        (DECISIONS, {"state": "__deep__"}, "state", "at most 64 levels"),
        (
            DECISIONS,
            {"questions": {"q": {"type": "noul", "instructions": "__deep__"}}},
            None,
            "at most 64 levels",
        ),
        (
            "/v1/chat/completions",
            {"response_format": {"type": "json_schema", "json_schema": {"schema": "__deep__"}}},
            "response_format",
            "64 levels",
        ),
        (
            "/v1/chat/completions",
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": "__deep__"}}]},
            "tools",
            "64 levels",
        ),
    ],
)
@pytest.mark.parametrize("depth", [65, 200, 800])
def test_json_nested_deeper_than_64_levels_is_refused(client, path, body, param, says, depth):
    """Parseable but deep: decisions cap free-form JSON at 64 levels, and so does chat, whose
    response_format schema reaches the model deployment (pickling a 600-level value there
    raised RecursionError: a 500)."""
    document = json.dumps({**valid_body(path), **body})
    document = document.replace('"__deep__"', '{"a": ' + nested(depth - 1) + "}")
    answer = assert_contract_error(post(client, path, document.encode()), path)
    if path == DECISIONS:
        assert says in json.dumps(answer)
    else:
        assert answer["error"]["param"] == param
        assert says in answer["error"]["message"]


@pytest.mark.parametrize(
    "path, body, expected",
    [
        # the rendered state is long (one indented line per level) for the tiny context
        (DECISIONS, {"state": "__deep__"}, (200, "context_length_exceeded")),
        # reaches the model deployment: constrained decoding on a schema of unknown keywords
        (
            "/v1/chat/completions",
            {"response_format": {"type": "json_schema", "json_schema": {"schema": "__deep__"}}},
            (200,),
        ),
    ],
)
def test_json_nested_64_levels_passes_validation(client, path, body, expected):
    document = json.dumps({**valid_body(path), **body})
    document = document.replace('"__deep__"', '{"a": ' + nested(62) + "}")
    response = post(client, path, document.encode())
    if response.status_code == 200:
        assert 200 in expected
    else:
        answer = assert_contract_error(response, path)
        assert "levels" not in response.text
        assert any(str(word) in json.dumps(answer) for word in expected), answer


# --- empty and many ---------------------------------------------------------------------------


@pytest.mark.parametrize("path", POSTS)
def test_empty_strings_everywhere_is_a_contract_error(client, path):
    def empty(value):
        if isinstance(value, str):
            return ""
        if isinstance(value, dict):
            return {
                ("" if key not in ("type", "role") else key): empty(item)
                for key, item in value.items()
            }
        if isinstance(value, list):
            return [empty(item) for item in value]
        return value

    body = empty(valid_body(path))
    answer = assert_contract_error(post(client, path, json.dumps(body).encode()), path)
    if path == DECISIONS:
        assert ["body", "model"] in [item["loc"] for item in answer["detail"]]
    else:
        assert answer["error"]["param"] == "model"


@pytest.mark.parametrize(
    "path, body, expected",
    [
        ("/v1/fim/completions", {"prompt": "", "suffix": "", "stop": [""]}, 200),
        ("/v1/fim/completions", {"prompt": "", "stop": ""}, 200),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": ""}]}, 200),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": []}]}, 200),
        ("/v1/edit/completions", {"messages": [{"role": "user", "content": ""}]}, 400),
        (DECISIONS, {"state": "", "questions": {"": {"type": "noul", "instructions": ""}}}, 200),
        (
            DECISIONS,
            {
                "state": "",
                "questions": {
                    "a": {"type": "choice", "criteria": {"": ""}},
                    "b": {"type": "score", "criteria": [""]},
                },
            },
            200,
        ),
    ],
)
def test_empty_strings_with_the_real_model_answer_or_refuse_cleanly(client, path, body, expected):
    response = post(client, path, json.dumps({**valid_body(path), **body}).encode())
    assert response.status_code == expected, response.text[:300]
    if expected != 200:
        assert_contract_error(response, path, param="messages")
    elif path == DECISIONS:
        assert set(response.json()["answers"]) == set(body["questions"])


def test_ten_thousand_questions_are_refused_fast(client):
    questions = {f"q{i}": {"type": "noul"} for i in range(10_000)}
    body = {**valid_body(DECISIONS), "questions": questions}
    started = time.monotonic()
    response = post(client, DECISIONS, json.dumps(body).encode())
    elapsed = time.monotonic() - started
    answer = assert_contract_error(response, DECISIONS)
    # Past the schema's 4,096 a validation error (limits.max_questions, 32 here, is checked
    # on arrival for what the schema admits).
    assert answer["detail"][0]["loc"][-1] == "questions"
    assert answer["detail"][0]["type"] == "too_long"
    assert elapsed < 5, elapsed


def test_a_request_with_too_many_json_values_is_refused_while_validated(client):
    # A 600 KB body: the byte limit admits it, but walking and handing on millions of values
    # would hold the router's event loop (15M zeros held it 28 s).
    body = {**valid_body(DECISIONS), "state": [0] * 300_000}
    answer = assert_contract_error(post(client, DECISIONS, json.dumps(body).encode()), DECISIONS)
    assert "more than 262144 JSON values" in json.dumps(answer)
    chat = {**valid_body("/v1/chat/completions"), "messages": [{"role": "user"}] * 10_001}
    response = post(client, "/v1/chat/completions", json.dumps(chat).encode())
    answer = assert_contract_error(response, "/v1/chat/completions")
    assert answer["error"]["param"] == "messages" and "10000" in answer["error"]["message"]


def test_a_choice_with_too_many_labels_is_refused(client):
    criteria = {str(label): None for label in range(256)}
    body = {**valid_body(DECISIONS), "questions": {"q": {"type": "choice", "criteria": criteria}}}
    answer = assert_contract_error(post(client, DECISIONS, json.dumps(body).encode()), DECISIONS)
    assert answer["detail"][0]["type"] == "too_long"


def test_the_service_still_answers_after_the_abuse(client):
    for path in POSTS:
        response = post(client, path, json.dumps(valid_body(path)).encode())
        assert response.status_code == 200, (path, response.text[:300])
