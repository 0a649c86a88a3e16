"""The requests real clients send (clients.md), on the tiny model: shapes, fields and errors.

What the answers say is checked on the embedded model in test_clients_behaviour.py; here the
point is that each client's exact request is accepted and its parser survives the answer.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai import OpenAI

from tests.clients import (
    CONTINUE_HEADERS,
    CONTINUE_STOP,
    continue_apply_messages,
    continue_apply_text,
    continue_stream_texts,
    sse_chunks,
    tagged_apply,
    updated_code,
)
from tests.conftest import AUTH, TEST_KEY, TINY_ID

ORIGINAL = "import os\n\n\ndef main():\n    print('hi')\n\n\nif __name__ == '__main__':\n    main()"
SNIPPET = "# ... existing code ...\ndef main():\n    print('hello')\n# ... existing code ..."
MERGED = ORIGINAL.replace("print('hi')", "print('hello')")
TAGGED = tagged_apply(ORIGINAL, SNIPPET)
CONTINUE_APPLY = continue_apply_messages(ORIGINAL, SNIPPET)


# --- POST /v1/completions ------------------------------------------------------------------


def test_continue_autocomplete_request_streams_on_v1_completions(client):
    body = {
        "model": TINY_ID,
        "prompt": "def add(a, b):\n    return ",
        "suffix": "<|endoftext|>",
        "max_tokens": 8,
        "temperature": 0.01,
        "stop": CONTINUE_STOP,
        "stream": True,
    }
    response = client.post("/v1/completions", json=body, headers=CONTINUE_HEADERS)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    texts = continue_stream_texts(response)
    assert texts and all(stop not in "".join(texts) for stop in CONTINUE_STOP)


def test_every_stream_chunk_has_choices(client):
    body = {"model": TINY_ID, "prompt": "x = ", "max_tokens": 4, "stream": True}
    body["stream_options"] = {"include_usage": True}
    chunks = sse_chunks(client.post("/v1/completions", json=body, headers=AUTH))
    assert all("choices" in chunk for chunk in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] >= 1


def test_v1_completions_answers_as_the_fim_path(client):
    body = {"model": TINY_ID, "prompt": "def f(", "suffix": "\n", "max_tokens": 5, "seed": 3}
    legacy = client.post("/v1/completions", json=body, headers=AUTH).json()
    fim = client.post("/v1/fim/completions", json=body, headers=AUTH).json()
    assert legacy["object"] == fim["object"] == "text_completion"
    assert legacy["choices"] == fim["choices"]  # greedy: the same request, the same answer
    for count in ("prompt_tokens", "completion_tokens"):
        assert legacy["usage"][count] == fim["usage"][count]


def test_openai_legacy_fields_at_honourable_values_are_accepted(client):
    body = {"model": TINY_ID, "prompt": "x", "max_tokens": 2}
    legacy = {"n": 1, "echo": False, "logprobs": None, "best_of": 1, "user": "someone"}
    response = client.post("/v1/completions", json={**body, **legacy}, headers=AUTH)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(
    "field, value", [("n", 2), ("echo", True), ("logprobs", 0), ("logprobs", 5), ("best_of", 2)]
)
def test_openai_legacy_fields_that_cannot_be_honoured_are_refused(client, field, value):
    body = {"model": TINY_ID, "prompt": "x", "max_tokens": 2, field: value}
    for path in ("/v1/completions", "/v1/fim/completions"):
        response = client.post(path, json=body, headers=AUTH)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == field and error["type"] == "invalid_request_error"


# --- FIM text markers ----------------------------------------------------------------------


def prompt_tokens(client, prompt: str, suffix: str | None = "\n") -> int:
    body = {"model": TINY_ID, "prompt": prompt, "suffix": suffix, "max_tokens": 1}
    response = client.post("/v1/completions", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()["usage"]["prompt_tokens"]


def test_kilo_leading_fim_prefix_is_the_marker_not_text(client):
    assert prompt_tokens(client, "<|fim_prefix|>def add(a, b):") == prompt_tokens(
        client, "def add(a, b):"
    )


def test_continue_endoftext_suffix_is_an_empty_suffix(client):
    assert prompt_tokens(client, "x = 1", "<|endoftext|>") == prompt_tokens(client, "x = 1", "")


def test_file_sep_context_costs_its_markers_once(client):
    # <|file_sep|> is one token; the path and newline are text; <|fim_prefix|> is not repeated.
    with_context = prompt_tokens(client, "<|file_sep|>a.py\n<|fim_prefix|>", "<|endoftext|>")
    bare = prompt_tokens(client, "", "")
    path_tokens = prompt_tokens(client, "a.py\n", "") - bare
    assert with_context == bare + 1 + path_tokens


def test_marker_text_inside_code_stays_plain_text(client):
    # As a control token it would cost 1; as plain text it is several ordinary tokens.
    assert prompt_tokens(client, "a<|fim_middle|>b") - prompt_tokens(client, "ab") > 1
    assert prompt_tokens(client, "x", "<|endoftext|>y") > prompt_tokens(client, "x", "y") + 1


# --- LiteLLM and the openai SDK ------------------------------------------------------------


def test_litellm_fim_request(client):
    """LiteLLM's FIM: an OpenAI text completion against base /v1/fim, no temperature."""
    body = {
        "model": TINY_ID,
        "prompt": "def add(a, b):\n",
        "suffix": "\n",
        "max_tokens": 6,
        "top_p": 0.9,
        "frequency_penalty": 0.1,
        "presence_penalty": 0.2,
        "stop": ["\n\n"],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = sse_chunks(client.post("/v1/fim/completions", json=body, headers=AUTH))
    assert chunks[-1]["usage"]["total_tokens"] > 0
    assert all(chunk["object"] == "text_completion" for chunk in chunks)


@pytest.mark.parametrize("base", ["/v1", "/v1/fim"])
def test_openai_sdk_completions_with_suffix(client, base):
    sdk = OpenAI(base_url=f"http://testserver{base}", api_key=TEST_KEY, http_client=client)
    completion = sdk.completions.create(
        model=TINY_ID, prompt="def add(a, b):\n", suffix="\n", max_tokens=4
    )
    assert completion.object == "text_completion"
    assert completion.choices[0].finish_reason in {"stop", "length"}
    streamed = sdk.completions.create(
        model=TINY_ID, prompt="def add(a, b):\n", suffix="\n", max_tokens=4, stream=True
    )
    text = "".join(chunk.choices[0].text for chunk in streamed if chunk.choices)
    assert text == completion.choices[0].text


def test_chat_accepts_continue_and_litellm_extra_fields(client):
    body = {
        "model": TINY_ID,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
        "nextEdit": False,
        "reasoning_effort": "low",
        "reasoning_summary": True,
        "reasoning_summary_wait": True,
        "diffusing": True,
        "realtime": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response = client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    assert sse_chunks(response)[-1]["usage"]["completion_tokens"] >= 1


def test_chat_user_text_cannot_write_turn_markers(client):
    def cost(text: str) -> int:
        body = {"model": TINY_ID, "messages": [{"role": "user", "content": text}], "max_tokens": 1}
        response = client.post("/v1/chat/completions", json=body, headers=AUTH)
        assert response.status_code == 200, response.text
        return response.json()["usage"]["prompt_tokens"]

    assert cost("a<|im_end|>b") - cost("ab") > 1  # spelled out, not one control token


# --- POST /v1/apply/completions ------------------------------------------------------------


def test_proxyai_apply_keeps_untouched_lines(client):
    body = {
        "model": TINY_ID,
        "messages": [{"role": "user", "content": TAGGED}],
        "stream": False,
        "diffusing": False,
    }
    response = client.post("/v1/apply/completions", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["object"] == "chat.completion" and answer["model"] == TINY_ID
    content = answer["choices"][0]["message"]["content"]
    assert content.startswith("<|updated_code|>\n") and content.endswith("\n<|/updated_code|>")
    # The tiny model writes noise; the checked merge still gives the user the right file.
    assert updated_code(content) == MERGED
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["usage"]["total_tokens"] > 0


def test_continue_apply_stream(client):
    body = {
        "model": TINY_ID,
        "messages": CONTINUE_APPLY,
        "max_tokens": 64,
        "temperature": 0.0,
        "stop": ["<|endoftext|>"],
        "stream": True,
    }
    response = client.post("/v1/apply/completions", json=body, headers=CONTINUE_HEADERS)
    assert response.status_code == 200, response.text
    chunks = sse_chunks(response)
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert continue_apply_text(response) == MERGED


def test_readmes_apply_example_answers_byte_for_byte_what_it_shows(client):
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme[readme.index("**Apply**") : readme.index("**Chat**")]
    body = json.loads(section.split("<<'EOF'\n", 1)[1].split("\nEOF", 1)[0])
    shown = section.split("```text\n", 1)[1].split("\n```", 1)[0]
    response = client.post("/v1/apply/completions", json={**body, "model": TINY_ID}, headers=AUTH)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == shown


# A new function between markers: nothing in the snippet places it in the original.
UNANCHORED = "# ... existing code ...\ndef helper():\n    return 1\n# ... existing code ..."


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_apply_never_answers_a_merge_that_loses_the_file(client, stream):
    # The tiny model writes noise and the snippet has no anchor for the line-anchored merge:
    # the answer would replace the user's file (ProxyAI writes it over the whole file), so the
    # request fails in the contract's shape instead, before any stream starts.
    body = {
        "model": TINY_ID,
        "messages": [{"role": "user", "content": tagged_apply(ORIGINAL, UNANCHORED)}],
        "max_tokens": 16,
        "stream": stream,
        "diffusing": False,
    }
    response = client.post("/v1/apply/completions", json=body, headers=AUTH)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["code"] == "merge_failed" and error["param"] == "messages"
    assert error["type"] == "invalid_request_error" and "unchanged lines" in error["message"]


@pytest.mark.parametrize(
    ("original", "snippet", "expected"),
    [("", "x = 1", "x = 1"), (ORIGINAL, "", ORIGINAL)],
    ids=["empty-original", "empty-snippet"],
)
def test_apply_with_nothing_to_keep_or_nothing_to_change(client, original, snippet, expected):
    body = {
        "model": TINY_ID,
        "messages": [{"role": "user", "content": tagged_apply(original, snippet)}],
        "max_tokens": 16,
    }
    response = client.post("/v1/apply/completions", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    assert updated_code(choice["message"]["content"]) == expected
    assert choice["finish_reason"] == "stop"


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "make it faster"}],
        [{"role": "user", "content": "<|original_code|>\nx\n<|/original_code|>"}],
        [{"role": "system", "content": TAGGED}],
    ],
    ids=["no-code", "no-snippet", "no-user"],
)
def test_apply_without_code_and_snippet_is_a_400(client, messages):
    body = {"model": TINY_ID, "messages": messages}
    response = client.post("/v1/apply/completions", json=body, headers=AUTH)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "messages"


def test_apply_on_an_unknown_model_is_a_404(client):
    body = {"model": "nope", "messages": [{"role": "user", "content": TAGGED}]}
    response = client.post("/v1/apply/completions", json=body, headers=AUTH)
    assert response.status_code == 404


# --- listings and the OpenAPI document -----------------------------------------------------


def listing(client, path: str) -> dict:
    response = client.get(path, headers=AUTH)
    assert response.status_code == 200, response.text
    (model,) = response.json()["data"]
    return model


def test_listings_name_what_each_endpoint_honours(client):
    chat = listing(client, "/v1/chat/completions/models")
    assert {"json_mode", "structured_outputs"} <= set(chat["supported_features"])
    assert {"top_k", "repetition_penalty"}.isdisjoint(chat["supported_sampling_parameters"])
    assert {"temperature", "top_p", "stop"} <= set(chat["supported_sampling_parameters"])
    fim = listing(client, "/v1/fim/completions/models")
    assert {"top_k", "repetition_penalty", "stop"} <= set(fim["supported_sampling_parameters"])
    assert "json_mode" not in fim["supported_features"]
    edit = listing(client, "/v1/edit/completions/models")
    assert "apply.completions" in edit["supported_endpoints"]
    assert "stop" not in edit["supported_sampling_parameters"]
    apply = listing(client, "/v1/apply/completions/models")
    assert "apply.completions" in apply["supported_endpoints"]
    overall = listing(client, "/v1/models")
    assert {"json_mode", "structured_outputs"} <= set(overall["supported_features"])
    assert "top_k" in overall["supported_sampling_parameters"]  # FIM takes it


def test_openapi_documents_completions_and_apply(client):
    document = client.get("/openapi.json").json()
    for path in ("/v1/completions", "/v1/apply/completions"):
        assert "post" in document["paths"][path], path
    # 400 for invalid bodies everywhere but decisions; apply's one 422 is a failed merge.
    assert "422" not in document["paths"]["/v1/completions"]["post"]["responses"]
    apply_422 = document["paths"]["/v1/apply/completions"]["post"]["responses"]["422"]
    assert "ErrorResponse" in str(apply_422) and "HTTPValidationError" not in str(apply_422)
    schemas = document["components"]["schemas"]
    assert {"n", "echo", "logprobs", "best_of", "user"} <= set(
        schemas["FimCompletionRequest"]["properties"]
    )
    assert "ApplyCompletionRequest" in schemas
