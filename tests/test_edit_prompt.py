"""The next-edit prompt's tags: parsing a request, every malformed one, the diff history,
and the render -> parse round trip."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from serve_app.errors import InvalidRequestError
from serve_app.prompts.next_edit import (
    CURSOR,
    EditPrompt,
    Snippet,
    parse_edit_prompt,
    render_edit_prompt,
    split_diffs,
)
from tests.fixtures.edit import EXAMPLE, EXAMPLE_EDIT_CONTENT, REGION, TAGS, content, section

OPTIONAL = TAGS[:2]
REQUIRED = TAGS[2:]


def invalid(text: str) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as caught:
        parse_edit_prompt(text)
    assert caught.value.param == "messages"
    assert caught.value.code == "invalid_value"
    return caught.value


# --- parsing a realistic request ------------------------------------------------------------


def test_example_parses_into_its_parts() -> None:
    assert [s.path for s in EXAMPLE.snippets] == [
        "shop/models.py",
        "shop/discounts.py",
        "shop/tax.py",
    ]
    assert EXAMPLE.snippets[2].code.startswith("TAX_RATE = 0.2\n")
    assert len(EXAMPLE.diffs) == 3
    assert all(
        diff.startswith("--- a/shop/cart.py\n+++ b/shop/cart.py\n@@") for diff in EXAMPLE.diffs
    )
    assert EXAMPLE.diffs[0].endswith("+from shop.tax import add_tax")
    assert EXAMPLE.file_path == "shop/cart.py"
    assert EXAMPLE.file_text.count("\n") == 40
    assert EXAMPLE.file_before.startswith('"""Shopping cart')
    assert EXAMPLE.file_before.endswith("subtotal = apply_discount(subtotal, code)\n")
    # The region is exactly the lines between the tags: the newline ending its last line
    # belongs to the file after it.
    assert REGION == "        if total < 0:\n            total = 0.0\n        return add_tax(total)"
    assert EXAMPLE.region[EXAMPLE.cursor_offset :].startswith(CURSOR + "if total")
    assert EXAMPLE.file_after == "\n"
    assert EXAMPLE.region_inline


def test_render_of_the_example_parses_back() -> None:
    assert parse_edit_prompt(render_edit_prompt(EXAMPLE)) == EXAMPLE


def test_empty_snippet_and_history_sections_are_valid() -> None:
    prompt = parse_edit_prompt(content(snippets="", history=""))
    assert prompt.snippets == [] and prompt.diffs == []
    assert parse_edit_prompt(content(snippets="\n\n  \n", history="\n \n")).diffs == []


def test_region_after_the_file_is_located_in_it() -> None:
    text = (
        section(TAGS[0])
        + section(TAGS[1])
        + section(TAGS[2], "\ncurrent_file_path: a.py\nx = 1\ny = 2\nz = 3\n")
        + section("code_to_edit", f"\ny = {CURSOR}2\n")
    )
    prompt = parse_edit_prompt(text)
    assert (prompt.file_before, prompt.region, prompt.file_after) == (
        "x = 1\n",
        "y = <|cursor|>2",
        "\nz = 3\n",
    )
    assert not prompt.region_inline
    assert parse_edit_prompt(render_edit_prompt(prompt)) == prompt


def test_region_after_the_file_that_is_not_in_it_follows_the_file() -> None:
    text = (
        section(TAGS[0]) + section(TAGS[1]) + section(TAGS[2], "\ncurrent_file_path: a.py\nx = 1\n")
    )
    prompt = parse_edit_prompt(text + section("code_to_edit", f"\nw{CURSOR}\n"))
    assert (prompt.file_before, prompt.file_after) == ("x = 1\n", "")


def test_region_without_trailing_newline_keeps_the_text_after_it() -> None:
    # Zed's layout: the region ends where its last line's text does, the closing tag follows
    # it directly and the newline after the tag is layout.
    prompt = parse_edit_prompt(content(region=f"\n    return {CURSOR}a") + "")
    assert prompt.region == f"    return {CURSOR}a"
    assert prompt.file_after == ""
    zed = content(region=f"\n    return {CURSOR}a").replace(
        "<|/code_to_edit|>\n", "<|/code_to_edit|>\n\nprint(f(1))"
    )
    assert parse_edit_prompt(zed).file_after == "\nprint(f(1))"
    assert parse_edit_prompt(zed).file_text.endswith("    return a\nprint(f(1))")


# --- every malformed request names what is wrong --------------------------------------------


@pytest.mark.parametrize("tag", REQUIRED)
def test_missing_tag(tag: str) -> None:
    text = EXAMPLE_EDIT_CONTENT.replace(f"<|{tag}|>", "").replace(f"<|/{tag}|>", "")
    assert f"missing tag <|{tag}|>" in invalid(text).message


@pytest.mark.parametrize("tag", OPTIONAL)
def test_missing_snippets_or_history_section_is_empty(tag: str) -> None:
    start = EXAMPLE_EDIT_CONTENT.index(f"<|{tag}|>")
    end = EXAMPLE_EDIT_CONTENT.index(f"<|/{tag}|>") + len(f"<|/{tag}|>")
    prompt = parse_edit_prompt(EXAMPLE_EDIT_CONTENT[:start] + EXAMPLE_EDIT_CONTENT[end:])
    assert (prompt.snippets if tag == TAGS[0] else prompt.diffs) == []
    assert prompt.region == EXAMPLE.region


@pytest.mark.parametrize("tag", TAGS)
def test_missing_opening_marker(tag: str) -> None:
    message = invalid(EXAMPLE_EDIT_CONTENT.replace(f"<|{tag}|>", "")).message
    assert f"missing tag <|{tag}|> (found only its closing tag <|/{tag}|>)" in message


@pytest.mark.parametrize("tag", TAGS)
def test_duplicated_tag(tag: str) -> None:
    text = EXAMPLE_EDIT_CONTENT + section(tag)
    assert f"tag <|{tag}|> appears twice" in invalid(text).message


@pytest.mark.parametrize("tag", TAGS)
def test_duplicated_closing_marker(tag: str) -> None:
    text = EXAMPLE_EDIT_CONTENT + f"<|/{tag}|>" * 2
    assert f"closing tag <|/{tag}|> appears 3 times" in invalid(text).message


@pytest.mark.parametrize("tag", TAGS)
def test_unclosed_tag(tag: str) -> None:
    message = invalid(EXAMPLE_EDIT_CONTENT.replace(f"<|/{tag}|>", "")).message
    assert f"tag <|{tag}|> is not closed: missing <|/{tag}|>" in message


def test_closing_marker_before_opening_marker() -> None:
    text = content().replace(
        "<|edit_diff_history|>\n<|/edit_diff_history|>",
        "<|/edit_diff_history|><|edit_diff_history|>",
    )
    assert (
        "closing tag <|/edit_diff_history|> appears before <|edit_diff_history|>"
        in invalid(text).message
    )


def top_level_sections(text: str) -> list[str]:
    """The example's three top-level sections, each with its tags."""
    return [
        text[text.index(f"<|{tag}|>") : text.index(f"<|/{tag}|>") + len(tag) + 5]
        for tag in TAGS[:3]
    ]


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
@pytest.mark.parametrize("separator", ["", "\n", "\n\n"])
def test_top_level_sections_in_any_order_and_spacing(
    order: tuple[int, ...], separator: str
) -> None:
    sections = top_level_sections(EXAMPLE_EDIT_CONTENT)
    text = separator.join(sections[i] for i in order) + "\n"
    assert parse_edit_prompt(text) == EXAMPLE


def test_section_inside_another_section_is_refused() -> None:
    snippets, history, file = top_level_sections(EXAMPLE_EDIT_CONTENT)
    nested = snippets.replace(
        "<|/recently_viewed_code_snippets|>", history + "<|/recently_viewed_code_snippets|>"
    )
    message = invalid(nested + file).message
    assert (
        "sections overlap: <|edit_diff_history|> starts inside <|recently_viewed_code_snippets|>"
        in message
    )


@pytest.mark.parametrize("empty", ["\n\n", "\n", ""])
def test_empty_sections_written_either_way(empty: str) -> None:
    text = content(snippets=empty, history=empty)
    prompt = parse_edit_prompt(text)
    assert prompt.snippets == [] and prompt.diffs == []


def test_trailing_next_edit_marker_is_dropped() -> None:
    assert parse_edit_prompt(EXAMPLE_EDIT_CONTENT + "\n\n<|!@#IS_NEXT_EDIT!@#|>") == EXAMPLE
    assert parse_edit_prompt(EXAMPLE_EDIT_CONTENT.rstrip() + "<|!@#IS_NEXT_EDIT!@#|>\n") == EXAMPLE


def test_code_to_edit_after_text_on_the_same_line() -> None:
    text = content().replace("def f(a):\n<|code_to_edit|>", "def f(a):<|code_to_edit|>")
    prompt = parse_edit_prompt(text)
    assert prompt.file_before == "def f(a):"
    assert prompt.region == f"    return {CURSOR}a"


def test_region_before_the_file_is_out_of_order() -> None:
    region = section("code_to_edit", f"\nx{CURSOR}\n")
    text = (
        section(TAGS[0]) + section(TAGS[1]) + region + section(TAGS[2], "\ncurrent_file_path: a\n")
    )
    message = invalid(text).message
    assert "tags out of order: <|code_to_edit|>...<|/code_to_edit|> must sit inside" in message


def test_region_straddling_the_end_of_the_file_is_out_of_order() -> None:
    text = content().replace(
        "<|/code_to_edit|>\n<|/current_file_content|>", "<|/current_file_content|><|/code_to_edit|>"
    )
    assert "tags out of order: <|code_to_edit|>" in invalid(text).message


@pytest.mark.parametrize(("region", "found"), [("\nreturn a\n", 0), (f"\n{CURSOR}a{CURSOR}\n", 2)])
def test_cursor_count_other_than_one(region: str, found: int) -> None:
    message = invalid(content(region=region)).message
    assert f"<|code_to_edit|> must contain exactly one <|cursor|> marker; found {found}" in message


def test_cursor_outside_the_region() -> None:
    text = content().replace("def f(a):", f"def f({CURSOR}a):")
    assert (
        "<|cursor|> may only appear inside <|code_to_edit|>; found 1 outside it"
        in invalid(text).message
    )


def test_missing_path_lines() -> None:
    assert "<|current_file_content|> must start with a line 'current_file_path: PATH'" in (
        invalid(content(path_line="")).message
    )
    snippet = section("recently_viewed_code_snippet", "\nx = 1\n")
    assert (
        "<|recently_viewed_code_snippet|> must start with a line 'code_snippet_file_path: PATH'"
        in (invalid(content(snippets="\n" + snippet)).message)
    )


@pytest.mark.parametrize(
    ("snippets", "expected"),
    [
        (
            "\n<|recently_viewed_code_snippet|>\ncode_snippet_file_path: a\n",
            "<|recently_viewed_code_snippet|> is not closed",
        ),
        (
            "\n<|/recently_viewed_code_snippet|>\n",
            "closing tag <|/recently_viewed_code_snippet|> has no opening",
        ),
        (
            "\nloose code\n",
            "text inside <|recently_viewed_code_snippets|> must sit in "
            "<|recently_viewed_code_snippet|> blocks",
        ),
        (
            "\n<|recently_viewed_code_snippet|>\ncode_snippet_file_path: a\n"
            "<|recently_viewed_code_snippet|>\ncode_snippet_file_path: b\n"
            "<|/recently_viewed_code_snippet|>\n",
            "<|recently_viewed_code_snippet|> is not closed",
        ),
    ],
)
def test_malformed_snippet_blocks(snippets: str, expected: str) -> None:
    assert expected in invalid(content(snippets=snippets)).message


def test_snippet_block_outside_the_snippets_section() -> None:
    history = "\n" + section("recently_viewed_code_snippet", "\ncode_snippet_file_path: a\nx\n")
    message = invalid(content(history=history)).message
    assert (
        "tag <|recently_viewed_code_snippet|> found outside <|recently_viewed_code_snippets|>"
        in message
    )


# --- splitting the diff history -----------------------------------------------------------


def test_split_diffs_keeps_git_headers_and_multi_hunk_diffs_together() -> None:
    git = "diff --git a/x.py b/x.py\nindex 1..2 100644\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b"
    two_hunks = "--- a/y.py\n+++ b/y.py\n@@ -1 +1 @@\n-c\n+d\n@@ -9 +9 @@\n-e\n+f"
    assert split_diffs(f"\n{git}\n\n{two_hunks}\n{git}\n") == [git, two_hunks, git]


DIFF_A = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b"
DIFF_B = "--- y.py\n+++ y.py\n@@ -2,2 +2,2 @@\n c\n-d\n+e"


@pytest.mark.parametrize("separator", ["\n", "\n\n", "\n\n\n"])
def test_split_diffs_with_any_number_of_newlines_between(separator: str) -> None:
    assert split_diffs(separator.join([DIFF_A, DIFF_B, DIFF_A])) == [DIFF_A, DIFF_B, DIFF_A]


def test_split_diffs_keeps_index_and_separator_lines_with_their_diff() -> None:
    svn = (
        "Index: y.py\n===================================================================\n"
        + DIFF_B
    )
    assert split_diffs(f"{svn}\n{svn}\n\n{DIFF_A}") == [svn, svn, DIFF_A]


def test_split_diffs_keeps_zeds_accepted_prediction_note_with_its_diff() -> None:
    accepted = "// User accepted prediction:\n" + DIFF_A
    assert split_diffs(f"{DIFF_B}\n{accepted}\n{DIFF_B}\n") == [DIFF_B, accepted, DIFF_B]


def test_split_diffs_splits_bare_hunks_one_per_edit() -> None:
    hunks = ["@@ -1 +1 @@\n-a\n+b", "@@ -5,2 +5,2 @@\n x\n-c\n+d"]
    assert split_diffs("\n".join(hunks)) == hunks


def test_split_diffs_does_not_split_at_a_removed_line_that_looks_like_a_header() -> None:
    diff = "--- a/q.sql\n+++ b/q.sql\n@@ -1,2 +1,2 @@\n--- old comment\n+-- new comment\n select 1"
    assert split_diffs(diff) == [diff]
    assert split_diffs("") == [] and split_diffs("\n \n") == []


# --- render -> parse round trip ---------------------------------------------------------------

_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=30).filter(
    lambda s: "<|" not in s
)
_path = st.from_regex(r"[a-z][a-z0-9_/]{0,12}\.(py|ts|go)", fullmatch=True)
_line = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\n+-<"), max_size=20)


@st.composite
def _diffs(draw: st.DrawFn) -> str:
    path = draw(_path)
    body = draw(st.lists(st.tuples(st.sampled_from("-+ "), _line), min_size=1, max_size=4))
    lines = "\n".join(sign + text for sign, text in body)
    return f"--- a/{path}\n+++ b/{path}\n@@ -1,{len(body)} +1,{len(body)} @@\n{lines}"


@st.composite
def _prompts(draw: st.DrawFn) -> EditPrompt:
    snippets = draw(st.lists(st.builds(Snippet, _path, _text), max_size=3))
    return EditPrompt(
        file_path=draw(_path),
        file_before=draw(_text),
        region=draw(_text) + CURSOR + draw(_text),
        file_after=draw(_text),
        snippets=snippets,
        diffs=draw(st.lists(_diffs(), max_size=3)),
    )


@settings(max_examples=150, deadline=None)
@given(_prompts())
def test_render_then_parse_is_the_identity(prompt: EditPrompt) -> None:
    # A region's trailing newline is the file's, once the text after it starts a new line.
    assume(not (prompt.region.endswith("\n") and not prompt.file_after.startswith("\n")))
    assert parse_edit_prompt(render_edit_prompt(prompt)) == prompt
