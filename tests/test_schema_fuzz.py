"""Generated JSON schemas through the real app (the tiny model behind it), as
``response_format`` and as a tool's ``parameters``: no schema gets a 5xx, a refusal is a 4xx in
the contract's shape naming the field, and every answer that ends validates against the
schema it was asked under (jsonschema, the reference validator, as the oracle).

``SCHEMA_FUZZ_EXAMPLES`` sets the examples per mode (default 40); bench/schema_fuzz.py runs
thousands.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings

from serve_app.grammar.postcheck import validate_output
from tests.conftest import AUTH, TINY_ID
from tests.fixtures.schemas import SCHEMAS, chat_under_schema

EXAMPLES = int(os.environ.get("SCHEMA_FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))


def ask(client, schema: Any, mode: str) -> tuple[int, dict]:
    # Python's json writes NaN and Infinity, as some clients do; httpx's json= would refuse.
    body = json.dumps(chat_under_schema(TINY_ID, schema, mode))
    headers = {**AUTH, "Content-Type": "application/json"}
    response = client.post("/v1/chat/completions", content=body, headers=headers)
    return response.status_code, response.json()


def check_answer(status: int, answer: dict, schema: Any, mode: str) -> None:
    assert status < 500, (status, answer)
    if status != 200:
        error = answer["error"]
        assert error["type"] == "invalid_request_error", answer
        if error["code"] == "context_length_exceeded":  # the schema is in the prompt too
            assert error["param"] == "messages"
        elif status == 400 and mode == "response_format":
            assert error["param"].startswith("response_format"), error
        elif status == 400:
            assert error["param"].startswith("tools"), error
        return
    (choice,) = answer["choices"]
    if mode == "response_format" and choice["finish_reason"] == "stop":
        assert validate_output(choice["message"]["content"], schema) is None, choice
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
    for call in choice["message"].get("tool_calls") or []:
        jsonschema.validate(json.loads(call["function"]["arguments"]), schema)


@pytest.mark.parametrize("mode", ["response_format", "tools"])
def test_no_schema_gets_a_5xx_and_every_finished_answer_validates(client, mode):
    @FUZZ
    @given(schema=SCHEMAS)
    def run(schema: Any) -> None:
        status, answer = ask(client, schema, mode)
        check_answer(status, answer, schema, mode)

    run()
