"""bench/tools.py's reading of a function-calling set and its judging of answers, on a case
written here in the set's format (the set itself is fetched, never committed)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.tools import CATEGORIES, judge, load_cases

FUNCTION = {
    "name": "math.hypot",
    "description": "The hypotenuse",
    "parameters": {
        "type": "dict",
        "properties": {
            "x": {"type": "integer"},
            "y": {"type": "integer"},
            "unit": {"type": "string"},
            "scale": {"type": "float"},
        },
        "required": ["x", "y"],
    },
}
ANSWER = {"math.hypot": {"x": [3], "y": [4], "unit": ["cm", ""], "scale": [1.0, ""]}}


def write_set(folder: Path) -> None:
    (folder / "possible_answer").mkdir(parents=True)
    for category, name in CATEGORIES.items():
        question = [[{"role": "user", "content": "Hypotenuse of 3 and 4?"}]]
        row = {"id": f"{category}_0", "question": question, "function": [FUNCTION]}
        (folder / name).write_text(json.dumps(row) + "\n")
        answer = {"id": f"{category}_0", "ground_truth": [ANSWER]}
        (folder / "possible_answer" / name).write_text(json.dumps(answer) + "\n")


def call(arguments: dict | str, name: str = "math_hypot") -> dict:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"tool_calls": [{"function": {"name": name, "arguments": text}}]}


def test_functions_are_sent_as_openai_tools(tmp_path: Path) -> None:
    write_set(tmp_path)
    (case,) = load_cases(tmp_path, "simple", 5)
    (tool,) = case["tools"]
    assert tool["function"]["name"] == "math_hypot"  # OpenAI's names have no dots
    parameters = tool["function"]["parameters"]
    assert parameters["type"] == "object"
    assert parameters["properties"]["scale"]["type"] == "number"
    assert case["expected"] == [{"math_hypot": ANSWER["math.hypot"]}]


def test_judging(tmp_path: Path) -> None:
    write_set(tmp_path)
    (case,) = load_cases(tmp_path, "multiple", 5)
    right = judge(call({"x": 3, "y": 4.0, "unit": "CM"}), case)
    assert right == {"called": True, "calls": 1, "valid": 1, "right": True}
    assert not judge(call({"x": 3, "y": 5}), case)["right"]  # a wrong value
    assert not judge(call({"x": 3}), case)["valid"]  # misses a required argument
    assert not judge(call({"x": 3, "y": 4, "z": 1}), case)["right"]  # an unknown argument
    assert not judge(call({"x": 3, "y": 4}, name="math_sqrt"), case)["valid"]
    assert judge(call("{not json"), case) == {
        "called": True,
        "calls": 1,
        "valid": 0,
        "right": False,
    }
    assert judge({"content": "5"}, case) == {
        "called": False,
        "calls": 0,
        "valid": 0,
        "right": False,
    }
