"""Apply's input parsing, its check of a model's merge, and the anchored fallback merge."""

from __future__ import annotations

import pytest

from serve_app.engine.prompts.apply import (
    keeps_untouched,
    merge_snippet,
    parse_apply_request,
)
from serve_app.errors import InvalidRequestError

PY = """import math


def area(r):
    return math.pi * r ** 2


def perimeter(r):
    return 2 * math.pi * r


def main():
    print(area(2))"""

TAU_SNIPPET = (
    "# ... existing code ...\ndef perimeter(r):\n    return math.tau * r\n# ... existing code ..."
)

JS = """function add(a, b) {
  return a + b;
}

function sub(a, b) {
  return a - b;
}

module.exports = { add, sub };"""


def test_parses_the_tagged_layout():
    content = (
        "<|original_code|>\na = 1\n<|/original_code|>\n\n"
        "<|update_snippet|>\na = 2\n<|/update_snippet|>"
    )
    parsed = parse_apply_request(content)
    assert (parsed.original, parsed.snippet) == ("a = 1", "a = 2")


def test_parses_continues_layout():
    content = (
        "ORIGINAL CODE:\n```python\na = 1\nb = 2\n```\n\nSUGGESTED EDIT:\n```\na = 3\n```\n\n"
        "Apply the SUGGESTED EDIT to the ORIGINAL CODE. Output the full code."
    )
    parsed = parse_apply_request(content)
    assert (parsed.original, parsed.snippet) == ("a = 1\nb = 2", "a = 3")


def test_anything_else_names_messages():
    with pytest.raises(InvalidRequestError) as raised:
        parse_apply_request("please apply my change")
    assert raised.value.param == "messages"


def test_merges_a_middle_change_with_python_markers():
    snippet = TAU_SNIPPET
    assert merge_snippet(PY, snippet) == PY.replace("2 * math.pi * r", "math.tau * r")


def test_merges_an_addition_with_js_markers():
    snippet = (
        "// ... existing code ...\nfunction sub(a, b) {\n  return a - b;\n}\n\n"
        "function mul(a, b) {\n  return a * b;\n}\n// ... existing code ..."
    )
    merged = merge_snippet(JS, snippet)
    assert merged is not None
    assert "function mul(a, b) {\n  return a * b;\n}\n\nmodule.exports" in merged
    assert merged.startswith("function add(a, b) {\n  return a + b;\n}\n\nfunction sub")


def test_a_snippet_without_markers_keeps_the_code_around_it():
    merged = merge_snippet(PY, "def main():\n    print(area(3))")
    assert merged == PY.replace("area(2)", "area(3)")


def test_a_snippet_that_matches_nothing_is_not_placed():
    assert merge_snippet(PY, "# ... existing code ...\nclass Unrelated:\n    pass") is None


def test_a_changed_line_that_matches_far_away_is_not_an_anchor():
    code = "def a():\n    return 1\n\n\ndef b():\n    return 2\n\n\ndef c():\n    return 3"
    merged = merge_snippet(code, "def b():\n    return 3")
    assert merged is None or "def c():" in merged


def test_the_check_refuses_a_merge_that_drops_code():
    snippet = TAU_SNIPPET
    good = PY.replace("2 * math.pi * r", "math.tau * r")
    assert keeps_untouched(PY, snippet, good)
    assert not keeps_untouched(PY, snippet, good.replace("import math\n", ""))
    assert not keeps_untouched(PY, snippet, PY)  # the change is missing
    assert not keeps_untouched(PY, snippet, "# ... existing code ...\n" + good)


def test_a_snippet_placed_nowhere_must_keep_every_original_line():
    # An insertion with no anchor: the snippet alone (a small model's usual failure) would
    # drop the whole file, so only a merge that keeps every original line passes.
    snippet = "# ... existing code ...\nclass Unrelated:\n    pass\n# ... existing code ..."
    assert not keeps_untouched(PY, snippet, "class Unrelated:\n    pass")
    assert not keeps_untouched(PY, snippet, "")
    assert keeps_untouched(PY, snippet, PY + "\n\n\nclass Unrelated:\n    pass")
    # ... but it may stand for up to its own size in original lines (an edit without anchors)
    assert keeps_untouched(PY, snippet, PY.replace("import math", "class Unrelated:\n    pass"))
    three_lost = "\n".join(PY.splitlines()[5:]) + "\n\n\nclass Unrelated:\n    pass"
    assert not keeps_untouched(PY, snippet, three_lost)


def test_a_one_line_edit_without_an_exact_match_replaces_the_line_most_like_it():
    assert merge_snippet("x = 1\ny = 2", "y = 3") == "x = 1\ny = 3"
    assert merge_snippet("x = 1\nx = 1", "x = 2") is None  # two lines alike: not placed
    assert merge_snippet(PY, "completely different") is None


def test_an_empty_original_takes_the_snippet_and_an_empty_snippet_changes_nothing():
    assert merge_snippet("", "# ... existing code ...\nx = 1") == "x = 1"
    assert merge_snippet(PY, "") == PY
    assert not keeps_untouched(PY, "", "")
