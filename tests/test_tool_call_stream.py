"""How a streamed answer's text becomes content and tool-call deltas, however the engine's
chunks cut it (``serving.tool_calls.CallStream``), and the whole answer (``split_calls``)."""

from __future__ import annotations

import json
import random

import pytest

from serve_app.serving.tool_calls import CallStream, split_calls

BLOCK = '<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'
CALLS = [("get_weather", {"city": "Pa}ris", "unit": "celsius"}), ("get_time", {})]
ANSWER = "Let me check.\n" + "\n".join(
    BLOCK.format(name=name, arguments=json.dumps(arguments)) for name, arguments in CALLS
)


def read(pieces: list[str]) -> tuple[str, dict[int, dict]]:
    stream, content, calls = CallStream(), "", {}
    for piece in pieces:
        text, deltas = stream.feed(piece)
        content += text
        for delta in deltas:
            if delta.id is not None:
                assert delta.index not in calls and delta.function.arguments == ""
                calls[delta.index] = {"name": delta.function.name, "arguments": ""}
            else:
                assert delta.function.name is None
                calls[delta.index]["arguments"] += delta.function.arguments
    return content, calls


@pytest.mark.parametrize("seed", range(20))
def test_any_cut_of_the_stream_gives_the_same_content_and_calls(seed):
    rng = random.Random(seed)
    cuts = sorted(rng.sample(range(1, len(ANSWER)), rng.randrange(1, 40)))
    pieces = [ANSWER[a:b] for a, b in zip([0, *cuts], [*cuts, len(ANSWER)], strict=True)]
    content, calls = read(pieces)
    assert content == "Let me check.\n"
    assert [(c["name"], json.loads(c["arguments"])) for c in calls.values()] == CALLS


def test_text_without_a_call_streams_as_it_comes_but_a_possible_marker_waits():
    stream = CallStream()
    assert stream.feed("a < b and <tool") == ("a < b and ", [])
    assert stream.feed("box>") == ("<toolbox>", [])
    assert stream.feed(" ends <tool") == (" ends ", [])
    assert stream.finish() == "<tool"  # the answer ended: it was text after all


def test_the_whole_answer_splits_the_same_way():
    content, calls = split_calls(ANSWER)
    assert content == "Let me check."
    named = [(c.function.name, json.loads(c.function.arguments)) for c in calls]
    assert named == CALLS
    assert len({c.id for c in calls}) == 2


def test_a_block_cut_short_is_left_out_and_plain_text_stays_text():
    assert split_calls(ANSWER[: ANSWER.rindex("</tool_call>")])[1][0].function.name == "get_weather"
    assert len(split_calls(ANSWER[: ANSWER.rindex("</tool_call>")])[1]) == 1
    assert split_calls("no calls here") == ("no calls here", [])
    broken = "<tool_call>\nnot json\n</tool_call>"
    assert split_calls(broken) == (broken, [])
