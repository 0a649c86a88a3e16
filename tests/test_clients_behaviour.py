"""Each client's calls on the embedded model, parsed as the client parses them (clients.md):
the completion fits the code around it, and an apply keeps every untouched line."""

from __future__ import annotations

import pytest

from tests.clients import (
    CONTINUE_HEADERS,
    CONTINUE_STOP,
    code_lines,
    continue_apply_messages,
    continue_apply_text,
    continue_stream_texts,
    kilo_stream,
    tagged_apply,
    updated_code,
)
from tests.conftest import AUTH, EMBEDDED_ID

pytestmark = pytest.mark.embedded

CIRCLE = """import math


class Circle:
    def __init__(self, radius):
        self.radius = radius

    def area(self):
        return math.pi * self.radius ** 2

    def perimeter(self):
        return 2 * math.pi * self.radius


def describe(shape):
    return f"{type(shape).__name__} with area {shape.area():.2f}"


if __name__ == "__main__":
    print(describe(Circle(2)))"""


def test_continue_autocomplete_fills_a_function_body(embedded_client):
    body = {
        "model": EMBEDDED_ID,
        "prompt": "def average(values):\n    ",
        "suffix": "\n\n\nprint(average([1, 2, 3]))\n",
        "max_tokens": 150,
        "temperature": 0.01,
        "stop": CONTINUE_STOP,
        "stream": True,
    }
    response = embedded_client.post("/v1/completions", json=body, headers=CONTINUE_HEADERS)
    assert response.status_code == 200, response.text
    text = "".join(continue_stream_texts(response))
    assert "sum(values)" in text and "len(values)" in text, text
    assert "\n\n" not in text and "print(average" not in text  # stops before the suffix


def test_continue_blank_file_prompt_writes_what_the_path_names(embedded_client):
    body = {
        "model": EMBEDDED_ID,
        "prompt": "<|file_sep|>geometry/is_prime.py\n<|fim_prefix|>",
        "suffix": "<|endoftext|>",
        "max_tokens": 12,
        "temperature": 0.01,
        "stop": CONTINUE_STOP,
        "stream": True,
    }
    response = embedded_client.post("/v1/completions", json=body, headers=CONTINUE_HEADERS)
    text = "".join(continue_stream_texts(response))
    # The markers are read as markers (none is written back), and the model opens the file the
    # path names: with its function (seen on an earlier box) or the import it needs for it
    # (`from math import sqrt` on this one, with the same model files and code).
    assert text.startswith(("def is_prime(", "from math import", "import math")), text
    assert "<|" not in text


def test_kilo_code_fim_with_its_prefix_marker(embedded_client):
    body = {
        "model": EMBEDDED_ID,
        "prompt": "<|fim_prefix|>def celsius_to_fahrenheit(c):\n    return ",
        "suffix": "\n\n\nprint(celsius_to_fahrenheit(100))\n",
        "max_tokens": 256,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response = embedded_client.post("/v1/fim/completions", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    text, usage = kilo_stream(response)
    assert "9" in text and "5" in text and "32" in text and "c" in text, text
    assert "fim_prefix" not in text
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] >= 1


def test_proxyai_fim_over_event_stream(embedded_client):
    body = {
        "model": EMBEDDED_ID,
        "prompt": "def fibonacci(n):\n    if n < 2:\n        return n\n    return ",
        "suffix": "\n\n\nprint(fibonacci(10))\n",
        "stream": True,
    }
    headers = {**AUTH, "Accept": "text/event-stream"}
    response = embedded_client.post("/v1/fim/completions", json=body, headers=headers)
    assert response.headers["content-type"].startswith("text/event-stream")
    text, _ = kilo_stream(response)  # the same chunk reading: choices[0].text
    assert "fibonacci(n - 1)" in text.replace("n-1", "n - 1"), text
    assert "fibonacci(n - 2)" in text.replace("n-2", "n - 2"), text


def test_proxyai_apply_adds_a_method_and_keeps_the_file(embedded_client):
    snippet = (
        "# ... existing code ...\n"
        "    def perimeter(self):\n        return 2 * math.pi * self.radius\n\n"
        "    def diameter(self):\n        return 2 * self.radius\n"
        "# ... existing code ..."
    )
    body = {
        "model": EMBEDDED_ID,
        "messages": [{"role": "user", "content": tagged_apply(CIRCLE, snippet)}],
        "stream": False,
        "diffusing": False,
    }
    response = embedded_client.post("/v1/apply/completions", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    merged = updated_code(response.json()["choices"][0]["message"]["content"])
    expected = CIRCLE.replace(
        "        return 2 * math.pi * self.radius\n",
        "        return 2 * math.pi * self.radius\n\n"
        "    def diameter(self):\n        return 2 * self.radius\n",
    )
    assert code_lines(merged) == code_lines(expected), merged


def test_continue_apply_stream_carries_a_change_and_keeps_the_file(embedded_client):
    edit = "    def area(self):\n        return math.pi * self.radius * self.radius"
    body = {
        "model": EMBEDDED_ID,
        "messages": continue_apply_messages(CIRCLE, edit),
        "max_tokens": 8192,
        "temperature": 0,
        "stop": ["<|endoftext|>"],
        "stream": True,
    }
    response = embedded_client.post("/v1/apply/completions", json=body, headers=CONTINUE_HEADERS)
    assert response.status_code == 200, response.text
    merged = continue_apply_text(response)
    expected = CIRCLE.replace("self.radius ** 2", "self.radius * self.radius")
    assert code_lines(merged) == code_lines(expected), merged


@pytest.mark.parametrize("stream", [False, True], ids=["unary", "stream"])
def test_apply_an_anchorless_chunk_goes_to_the_model_and_never_loses_a_line(
    embedded_client, stream
):
    # A function between markers with no unchanged line around it: nothing places it, so the
    # model writes the file (drafting from the original). Whatever it writes, the answer is
    # either a 422 or a file with every original line, in order, and the new function whole.
    snippet = "# ... existing code ...\ndef square(x):\n    return x * x\n# ... existing code ..."
    body = {
        "model": EMBEDDED_ID,
        "messages": [{"role": "user", "content": tagged_apply(CIRCLE, snippet)}],
        "temperature": 0,
        "stream": stream,
    }
    response = embedded_client.post("/v1/apply/completions", json=body, headers=AUTH)
    if response.status_code == 422:
        assert "matches no line" in response.json()["error"]["message"]
        return
    assert response.status_code == 200, response.text
    if stream:
        merged = continue_apply_text(response)
    else:
        merged = updated_code(response.json()["choices"][0]["message"]["content"])
    answered = iter(merged.splitlines())
    assert all(line in answered for line in CIRCLE.splitlines() if line.strip()), merged
    assert "def square(x):\n    return x * x" in merged
