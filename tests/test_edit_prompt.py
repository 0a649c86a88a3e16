"""The next-edit prompt as pure functions: tag parsing, rendering, context fitting, answers."""

from __future__ import annotations

import itertools
import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from serve_app.engine.prompts.chat_encoding import encode_chat
from serve_app.engine.prompts.edit import (
    CURSOR,
    EditPrompt,
    Snippet,
    build_messages,
    extract_edited_region,
    fence_region,
    fit_to_context,
    parse_edit_prompt,
    read_answer,
    recent_renames,
    region_without_cursor,
    rejected_edit,
    render_edit_prompt,
    split_diffs,
)
from serve_app.engine.tiny import build_tiny_model
from serve_app.errors import ContextLengthExceededError, InvalidRequestError
from tests.fixtures.edit import EXAMPLE_EDIT_CONTENT

TAGS = [
    "recently_viewed_code_snippets",
    "edit_diff_history",
    "current_file_content",
    "code_to_edit",
]
EXAMPLE = parse_edit_prompt(EXAMPLE_EDIT_CONTENT)
REGION = region_without_cursor(EXAMPLE)
RENAMED = "        if subtotal < 0:\n            subtotal = 0.0\n        return add_tax(subtotal)"
OPTIONAL = TAGS[:2]
REQUIRED = TAGS[2:]


def section(tag: str, body: str = "\n") -> str:
    return f"<|{tag}|>{body}<|/{tag}|>\n"


def content(
    snippets: str = "\n",
    history: str = "\n",
    region: str = f"\n    return {CURSOR}a\n",
    path_line: str = "current_file_path: a.py\n",
) -> str:
    file = f"\n{path_line}def f(a):\n{section('code_to_edit', region)}"
    return section(TAGS[0], snippets) + section(TAGS[1], history) + section(TAGS[2], file)


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


# --- chat messages and context fitting -----------------------------------------------------


def test_messages_show_snippets_file_diffs_then_the_region_and_the_task() -> None:
    system, user = build_messages(EXAMPLE)
    assert system["role"] == "system" and "only the rewritten region" in system["content"]
    assert user["role"] == "user"
    text = user["content"]
    file_block = f"File shop/cart.py:\n```python\n{EXAMPLE.file_text}```"
    region_block = f"Region:\n```python\n{EXAMPLE.region}\n```"
    assert text.index("shop/models.py") < text.index(file_block) < text.index("```diff")
    assert text.index("```diff") < text.index(region_block)
    assert "+        subtotal = apply_discount(subtotal, code)" in text
    assert text.endswith(
        "Rewrite the region: rename `total` to `subtotal` in it, as the recent edits did."
    )
    trimmed = build_messages(EXAMPLE, drop_snippets=3, drop_diffs=3)[1]["content"]
    assert "shop/models.py" not in trimmed and "```diff" not in trimmed
    assert trimmed.endswith(
        f"Rewrite the region: finish the code at {CURSOR} and keep the other lines."
    )


@pytest.mark.parametrize(
    ("diff", "region", "expected"),
    [
        ("-    total = 0\n+    subtotal = 0", "total += 1", [("total", "subtotal")]),
        ("-f(url, a)\n+f(endpoint, b)", "url; a", [("a", "b"), ("url", "endpoint")]),
        ("-    total = 0\n+    subtotal = 0", "count += 1", []),  # region lacks the old name
        ("-x = 1\n+x = 2", "x", []),  # a literal changed, not a name
        ("-x = a\n+x = a + b", "a", []),  # lines of different shapes
        ("-if x:\n+elif x:", "if", []),  # keywords are not names
        ("-a\n-b\n+c", "a b", []),  # unequal blocks cannot be paired
        ("-a = 1\n+b = 1\n-c = 2\n+d = 2", "a c", [("a", "b"), ("c", "d")]),
        (
            "--- a/f.py\n+++ b/f.py\n@@ -1 +1 @@\n-n = 1\n+m = 1\n k\n-m = 1\n+p = 1",
            "n m",
            [("n", "m"), ("m", "p")],
        ),
    ],
)
def test_recent_renames(diff: str, region: str, expected: list[tuple[str, str]]) -> None:
    assert recent_renames([diff], region) == expected


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("tiny")))


def token_count(tokenizer, messages: list[dict[str, str]]) -> int:
    return len(encode_chat(tokenizer, messages))


@pytest.mark.parametrize(("drop_snippets", "drop_diffs"), [(0, 0), (1, 0), (3, 0), (3, 2), (3, 3)])
def test_fit_to_context_drops_oldest_snippets_then_oldest_diffs(
    tokenizer, drop_snippets: int, drop_diffs: int
) -> None:
    expected = build_messages(EXAMPLE, drop_snippets=drop_snippets, drop_diffs=drop_diffs)
    budget = token_count(tokenizer, expected)
    messages, ids = fit_to_context(EXAMPLE, tokenizer, budget)
    assert messages == expected
    assert len(ids) == budget
    assert ids == encode_chat(tokenizer, messages)


def many_diffs(count: int) -> EditPrompt:
    diffs = [
        f"--- a/m.py\n+++ b/m.py\n@@ -{n} +{n} @@\n-v{n} = {n}\n+w{n} = {n}" for n in range(count)
    ]
    return EditPrompt("m.py", "x = 1\n", f"y = {CURSOR}2", "\n", EXAMPLE.snippets, diffs)


@pytest.mark.parametrize("budget_drop", [1, 5, 17, 40])
def test_fit_to_context_drops_the_fewest_and_encodes_the_prompt_a_few_times(
    tokenizer, budget_drop: int
) -> None:
    prompt = many_diffs(40)
    sizes = []
    for drop in range(41):
        sizes.append(
            token_count(tokenizer, build_messages(prompt, drop_snippets=3, drop_diffs=drop))
        )
    budget = sizes[budget_drop]
    calls = []
    counting = CountingTokenizer(tokenizer, calls)
    messages, ids = fit_to_context(prompt, counting, budget)
    assert messages == build_messages(prompt, drop_snippets=3, drop_diffs=budget_drop)
    assert len(ids) == budget
    # Whole-prompt encodings (each a chat template render): the first, then a few to confirm.
    assert calls.count("template") <= 4


class CountingTokenizer:
    """The tokenizer, counting how often a whole chat prompt is rendered."""

    def __init__(self, tokenizer, calls: list[str]) -> None:
        self._tokenizer, self._calls = tokenizer, calls

    def apply_chat_template(self, *args, **kwargs):
        self._calls.append("template")
        return self._tokenizer.apply_chat_template(*args, **kwargs)

    def encode(self, *args, **kwargs):
        return self._tokenizer.encode(*args, **kwargs)


def test_fit_to_context_keeps_the_newest_diff_when_dropping() -> None:
    kept = build_messages(EXAMPLE, drop_snippets=3, drop_diffs=2)[1]["content"]
    assert EXAMPLE.diffs[2] in kept and EXAMPLE.diffs[1] not in kept


def test_fit_to_context_raises_when_even_the_file_does_not_fit(tokenizer) -> None:
    smallest = token_count(tokenizer, build_messages(EXAMPLE, drop_snippets=3, drop_diffs=3))
    with pytest.raises(ContextLengthExceededError) as caught:
        fit_to_context(EXAMPLE, tokenizer, smallest - 1, context_length=32768)
    assert caught.value.param == "messages"
    assert caught.value.code == "context_length_exceeded"
    assert "maximum context length for this model of 32768" in caught.value.message


# --- reading the model's answer ------------------------------------------------------------


def test_extract_fenced_answer_with_prose_around_it() -> None:
    completion = f"Here is the updated region:\n```python\n{RENAMED}\n```\nThe variable is renamed."
    assert extract_edited_region(completion, EXAMPLE) == (RENAMED, True)


def test_extract_unfenced_answer() -> None:
    assert extract_edited_region(RENAMED, EXAMPLE) == (RENAMED, True)
    prose = f"Sure, here is the code:\n\n{RENAMED}\n\nThis renames total to subtotal."
    assert extract_edited_region(prose, EXAMPLE) == (RENAMED, True)


def test_extract_strips_stray_tags_and_the_cursor() -> None:
    completion = (
        f"```python\n<|code_to_edit|>\n        {CURSOR}if subtotal < 0:\n"
        "            subtotal = 0.0\n        return add_tax(subtotal)\n"
        "<|/code_to_edit|>\n```<|im_end|>"
    )
    assert extract_edited_region(completion, EXAMPLE) == (RENAMED, True)


ABOVE = (
    "        subtotal = sum(item.price * item.quantity for item in self.items)\n"
    "        subtotal = apply_discount(subtotal, code)"
)


@pytest.mark.parametrize("echo", [ABOVE, ABOVE.split("\n")[1]])
def test_extract_drops_lines_above_the_region_copied_in_front_of_it(echo: str) -> None:
    """The 0.5B sometimes starts its rewrite from the lines just above the region; spliced
    in, they would be doubled in the user's file."""
    assert extract_edited_region(f"```\n{echo}\n{RENAMED}\n```", EXAMPLE) == (RENAMED, True)


@pytest.mark.parametrize(
    "completion",
    [
        # not the lines right above (the first of the two alone): an edit, kept
        f"{ABOVE.split(chr(10))[0]}\n{RENAMED}",
        # nothing but the echo: there would be no code left
        ABOVE,
    ],
)
def test_extract_keeps_lines_that_are_not_an_echo_of_the_lines_above(completion: str) -> None:
    text, _ = extract_edited_region(f"```\n{completion}\n```", EXAMPLE)
    assert text == completion


def test_extract_keeps_a_region_that_itself_starts_like_the_line_above() -> None:
    """A region whose first line equals the line above it comes back whole."""
    prompt = parse_edit_prompt(content(region=f"\ndef f(a):\n    return {CURSOR}a\n"))
    answer = "def f(a):\n    return a + 1"
    assert extract_edited_region(f"```\n{answer}\n```", prompt) == (answer, True)


def test_extract_refuses_an_answer_that_is_a_copy_of_the_edit_history() -> None:
    """Zed's history in the answer (seen from the 0.5B): spliced in, the client would write a
    diff into the user's file, so the region comes back unchanged."""
    history = (
        "// User accepted prediction:\n--- a/project/shop/cart.py\n+++ b/project/shop/cart.py\n"
        "@@ -8,3 +8,3 @@\n-        total = apply_discount(total, code)\n"
        "+        subtotal = apply_discount(subtotal, code)\n         if total < 0:"
    )
    assert extract_edited_region(f"```\n{history}\n```", EXAMPLE) == (REGION, False)


def test_extract_keeps_a_diff_when_the_region_is_one() -> None:
    region = "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a = 1\n+a = 2"
    prompt = parse_edit_prompt(
        content(region=f"\n{CURSOR}{region}\n", path_line="current_file_path: x.diff\n")
    )
    answer = region.replace("a = 2", "a = 3")
    assert extract_edited_region(f"```\n{answer}\n```", prompt) == (answer, True)


def test_extract_handles_a_lone_fence() -> None:
    assert extract_edited_region(f"{RENAMED}\n```\nDone.", EXAMPLE) == (RENAMED, True)
    assert extract_edited_region(f"```python\n{RENAMED}", EXAMPLE) == (RENAMED, True)


@pytest.mark.parametrize(
    "completion", ["", "  \n", "```python\n```", "I cannot help with that request.", "<|im_end|>"]
)
def test_extract_falls_back_to_the_original_region(completion: str) -> None:
    assert extract_edited_region(completion, EXAMPLE) == (REGION, False)


def test_extract_keeps_tags_the_users_own_code_holds() -> None:
    prompt = parse_edit_prompt(content(region=f'\n    return a + "<|endoftext|>"{CURSOR}\n'))
    completion = '```python\n    return a + "<|endoftext|>"<|cursor|>\n```'
    assert extract_edited_region(completion, prompt) == ('    return a + "<|endoftext|>"', True)


def test_fence_region_is_what_zed_and_continue_cut() -> None:
    fenced = fence_region(RENAMED)
    assert fenced.startswith("```\n") and fenced.endswith("\n```")
    assert fenced[4:-4] == RENAMED


_noise = st.lists(
    st.sampled_from(
        [
            "<|",
            "|>",
            "cursor",
            "/",
            "im_end",
            "```",
            "\n",
            "x = 1",
            "Here is the code:",
            " ",
        ]
    ),
    max_size=12,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(_noise)
def test_extract_never_returns_a_tag_or_the_cursor(completion: str) -> None:
    text, _ = extract_edited_region(completion, EXAMPLE)
    assert CURSOR not in text
    assert not re.search(r"<\|/?\w+\|>", text)


# --- checking the answer before it is sent ------------------------------------------------------


def lines(*texts: str) -> str:
    return "\n".join(texts)


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        # the rename, written as a diff into the code
        (
            lines("-        if total < 0:", "+        if subtotal < 0:", *RENAMED.split("\n")[1:]),
            "diff_markers",
        ),
        (lines("@@ -36,3 +36,3 @@", RENAMED), "diff_markers"),
        # a level of indentation lost on every line, the edited ones too
        ("\n".join(line[4:] for line in RENAMED.split("\n")), "indent_shift"),
        ("\n".join(line[4:] for line in REGION.split("\n")), "indent_shift"),
        # the first line only: the rest of the region, its last line too, is gone
        ("        if subtotal < 0:", "dropped_lines"),
        # the lines the history added above the region, instead of the region
        (ABOVE, "history_copy"),
        # whitespace only
        (REGION.replace("total = 0.0", "total  =  0.0"), "reformat_only"),
    ],
    ids=[
        "diff-lines",
        "hunk-header",
        "indent-edited",
        "indent-copied",
        "dropped",
        "history",
        "reformat",
    ],
)
def test_answers_that_are_not_edits_are_rejected(answer: str, reason: str) -> None:
    assert rejected_edit(answer, EXAMPLE) == reason


@pytest.mark.parametrize(
    "answer",
    [
        REGION,  # no change is an answer
        RENAMED,  # the edit
        "        return add_tax(total)",  # the if-block deleted, the lines after it kept
        lines(
            "        if total < 0:",
            "            total = 0.0",
            "        total = round(total, 2)",
            "        return add_tax(total)",
        ),  # a line added
        # the region wrapped in a block: the first line stays where it was
        lines("        if code:", "    " + REGION.replace("\n", "\n    ")),
        # a line the history removed, put back here: a moved line, not a copy
        lines("        total = sum(item.price * item.quantity for item in self.items)", REGION),
    ],
    ids=["unchanged", "renamed", "deleted-block", "added-line", "wrapped", "moved-line"],
)
def test_edits_pass_the_checks(answer: str) -> None:
    assert rejected_edit(answer, EXAMPLE) is None


def test_a_minus_line_that_is_code_is_not_a_diff_marker() -> None:
    prompt = parse_edit_prompt(content(region=f"\n    x = {CURSOR}a\n    -b\n"))
    assert rejected_edit("    x = a\n    -b\n-c", prompt) is None


def test_read_answer_says_why_it_answers_no_change() -> None:
    fenced = f"```python\n{RENAMED}\n```"
    assert read_answer(fenced, EXAMPLE, "stop") == (RENAMED, None)
    # max_tokens hit after the block closed (prose after it): the block is whole
    assert read_answer(fenced + "\nThe variable", EXAMPLE, "length") == (RENAMED, None)
    # hit inside the block: the region's tail would be lost
    assert read_answer(fenced[:-4], EXAMPLE, "length") == (REGION, "cut_off")
    assert read_answer("I cannot help.", EXAMPLE, "stop") == (REGION, "unusable")
    assert read_answer(f"```\n{ABOVE}\n{RENAMED}\n```", EXAMPLE, "stop") == (RENAMED, None)
    assert read_answer("```\n        if subtotal < 0:\n```", EXAMPLE, "stop") == (
        REGION,
        "dropped_lines",
    )
