"""The official ``openai`` package as a real client of the running graph."""

from __future__ import annotations

import json

import pytest
from openai import OpenAI

from tests.conftest import TEST_KEY
from tests.fixtures.edit import EXAMPLE_EDIT_CONTENT
from tests.graph import MODEL

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def sdk(graph) -> OpenAI:
    return OpenAI(base_url=graph["url"] + "/v1", api_key=TEST_KEY, max_retries=0, timeout=120)


def test_models_list(sdk):
    assert [model.id for model in sdk.models.list()] == [MODEL]


def test_chat_completion(sdk):
    completion = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Say hi"}], max_tokens=5
    )
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.role == "assistant"
    assert completion.choices[0].finish_reason in {"stop", "length"}
    assert completion.usage.total_tokens == (
        completion.usage.prompt_tokens + completion.usage.completion_tokens
    )


def test_chat_completion_stream(sdk):
    stream = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Say hi"}],
        max_tokens=5,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1


def test_chat_diffusion_extensions_through_extra_body(sdk):
    completion = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=3,
        extra_body={"diffusing": True, "reasoning_effort": "instant"},
    )
    assert completion.choices[0].message.content is not None


def test_fim_through_the_completions_api(graph):
    """FIM is a legacy completion with a suffix: point the SDK's base_url at /v1/fim."""
    fim = OpenAI(base_url=graph["url"] + "/v1/fim", api_key=TEST_KEY, max_retries=0)
    completion = fim.completions.create(
        model=MODEL, prompt="def add(a, b):\n    return", suffix="\n", max_tokens=4
    )
    assert completion.object == "text_completion"
    assert completion.choices[0].finish_reason in {"stop", "length"}
    streamed = fim.completions.create(
        model=MODEL, prompt="def add(a, b):\n    return", suffix="\n", max_tokens=4, stream=True
    )
    texts = [chunk.choices[0].text for chunk in streamed if chunk.choices]
    assert "".join(texts) == completion.choices[0].text  # greedy: the same text both ways


def test_completions_on_v1_are_fim(sdk):
    """With base /v1 the SDK posts to /v1/completions: the same FIM service."""
    completion = sdk.completions.create(
        model=MODEL, prompt="def add(a, b):\n    return", suffix="\n", max_tokens=4
    )
    assert completion.object == "text_completion"
    assert completion.choices[0].finish_reason in {"stop", "length"}
    assert completion.usage.prompt_tokens > 0


def test_apply_through_the_generic_post(sdk):
    content = (
        "<|original_code|>\nx = 1\ny = 2\n<|/original_code|>\n\n"
        "<|update_snippet|>\ny = 3\n<|/update_snippet|>"
    )
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 8}
    applied = sdk.post("/apply/completions", body=body, cast_to=object)
    assert applied["object"] == "chat.completion"
    assert applied["choices"][0]["message"]["content"].startswith("<|updated_code|>\n")


def test_edit_through_the_generic_post(sdk):
    body = {
        "model": MODEL,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": EXAMPLE_EDIT_CONTENT}],
    }
    edit = sdk.post("/edit/completions", body=body, cast_to=object)
    assert edit["object"] == "edit.completion"
    assert edit["choices"][0]["message"]["role"] == "assistant"


def test_sdk_raises_typed_errors(sdk):
    import openai

    with pytest.raises(openai.NotFoundError) as raised:
        sdk.chat.completions.create(
            model="missing", messages=[{"role": "user", "content": "x"}], max_tokens=2
        )
    assert raised.value.code == "model_not_found"
    bad = OpenAI(base_url=str(sdk.base_url), api_key="sk-sa-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_chat_json_schema_through_the_sdk(sdk):
    """Bounded values, so the random weights finish (json_object on the embedded model:
    tests/test_structured_behaviour.py)."""
    schema = {
        "type": "object",
        "properties": {"mood": {"enum": ["calm", "busy"]}, "n": {"type": "integer", "maximum": 9}},
        "required": ["mood", "n"],
        "additionalProperties": False,
    }
    completion = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Describe a mood as JSON."}],
        max_tokens=40,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "mood", "schema": schema, "strict": True},
        },
    )
    answer = json.loads(completion.choices[0].message.content)
    assert answer["mood"] in {"calm", "busy"} and isinstance(answer["n"], int)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def test_tool_calls_then_a_tool_message_then_the_answer(sdk):
    """The SDK's own types read the call, and its history goes back unchanged."""
    messages = [{"role": "user", "content": "Weather in Paris?"}]
    first = sdk.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL], tool_choice="required",
        parallel_tool_calls=False, max_tokens=60, temperature=0,
    )  # fmt: skip
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    final = sdk.chat.completions.create(
        model=MODEL, messages=messages, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=5
    )
    assert final.choices[0].message.content is not None
    assert final.choices[0].message.tool_calls is None


def test_streamed_tool_calls_accumulate_as_the_sdk_reads_them(sdk):
    stream = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=60, temperature=0, stream=True,
    )  # fmt: skip
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for delta in choice.delta.tool_calls or []:
                call = calls.setdefault(delta.index, {"id": delta.id, "name": "", "arguments": ""})
                call["name"] += delta.function.name or ""
                call["arguments"] += delta.function.arguments or ""
    assert finish == "tool_calls"
    assert [c["name"] for c in calls.values()] == ["get_weather"]
    assert all(c["id"] for c in calls.values())
    assert "city" in json.loads(calls[0]["arguments"])
