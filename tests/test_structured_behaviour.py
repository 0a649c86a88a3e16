"""Structured output on the embedded model, as the openai SDK and LiteLLM send it: JSON mode,
a strict schema and a tool call give answers that parse, fit, and say what was asked."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.conftest import AUTH, EMBEDDED_ID

pytestmark = pytest.mark.embedded


def ask(client, content: str, **fields) -> dict:
    body = {
        "model": EMBEDDED_ID,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 60,
        "temperature": 0,
        **fields,
    }
    response = client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    (choice,) = response.json()["choices"]
    return choice


def test_json_mode_answers_an_object(embedded_client):
    choice = ask(
        embedded_client,
        'What is the capital of France? Answer as JSON: {"capital": ...}',
        response_format={"type": "json_object"},
    )
    assert choice["finish_reason"] == "stop", choice
    answer = json.loads(choice["message"]["content"])
    assert "paris" in json.dumps(answer).lower()


def test_a_strict_schema_is_followed(embedded_client):
    schema = {
        "type": "object",
        "properties": {
            "language": {"enum": ["python", "rust", "go"]},
            "year": {"type": "integer", "minimum": 1950, "maximum": 2030},
        },
        "required": ["language", "year"],
        "additionalProperties": False,
    }
    choice = ask(
        embedded_client,
        "Which language did Guido van Rossum create, and in which year was it first released?",
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": schema, "strict": True},
        },
    )
    assert choice["finish_reason"] == "stop", choice
    answer = json.loads(choice["message"]["content"])
    jsonschema.validate(answer, schema)
    assert answer["language"] == "python"


def test_a_tool_call_names_the_function_and_its_argument(embedded_client):
    parameters = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city"],
    }
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather in a city",
                "parameters": parameters,
            },
        }
    ]
    choice = ask(
        embedded_client, "What's the weather in Paris?", tools=tools, tool_choice="required"
    )
    assert choice["finish_reason"] == "tool_calls", choice
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    arguments = json.loads(call["function"]["arguments"])
    jsonschema.validate(arguments, parameters)
    assert "paris" in arguments["city"].lower()
