"""README's request examples, sent as written to the real app on the tiny random model.

Every curl command in README.md is parsed (``bench.readme_examples``, which also checks the
answers themselves on the embedded model) and sent to the in-process router with only the
model id changed: each must answer 200 in the shape its route documents, so README and code
cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from bench.readme_examples import Example, read_path, readme_examples, stream_chunks
from serve_app.api.chat import ChatCompletion, ChatCompletionChunk
from serve_app.api.decisions import DecisionResponse
from serve_app.api.edit import EditCompletion
from serve_app.api.fim import FimCompletion, FimCompletionChunk
from serve_app.api.models import EndpointModelList, ModelList
from tests.conftest import TEST_KEY, TINY_ID

README = Path(__file__).resolve().parents[1] / "README.md"
EXAMPLES = readme_examples(README.read_text())

# Each path's answer, and a stream's chunks (None: the route does not stream).
SHAPES: dict[str, tuple[type[BaseModel], type[BaseModel] | None]] = {
    "/v1/decisions": (DecisionResponse, None),
    "/v1/edit/completions": (EditCompletion, None),
    "/v1/fim/completions": (FimCompletion, FimCompletionChunk),
    "/v1/completions": (FimCompletion, FimCompletionChunk),
    "/v1/apply/completions": (ChatCompletion, ChatCompletionChunk),
    "/v1/chat/completions": (ChatCompletion, ChatCompletionChunk),
    "/v1/models": (ModelList, None),
    **{
        f"/v1/{endpoint}/completions/models": (EndpointModelList, None)
        for endpoint in ("chat", "fim", "edit", "apply")
    },
}


def example_id(example: Example) -> str:
    return f"README.md:{example.line} {example.method} {example.path}"


def test_readme_shows_an_example_of_every_endpoint():
    assert {example.path for example in EXAMPLES} == set(SHAPES)
    assert any(example.stream for example in EXAMPLES)


@pytest.mark.parametrize("example", EXAMPLES, ids=example_id)
def test_each_example_shows_the_answer_it_gets(example: Example):
    assert example.answer_path is not None and example.answer, "no <!-- answer: --> block"


@pytest.mark.parametrize("example", EXAMPLES, ids=example_id)
def test_each_example_answers_in_its_documented_shape(client, example: Example):
    response = example.send(client, TEST_KEY, model=TINY_ID)
    assert response.status_code == 200, response.text
    answer, chunk = SHAPES[example.path]
    if example.stream:
        assert chunk is not None
        assert response.headers["content-type"].startswith("text/event-stream")
        chunks = stream_chunks(response)
        for item in chunks:
            chunk.model_validate(item)
        usage_requested = (example.body or {}).get("stream_options", {}).get("include_usage")
        assert bool(chunks[-1].get("usage")) == bool(usage_requested)
        shown = [read_path(item, example.answer_path) for item in chunks]
    else:
        answer.model_validate(response.json())
        shown = [read_path(response.json(), example.answer_path)]
    # The field README shows is there, whatever the tiny model wrote into it.
    assert any(value is not None for value in shown), example.answer_path
