"""Edit, FIM and chat over HTTP: validation bounds, error bodies, JSON and SSE shapes."""

from __future__ import annotations

import json

import pytest

from tests.conftest import AUTH, TINY_ID
from tests.fixtures.edit import EXAMPLE_EDIT_CONTENT

FIM = {"model": TINY_ID, "prompt": "def add(a, b):\n    return", "suffix": "\n", "max_tokens": 4}
EDIT = {
    "model": TINY_ID,
    "messages": [{"role": "user", "content": EXAMPLE_EDIT_CONTENT}],
    "max_tokens": 4,
}
CHAT = {"model": TINY_ID, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}


def assert_invalid(response, param: str, code: str | None = None) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    if code:
        assert error["code"] == code
    return error


def sse_events(response) -> list[str]:
    return [
        line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")
    ]


# --- FIM ----------------------------------------------------------------------------------


def test_fim_completion_shape(client):
    response = client.post("/v1/fim/completions", json=FIM, headers=AUTH)
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    assert body["object"] == "text_completion" and body["model"] == TINY_ID
    (choice,) = body["choices"]
    assert set(choice) == {"index", "text", "finish_reason"}
    assert choice["finish_reason"] in {"stop", "length"}
    usage = body["usage"]
    assert set(usage) == {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "reasoning_tokens",
        "cached_input_tokens",
    }
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert 1 <= usage["completion_tokens"] <= 4


def test_fim_stream_shape_with_usage(client):
    body = {**FIM, "stream": True, "stream_options": {"include_usage": True}}
    response = client.post("/v1/fim/completions", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    *content, usage_chunk = chunks
    assert content and all(chunk["object"] == "text_completion" for chunk in chunks)
    assert all("usage" not in chunk for chunk in content)
    assert [c["choices"][0]["finish_reason"] for c in content][-1] in {"stop", "length"}
    assert all(c["choices"][0]["finish_reason"] is None for c in content[:-1])
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] >= 1


def test_fim_stream_without_usage_has_no_usage_chunk(client):
    response = client.post("/v1/fim/completions", json={**FIM, "stream": True}, headers=AUTH)
    events = sse_events(response)
    assert events[-1] == "[DONE]"
    assert all(json.loads(event)["choices"] for event in events[:-1])


@pytest.mark.parametrize(
    "field, value, ok",
    [
        ("top_k", -1, True),
        ("top_k", 0, False),
        ("top_k", 1, True),
        ("top_k", 1000, True),
        ("top_k", 1001, False),
        ("top_k", -2, False),
        ("repetition_penalty", 0, False),
        ("repetition_penalty", 0.5, True),
        ("max_tokens", 0, False),
        ("max_tokens", 1, True),
        ("max_tokens", 8193, False),
        ("top_p", 1.0, True),
        ("top_p", 1.01, False),
        ("frequency_penalty", 2.0, True),
        ("frequency_penalty", 2.01, False),
        ("presence_penalty", -2.0, True),
        ("presence_penalty", -2.01, False),
        ("temperature", 2.01, False),
    ],
)
def test_fim_parameter_bounds(client, field, value, ok):
    response = client.post("/v1/fim/completions", json={**FIM, field: value}, headers=AUTH)
    if ok:
        assert response.status_code == 200, response.text
    else:
        assert_invalid(response, field)


def test_fim_max_tokens_8192_passes_validation_and_meets_the_context(client):
    response = client.post("/v1/fim/completions", json={**FIM, "max_tokens": 8192}, headers=AUTH)
    # The schema accepts 8192; the tiny model's 4096-token context then refuses it.
    assert_invalid(response, "prompt", "context_length_exceeded")
    assert "maximum context length for this model of 4096" in response.json()["error"]["message"]


def test_fim_answer_leaving_no_room_for_the_prompt(client):
    # A prompt over the context is cut near the cursor (test_fim_prompt.py); an answer that
    # takes the whole context leaves nothing to cut to.
    body = {**FIM, "prompt": "x = 1\n", "max_tokens": 4095}
    assert_invalid(
        client.post("/v1/fim/completions", json=body, headers=AUTH),
        "prompt",
        "context_length_exceeded",
    )


def test_fim_requires_prompt(client):
    body = {k: v for k, v in FIM.items() if k != "prompt"}
    assert_invalid(client.post("/v1/fim/completions", json=body, headers=AUTH), "prompt")


def test_fim_unknown_model(client):
    response = client.post("/v1/fim/completions", json={**FIM, "model": "nope"}, headers=AUTH)
    assert response.status_code == 404
    assert response.json()["error"] == {
        "message": response.json()["error"]["message"],
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }


# --- edit ---------------------------------------------------------------------------------


def test_edit_completion_shape(client):
    response = client.post("/v1/edit/completions", json=EDIT, headers=AUTH)
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"id", "object", "created", "model", "choices", "usage"}
    assert body["object"] == "edit.completion"
    assert body["id"].startswith("cmpl-")
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant"
    assert choice["finish_reason"] in {"stop", "length"}
    content = choice["message"]["content"]
    # The region in a plain fence, nothing else: no language tag, no tags, no cursor.
    assert content.startswith("```\n") and content.endswith("\n```")
    region = content[4:-4]
    assert "<|" not in region and "```" not in region
    assert set(body["usage"]) == {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "reasoning_tokens",
        "cached_input_tokens",
    }


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [{"role": "user", "content": EXAMPLE_EDIT_CONTENT}] * 2,
        [{"role": "assistant", "content": EXAMPLE_EDIT_CONTENT}],
        [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
        [{"role": "user", "content": "no tags at all"}],
        [{"role": "user", "content": EXAMPLE_EDIT_CONTENT.replace("<|cursor|>", "")}],
    ],
    ids=["none", "two", "assistant", "parts", "no-tags", "no-cursor"],
)
def test_edit_rejects_bad_messages(client, messages):
    response = client.post(
        "/v1/edit/completions", json={**EDIT, "messages": messages}, headers=AUTH
    )
    error = assert_invalid(response, "messages")
    assert error["message"]


@pytest.mark.parametrize(
    "field, value, ok",
    [
        ("max_tokens", 0, False),
        ("max_tokens", 1, True),
        ("max_tokens", 8193, False),
        ("temperature", 2.0, True),
        ("temperature", 2.01, False),
        ("temperature", -0.01, False),
        ("top_p", 0.0, True),
        ("top_p", 1.01, False),
        ("presence_penalty", 2.0, True),
        ("presence_penalty", 2.01, False),
        ("stream", True, False),
    ],
)
def test_edit_parameter_bounds(client, field, value, ok):
    response = client.post("/v1/edit/completions", json={**EDIT, field: value}, headers=AUTH)
    if ok:
        assert response.status_code == 200, response.text
    else:
        assert_invalid(response, field)


# --- chat ---------------------------------------------------------------------------------


def test_chat_completion_shape(client):
    response = client.post("/v1/chat/completions", json=CHAT, headers=AUTH)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["choices"][0]["finish_reason"] in {"stop", "length"}
    assert body["usage"]["prompt_tokens"] > 0


def test_chat_stream_shape(client):
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    events = sse_events(client.post("/v1/chat/completions", json=body, headers=AUTH))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] in {"stop", "length"}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0


NULLABLE = {  # optional fields a client may send as null (the openai SDK does for None)
    "/v1/fim/completions": (FIM, ["top_p", "top_k", "frequency_penalty", "presence_penalty",
                                  "repetition_penalty", "n", "echo", "stream", "temperature"]),
    "/v1/chat/completions": (CHAT, ["temperature", "top_p", "frequency_penalty",
                                    "presence_penalty", "n", "stream", "diffusing", "realtime"]),
    "/v1/edit/completions": (EDIT, ["temperature", "top_p", "presence_penalty", "stream"]),
}  # fmt: skip


@pytest.mark.parametrize("path", list(NULLABLE))
def test_null_on_an_optional_field_means_its_default(client, path):
    base, fields = NULLABLE[path]
    response = client.post(path, json={**base, **dict.fromkeys(fields)}, headers=AUTH)
    assert response.status_code == 200, response.text
    assert response.json()["object"] != "chat.completion.chunk"  # stream null = not streamed
    nameless = client.post(path, json={**base, "model": None}, headers=AUTH)
    assert_invalid(nameless, "model")  # a required field stays required


def test_chat_without_max_tokens_answers_in_what_the_context_leaves(client):
    # ~3,400 prompt tokens in the tiny model's 4,096: the 1,024-token default does not fit,
    # so the answer gets the room left (OpenAI's behaviour), not a context-length error.
    body = {"model": TINY_ID, "messages": [{"role": "user", "content": "ab " * 1700}]}
    response = client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] + 1024 > 4096
    assert usage["prompt_tokens"] + usage["completion_tokens"] <= 4096


def test_chat_accepts_diffusion_extensions(client):
    body = {
        **CHAT,
        "diffusing": True,
        "realtime": True,
        "reasoning_effort": "low",
        "reasoning_summary": True,
    }
    assert client.post("/v1/chat/completions", json=body, headers=AUTH).status_code == 200


# --- chat JSON modes (constrained decoding; the tiny model's random weights still give JSON) --

# Bounded values (enforced while decoding), so the random weights finish an answer.
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
}


def test_chat_json_object_output_parses(client):
    """The random weights may write one object forever: an answer that ends parses, one cut
    by max_tokens says so (the embedded model's own: tests/test_openai_sdk.py)."""
    body = {**CHAT, "max_tokens": 40, "seed": 0, "response_format": {"type": "json_object"}}
    response = client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    content = choice["message"]["content"]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(content), dict)
    else:
        assert choice["finish_reason"] == "length" and content.startswith("{")


def test_chat_json_schema_output_validates(client):
    import jsonschema

    response_format = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    body = {**CHAT, "max_tokens": 60, "temperature": 1.0, "response_format": response_format}
    for seed in range(3):
        response = client.post("/v1/chat/completions", json={**body, "seed": seed}, headers=AUTH)
        assert response.status_code == 200, response.text
        jsonschema.validate(json.loads(response.json()["choices"][0]["message"]["content"]), PERSON)


def test_chat_json_stream_concatenates_to_json(client):
    response_format = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    body = {**CHAT, "max_tokens": 60, "stream": True, "response_format": response_format}
    events = sse_events(client.post("/v1/chat/completions", json=body, headers=AUTH))
    chunks = [json.loads(event) for event in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert isinstance(json.loads(text), dict)


def test_chat_schema_that_admits_nothing_is_400(client):
    schema = {"type": "string", "enum": []}
    response_format = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    body = {**CHAT, "response_format": response_format}
    response = client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert_invalid(response, "response_format.json_schema.schema")
