"""A next-edit answer never damages the user's file, whatever the model writes.

Property tests over generated cases: a window of a standard-library module (code no one here
wrote) as the file, a region of its lines with the cursor somewhere in it, and an answer made
from the region by the edits a small model gets wrong (copies of the lines just above or
below it, near copies, dropped, duplicated and retyped lines), written in each answer layout
(fenced region, changed span, plain) and read back by ``read_answer`` as the service reads a
model's text. Whatever comes back, spliced into the file as a client splices it:

- every line outside the region is as it was;
- no line the region did not hold is a copy of one of the three lines just above or below it
  (exact or near, difflib's ratio >= 0.8, for lines of 12 characters or more, unless the line
  is closer still to a line of the region, or finishes the cursor's line: that line's edit);
- a file that parsed (Python's ``ast``) still parses.
"""

from __future__ import annotations

import ast
import sysconfig
from collections import Counter
from difflib import SequenceMatcher
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serve_app.prompts.next_edit import CURSOR, EditPrompt, parse_edit_prompt, read_answer
from serve_app.prompts.next_edit.extract import model_answer

STDLIB = Path(sysconfig.get_paths()["stdlib"])
MODULES = ["textwrap.py", "csv.py", "shlex.py", "fnmatch.py", "bisect.py", "colorsys.py"]
STYLES = ["chat", "chat_span", "zeta"]
PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))


def module_lines(name: str) -> list[str]:
    return (STDLIB / name).read_text().split("\n")


@st.composite
def cases(draw: st.DrawFn) -> tuple[EditPrompt, list[str]]:
    """A file window, its region (lines ``start``..``end``) with a cursor, and answer lines."""
    source = module_lines(draw(st.sampled_from(MODULES)))
    first = draw(st.integers(0, len(source) - 40))
    window = source[first : first + draw(st.integers(12, 40))]
    start = draw(st.integers(0, len(window) - 2))
    end = draw(st.integers(start + 1, min(len(window), start + 6)))
    region = window[start:end]
    row = draw(st.integers(0, len(region) - 1))
    column = draw(st.integers(0, len(region[row])))
    marked = [*region]
    marked[row] = region[row][:column] + CURSOR + region[row][column:]
    prompt = EditPrompt(
        file_path="module.py",
        file_before="".join(line + "\n" for line in window[:start]),
        region="\n".join(marked),
        file_after="".join("\n" + line for line in window[end:]),
    )
    border = window[max(0, start - 3) : start] + window[end : end + 3]
    return prompt, draw(answers(region, border, window))


def answers(region: list[str], border: list[str], window: list[str]) -> st.SearchStrategy:
    """The region after a few of a small model's mistakes (or right edits)."""
    edit = st.one_of(
        st.tuples(st.just("copy"), st.sampled_from(border or [""]), st.integers(0, 99)),
        st.tuples(st.just("near"), st.sampled_from(border or [""]), st.integers(0, 99)),
        st.tuples(st.just("drop"), st.just(""), st.integers(0, 99)),
        st.tuples(st.just("again"), st.just(""), st.integers(0, 99)),
        st.tuples(st.just("insert"), st.sampled_from(window), st.integers(0, 99)),
        st.tuples(st.just("retype"), st.text("abcx_ ()=:.,'", max_size=12), st.integers(0, 99)),
    )
    return st.lists(edit, max_size=3).map(lambda edits: _apply(region, edits))


def _apply(region: list[str], edits: list[tuple[str, str, int]]) -> list[str]:
    lines = [*region]
    for kind, text, at in edits:
        at %= len(lines) + 1
        if kind == "copy":
            lines.insert(at, text)
        elif kind == "near":
            lines.insert(at, text.replace("self", "this", 1).replace("(", "( ", 1) + "  # x")
        elif kind == "drop" and lines and at < len(lines):
            del lines[at]
        elif kind == "again" and lines and at < len(lines):
            lines.insert(at, lines[at])
        elif kind == "insert":
            lines.insert(at, text)
        elif kind == "retype" and lines and at < len(lines):
            lines[at] = lines[at][: len(lines[at]) // 2] + text
    return lines or [""]


def border_lines(prompt: EditPrompt) -> list[str]:
    above = [line.strip() for line in prompt.file_before.split("\n")[:-1] if line.strip()]
    below = [line.strip() for line in prompt.file_after.split("\n")[1:] if line.strip()]
    return above[-3:] + below[:3]


def parses(source: str) -> bool:
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return True


def likeness(a: str, b: str) -> float:
    return SequenceMatcher(None, a, b, autojunk=False).ratio()


@pytest.mark.parametrize("style", STYLES)
def test_an_answer_never_damages_the_file(style: str) -> None:
    @PROPERTY
    @given(case=cases())
    def check(case: tuple[EditPrompt, list[str]]) -> None:
        prompt, answer_lines = case
        text = model_answer("\n".join(answer_lines), prompt, style)
        if text is None:  # a span of lines the shown region lacks: no model can write it
            return
        original = prompt.region.replace(CURSOR, "")
        region, _ = read_answer(text, prompt, "stop", style)
        new_file = prompt.file_before + region + prompt.file_after
        assert new_file.startswith(prompt.file_before) and new_file.endswith(prompt.file_after)
        held = Counter(line.strip() for line in original.split("\n"))
        region_lines = [line for line in held if line]
        border = border_lines(prompt)
        typing = next(line for line in prompt.region.split("\n") if CURSOR in line)
        begun = typing.replace(CURSOR, "").strip()
        for line in (line.strip() for line in region.split("\n")):
            if held[line] > 0:
                held[line] -= 1
                continue
            if len(line) < 12 or (len(begun) >= 4 and line.startswith(begun)):
                continue
            assert line not in border, (line, border)
            to_border = max((likeness(line, b) for b in border), default=0.0)
            to_region = max((likeness(line, r) for r in region_lines), default=0.0)
            assert to_border < 0.8 or to_region >= to_border, (line, border)
        if parses(prompt.file_text):
            assert parses(new_file), region

    check()


README_EDIT = (
    "<|recently_viewed_code_snippets|>\n\n<|/recently_viewed_code_snippets|>\n\n"
    "<|current_file_content|>\ncurrent_file_path: cart.py\ndef subtotal(items):\n"
    "    return sum(i.price for i in items)\n\n<|code_to_edit|>\nprint(total(cart)<|cursor|>)\n"
    "<|/code_to_edit|>\n<|/current_file_content|>\n\n<|edit_diff_history|>\n--- cart.py\n"
    "+++ cart.py\n@@ -1,2 +1,2 @@\n-def total(items):\n+def subtotal(items):\n"
    "<|/edit_diff_history|>\n"
)


@pytest.mark.parametrize("style", STYLES)
def test_the_readme_example_with_an_edited_copy_of_the_line_above_is_no_change(style) -> None:
    """The README's next-edit example, answered as the adapter answered it: an edited copy of
    the line above the region and the region's line (a second ``return``, at module level)."""
    prompt = parse_edit_prompt(README_EDIT)
    answer = "    return sum(i.price for i in cart)\nprint(total(cart))"
    text = model_answer(answer, prompt, style)
    if text is None:
        pytest.skip("the shown region cannot hold that answer in this layout")
    region, rejected = read_answer(text, prompt, "stop", style)
    assert region == prompt.region.replace(CURSOR, "") and rejected == "border_copy"


# Files in other languages, each with a region and an answer that drops a closing brace (the
# file no longer parses) or makes the edit (it still does).
OTHER_LANGUAGES = [
    ("main.go", "package main\n\nfunc total(xs []int) int {\n\ts := 0\n",
     "\tfor _, x := range xs {\n\t\ts += x\n\t}", "\treturn s\n}\n",
     "\tfor _, x := range xs {\n\t\ts += 2 * x", "\tfor _, x := range xs {\n\t\ts += 2 * x\n\t}"),
    ("cart.ts", "export function total(items: number[]): number {\n  let s = 0;\n",
     "  for (const x of items) {\n    s += x;\n  }", "  return s;\n}\n",
     "  for (const x of items) {\n    s += 2 * x;",
     "  for (const x of items) {\n    s += 2 * x;\n  }"),
    ("lib.rs", "pub fn total(xs: &[i32]) -> i32 {\n    let mut s = 0;\n",
     "    for x in xs {\n        s += x;\n    }", "    s\n}\n",
     "    for x in xs {\n        s += 2 * x;", "    for x in xs {\n        s += 2 * x;\n    }"),
]  # fmt: skip


@pytest.mark.parametrize(("path", "before", "region", "after", "broken", "edited"), OTHER_LANGUAGES)
def test_an_answer_that_breaks_a_file_in_another_language_is_no_change(
    path: str, before: str, region: str, after: str, broken: str, edited: str
) -> None:
    """tree-sitter judges what ``ast`` cannot: the answer that leaves the file unparsable is
    "no change"; the edit is kept; a language with no grammar here is not judged."""
    prompt = EditPrompt(
        file_path=path, file_before=before, region=CURSOR + region, file_after="\n" + after
    )
    kept, rejected = read_answer(model_answer(edited, prompt, "chat"), prompt, "stop", "chat")
    assert kept == edited and rejected is None
    kept, rejected = read_answer(model_answer(broken, prompt, "chat"), prompt, "stop", "chat")
    assert kept == region and rejected == "breaks_syntax"
    unknown = EditPrompt(file_path="cart.zig", file_before=before, region=CURSOR + region,
                         file_after="\n" + after)  # fmt: skip
    kept, rejected = read_answer(model_answer(broken, unknown, "chat"), unknown, "stop", "chat")
    assert kept == broken and rejected is None
