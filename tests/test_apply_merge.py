"""Apply's input parsing, its deterministic merge, and the check every answer passes.

For each edit kind of the apply issue, in JavaScript and Python: the deterministic merge gives
the expected file, the check accepts it, and the check rejects a constructed lossy merge (the
right edit with one untouched function dropped, the shape a small model's merge took).
"""

from __future__ import annotations

import pytest

from serve_app.apply.check import check_merge
from serve_app.apply.placement import plan_update
from serve_app.apply.update import chunks_of, is_marker
from serve_app.errors import InvalidRequestError, MergeFailedError
from serve_app.prompts.apply import parse_apply_request

PY = '''"""Shapes."""

import math


class Circle:
    def __init__(self, radius):
        self.radius = radius

    def area(self):
        return math.pi * self.radius ** 2


def perimeter(r):
    return 2 * math.pi * r


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def main():
    print(perimeter(2))
    write("out.txt", "done")'''

JS = """'use strict';

function add(a, b) {
  return a + b;
}

function sub(a, b) {
  const d = a - b;
  return d;
}

function mul(a, b) {
  return a * b;
}

module.exports = { add, sub, mul };"""

# kind -> (language, original, update, expected, a line the lossy merge drops)
CASES = {
    "py-change-body": (
        PY,
        "# ... existing code ...\ndef perimeter(r):\n    return math.tau * r\n"
        "# ... existing code ...",
        PY.replace("2 * math.pi * r", "math.tau * r"),
        "def write(path, text):",
    ),
    "js-change-body": (
        JS,
        "// ... existing code ...\nfunction sub(a, b) {\n  return b - a;\n}\n"
        "// ... existing code ...",
        JS.replace("  const d = a - b;\n  return d;", "  return b - a;"),
        "function add(a, b) {",
    ),
    "py-insert-method": (
        PY,
        "# ... existing code ...\n        return math.pi * self.radius ** 2\n\n"
        "    def diameter(self):\n        return 2 * self.radius\n# ... existing code ...",
        PY.replace(
            "radius ** 2\n",
            "radius ** 2\n\n    def diameter(self):\n        return 2 * self.radius\n",
        ),
        "def write(path, text):",
    ),
    "js-insert-function": (
        JS,
        "// ... existing code ...\n  return d;\n}\n\nfunction neg(a) {\n  return -a;\n}\n"
        "// ... existing code ...",
        JS.replace("  return d;\n}\n", "  return d;\n}\n\nfunction neg(a) {\n  return -a;\n}\n"),
        "function add(a, b) {",
    ),
    "py-delete-function": (
        PY,
        "# ... existing code ...\n    return 2 * math.pi * r\n\n\ndef main():\n"
        "# ... existing code ...",
        PY.replace(
            'def write(path, text):\n    with open(path, "w") as f:\n        f.write(text)\n\n\n',
            "",
        ),
        "class Circle:",
    ),
    "js-delete-function": (
        JS,
        "// ... existing code ...\n  return a + b;\n}\n\nfunction mul(a, b) {\n"
        "// ... existing code ...",
        JS.replace("function sub(a, b) {\n  const d = a - b;\n  return d;\n}\n\n", ""),
        "module.exports = { add, sub, mul };",
    ),
    "py-helper-and-call": (
        PY,
        "# ... existing code ...\ndef twice(x):\n    return 2 * x\n\n\ndef main():\n"
        "    print(twice(perimeter(2)))\n# ... existing code ...",
        PY.replace(
            "def main():\n    print(perimeter(2))",
            "def twice(x):\n    return 2 * x\n\n\ndef main():\n    print(twice(perimeter(2)))",
        ),
        "def write(path, text):",
    ),
    "js-helper-and-call": (
        JS,
        "// ... existing code ...\nfunction sq(a) {\n  return a * a;\n}\n\nfunction mul(a, b) {\n"
        "  return sq(a) / a * b;\n}\n// ... existing code ...",
        JS.replace(
            "function mul(a, b) {\n  return a * b;",
            "function sq(a) {\n  return a * a;\n}\n\nfunction mul(a, b) {\n  return sq(a) / a * b;",
        ),
        "function add(a, b) {",
    ),
    "py-add-and-export": (
        PY,
        "# ... existing code ...\ndef read(path):\n    with open(path) as f:\n"
        "        return f.read()\n\n\n"
        'def main():\n    print(perimeter(2))\n    write("out.txt", read("in.txt"))',
        PY.replace(
            'def main():\n    print(perimeter(2))\n    write("out.txt", "done")',
            "def read(path):\n    with open(path) as f:\n        return f.read()\n\n\n"
            'def main():\n    print(perimeter(2))\n    write("out.txt", read("in.txt"))',
        ),
        "def write(path, text):",  # the silent loss: `write` gone
    ),
    "js-add-and-export": (
        JS,
        "// ... existing code ...\nfunction div(a, b) {\n  return a / b;\n}\n\n"
        "module.exports = { add, sub, mul, div };",
        JS.replace(
            "module.exports = { add, sub, mul };",
            "function div(a, b) {\n  return a / b;\n}\n\nmodule.exports = { add, sub, mul, div };",
        ),
        "function add(a, b) {",  # the silent loss: `add` gone
    ),
    "py-rename": (
        PY,
        "# ... existing code ...\ndef circumference(r):\n    return 2 * math.pi * r\n"
        "# ... existing code ...\ndef main():\n    print(circumference(2))\n"
        "# ... existing code ...",
        PY.replace("perimeter", "circumference"),
        "def write(path, text):",
    ),
    "js-rename": (
        JS,
        "// ... existing code ...\nfunction plus(a, b) {\n  return a + b;\n"
        "// ... existing code ...\nmodule.exports = { plus, sub, mul };",
        JS.replace("add", "plus"),
        "function sub(a, b) {",
    ),
    "py-several-chunks": (
        PY,
        "# ... existing code ...\n    def area(self):\n        return math.pi * self.radius * "
        "self.radius\n# ... existing code ...\ndef perimeter(r):\n    return math.tau * r\n"
        "# ... existing code ...",
        PY.replace("self.radius ** 2", "self.radius * self.radius").replace(
            "2 * math.pi * r", "math.tau * r"
        ),
        "def write(path, text):",
    ),
    "js-several-chunks": (
        JS,
        "// ... existing code ...\nfunction add(a, b) {\n  return b + a;\n}\n"
        "// ... existing code ...\nfunction mul(a, b) {\n  return b * a;\n}\n"
        "// ... existing code ...",
        JS.replace("return a + b;", "return b + a;").replace("return a * b;", "return b * a;"),
        "function sub(a, b) {",
    ),
    "py-no-anchors": (
        PY,
        '# ... existing code ...\n\n\nif __name__ == "__main__":\n    main()',
        PY + '\n\n\nif __name__ == "__main__":\n    main()',
        "def perimeter(r):",
    ),
    "js-no-anchors": (
        JS,
        "const assert = require('assert');\n// ... existing code ...",
        "const assert = require('assert');\n" + JS,
        "function sub(a, b) {",
    ),
}


def drop_function(code: str, header: str) -> str:
    """``code`` without the function (or class) that starts at ``header``."""
    lines = code.splitlines()
    start = lines.index(header)
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or lines[end][0] in " }"):
        end += 1
    return "\n".join(lines[:start] + lines[end:])


@pytest.mark.parametrize("kind", sorted(CASES))
def test_the_merge_is_exact_and_the_check_rejects_a_lossy_one(kind):
    original, update, expected, dropped = CASES[kind]
    plan = plan_update(original, update)
    assert plan.is_certain, plan.problem()
    assert plan.merged() == expected
    check_merge(plan, expected)
    lossy = drop_function(expected, dropped)
    assert dropped in expected and dropped not in lossy
    with pytest.raises(MergeFailedError) as failed:
        check_merge(plan, lossy)
    assert dropped.strip() in failed.value.message


@pytest.mark.parametrize("kind", sorted(CASES))
def test_the_check_rejects_a_merge_without_the_change_or_with_a_marker(kind):
    original, update, expected, _ = CASES[kind]
    plan = plan_update(original, update)
    with pytest.raises(MergeFailedError):
        check_merge(plan, original)
    marker = next(line for line in update.splitlines() if is_marker(line))
    with pytest.raises(MergeFailedError, match="marker"):
        check_merge(plan, marker + "\n" + expected)


def test_the_silent_loss_shape_is_caught_on_a_large_file():
    # The hole: a snippet whose anchors span most of a small file. Here the same shape
    # on a file of 400 lines: a function near the top goes missing.
    helpers = "\n\n".join(f"function f{i}(x) {{\n  return x + {i};\n}}" for i in range(100))
    original = helpers + "\n\nmodule.exports = { f0 };"
    update = (
        "// ... existing code ...\nfunction g(x) {\n  return x;\n}\n\nmodule.exports = { f0, g };"
    )
    plan = plan_update(original, update)
    merged = plan.merged()
    assert merged.endswith("function g(x) {\n  return x;\n}\n\nmodule.exports = { f0, g };")
    check_merge(plan, merged)
    with pytest.raises(MergeFailedError, match="f3"):
        check_merge(plan, merged.replace("function f3(x) {\n  return x + 3;\n}\n\n", ""))


def test_markers_in_the_common_comment_forms():
    for line in (
        "// ... existing code ...",
        "# ... rest unchanged",
        "/* ... */",
        "<!-- ... existing code ... -->",
        "-- ... existing code ...",
        "    # ...",
        "{/* ... existing code ... */}",
        "// existing code",
    ):
        assert is_marker(line), line
    for line in ("...", "    ...", "x = ...  # todo", "# a comment", "print('...')"):
        assert not is_marker(line), line


def test_an_empty_update_returns_the_original_and_an_empty_original_takes_the_update():
    plan = plan_update(PY, "")
    assert plan.is_certain and plan.merged() == PY
    plan = plan_update(PY, "# ... existing code ...\n\n# ... existing code ...")
    assert plan.merged() == PY
    assert plan_update("", "# ... existing code ...\nx = 1").merged() == "x = 1"


def test_a_one_line_edit_without_markers_lands_on_the_line_it_edits():
    assert plan_update("x = 1\ny = 2", "y = 3").merged() == "x = 1\ny = 3"
    assert plan_update(PY, "def main():\n    print(perimeter(3))").merged() == PY.replace(
        "perimeter(2))", "perimeter(3))"
    )


def test_a_new_function_between_markers_never_replaces_one_it_only_resembles():
    # Each line is just like enough (0.61, 0.67) by its keywords; no line is that line edited.
    original = "import math\n\n\ndef area(r):\n    return 3.14 * r * r\n\n\ndef main():\n    pass\n"
    update = "# ... existing code ...\ndef helper():\n    return 1\n# ... existing code ..."
    plan = plan_update(original, update)
    assert not plan.is_certain and "matches no line" in (plan.problem() or "")
    # An edit of the function's own lines still lands on them without the model.
    renamed = plan_update(original, "def area(radius):\n    return 3.14 * radius * radius")
    assert renamed.is_certain and renamed.chunks[0].how == "fuzzy"
    assert "def area(radius):" in renamed.merged() and "def area(r):" not in renamed.merged()


def test_whitespace_insensitive_anchors():
    update = (
        "# ... existing code ...\ndef  perimeter( r ):\n    return math.tau * r\n"
        "# ... existing code ..."
    )
    plan = plan_update(PY, update)
    assert plan.chunks[0].how == "whitespace"
    assert plan.merged() == PY.replace(
        "def perimeter(r):\n    return 2 * math.pi * r",
        "def  perimeter( r ):\n    return math.tau * r",
    )


@pytest.mark.parametrize(
    ("update", "words"),
    [
        (
            "# ... existing code ...\nclass Unrelated:\n    pass\n# ... existing code ...",
            "matches no line",
        ),
        (
            "# ... existing code ...\n    x = 1\n    return x\n# ... existing code ...",
            "matches no line",
        ),
    ],
)
def test_an_update_that_matches_nothing_says_so(update, words):
    plan = plan_update(PY, update)
    assert not plan.is_certain and words in plan.problem()
    assert "unchanged lines" in plan.problem()


def test_an_update_that_fits_two_places_names_them():
    code = (
        "def a():\n    value = load()\n    return value\n\n\n"
        "def b():\n    value = load()\n    return value"
    )
    plan = plan_update(
        code,
        "# ... existing code ...\n    value = load(1)\n    return value\n# ... existing code ...",
    )
    assert not plan.is_certain
    assert "fits 2 places" in plan.problem() and "lines 2, 7" in plan.problem()
    # The check accepts a merge at either place, and nothing else.
    for place in ("def a():\n    value = load(1)", "def b():\n    value = load(1)"):
        merged = code.replace(place.replace("(1)", "()"), place, 1)
        check_merge(plan, merged)
    with pytest.raises(MergeFailedError):
        check_merge(plan, code.replace("load()", "load(1)"))


def test_chunks_out_of_order_contradict_the_original():
    update = (
        "# ... existing code ...\ndef main():\n    print(perimeter(3))\n# ... existing code ...\n"
        "class Circle:\n    def __init__(self, radius):\n        self.radius = radius\n\n"
        "    def diameter(self):\n        return 2 * self.radius\n# ... existing code ..."
    )
    with pytest.raises(MergeFailedError, match="order"):
        plan_update(PY, update)


def test_an_unplaced_chunk_may_go_anywhere_but_costs_no_line():
    update = "# ... existing code ...\ndef helper():\n    return 1\n# ... existing code ..."
    plan = plan_update(PY, update)
    assert not plan.is_certain
    helper = "def helper():\n    return 1\n\n\n"
    check_merge(plan, PY.replace("def main():", helper + "def main():"))
    check_merge(plan, PY.replace("def write(", helper + "def write("))
    with pytest.raises(MergeFailedError, match="lost"):
        check_merge(plan, drop_function(PY, "def write(path, text):") + "\n\n\n" + helper)
    with pytest.raises(MergeFailedError, match="neither"):
        check_merge(plan, PY + "\n\n\n" + helper + "print('extra')")


def test_chunks_of_splits_on_markers_and_trims_blank_edges():
    chunks = chunks_of("\n// ... existing code ...\n\nx = 1\n\n// ...\ny = 2\n")
    assert [chunk.lines for chunk in chunks] == [("x = 1",), ("y = 2",)]
    assert not chunks[0].opens_file and chunks[1].closes_file


def test_a_crlf_file_keeps_its_line_endings():
    original = "a = 1\r\nb = 2\r\nc = 3\r\n"
    assert plan_update(original, "b = 3").merged() == "a = 1\r\nb = 3\r\nc = 3\r\n"


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
