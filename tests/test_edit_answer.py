"""The model's answer to a next-edit request: reading the region out of it, and checking it
is an edit before it is sent."""

from __future__ import annotations

import dataclasses
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.prompts.next_edit import (
    CURSOR,
    build_messages,
    extract_edited_region,
    fence_region,
    parse_edit_prompt,
    read_answer,
    region_without_cursor,
    rejected_edit,
)
from serve_app.prompts.next_edit.extract import model_answer
from serve_app.prompts.next_edit.messages import INSTRUCTION_PHRASES, REGION_PLACEHOLDER
from serve_app.prompts.next_edit.span import apply_span, span_answer
from tests.fixtures.edit import EXAMPLE, REGION, RENAMED, content

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
        # the task line the service wrote, copied into the code (seen on the 0.5B)
        (
            REGION.replace("< 0:", "< 0 and finish the code at  and keep the other lines."),
            "instruction_echo",
        ),
        (lines(RENAMED, f"        {REGION_PLACEHOLDER}"), "instruction_echo"),
        # the line above, its rename undone, put back inside the region: the file would hold
        # both (a near copy of a line outside the region)
        (
            lines("        total = sum(item.price * item.quantity for item in self.items)", REGION),
            "border_copy",
        ),
        # an edited copy of the line above instead of the region's first line
        (REGION.replace("if total < 0:", "subtotal = apply_discount(total, code)"), "border_copy"),
        # the file parsed; with the answer it does not
        (REGION.replace("if total < 0:", "if total < 0"), "breaks_syntax"),
    ],
    ids=[
        "diff-lines",
        "hunk-header",
        "indent-edited",
        "indent-copied",
        "dropped",
        "history",
        "reformat",
        "task-echo",
        "placeholder-echo",
        "moved-line-copy",
        "edited-copy-above",
        "syntax",
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
        # the region's own line edited, though it looks like the line above
        REGION.replace("return add_tax(total)", "return add_tax(subtotal)"),
    ],
    ids=["unchanged", "renamed", "deleted-block", "added-line", "wrapped", "edited-line"],
)
def test_edits_pass_the_checks(answer: str) -> None:
    assert rejected_edit(answer, EXAMPLE) is None


def test_instruction_wording_the_request_holds_itself_is_code() -> None:
    """A file whose own comment reads like the service's task keeps it in an edit."""
    comment = "    # rewrite the region and keep the other lines"
    prompt = parse_edit_prompt(content(region=f"\n{comment}\n    x = {CURSOR}a\n"))
    assert rejected_edit(f"{comment}\n    x = a + 1", prompt) is None


def test_every_instruction_phrase_is_in_the_prompts_the_service_writes() -> None:
    """The phrases the echo check looks for are the service's own wording, not stale copies:
    each is in a chat_split prompt (the task with and without renames, the placeholder)."""
    plain = parse_edit_prompt(content(region=f"\n    x = {CURSOR}a\n"))
    written = " ".join(
        message["content"]
        for prompt in (plain, EXAMPLE)
        for message in build_messages(prompt, style="chat_split")
    ).lower()
    assert all(phrase in written for phrase in INSTRUCTION_PHRASES)


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


# --- the changed-span answer (chat_span) ------------------------------------------------------

PAIRS = [
    ("a\nb\nc", "a\nB\nc"),  # one line changed
    ("a\nb\nc", "a\nb\nb2\nc"),  # a line inserted
    ("a\nb\nc", "a\nc"),  # a line deleted
    ("a\nb\nc", "a\nb\nc\nd"),  # a line appended
    ("a\nb\nc", "z\na\nb\nc"),  # a line in front
    ("a\nb\nc", "a\n\nb\nc"),  # an empty line inserted
    ("a\nb\nc", "a\nb\nc"),  # no change
    ("\nx = 1\n", "\nx = 2\n"),  # the region's edge newlines
    ("a\na\na", "a\na"),  # repeated lines
]


@pytest.mark.parametrize(("original", "expected"), PAIRS)
def test_a_span_answer_reads_back_as_the_region_it_was_written_for(original, expected) -> None:
    answer = span_answer(original, expected)
    assert apply_span(answer, original) == expected
    assert (answer == "") == (original == expected)
    # Only the changed lines are written: never a line kept on both sides of the change.
    assert len(answer.split("\n")) <= 1 + abs(len(expected.split("\n")) - 1) + 1


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(["a", "b", "", "  c"]), min_size=1, max_size=6),
    st.lists(st.sampled_from(["a", "b", "", "  c", "d"]), min_size=1, max_size=6),
)
def test_every_span_answer_round_trips(old: list[str], new: list[str]) -> None:
    original, expected = "\n".join(old), "\n".join(new)
    assert apply_span(span_answer(original, expected), original) == expected


def test_the_span_prompt_numbers_the_regions_lines_and_the_answer_is_read_back() -> None:
    """The region is shown numbered, from two lines above the cursor's line, as the trained
    examples are cut: the example's region starts at the cursor, so the file's two lines above
    it come first; the answer is read back onto the region sent."""
    messages = build_messages(EXAMPLE, style="chat_span")
    region_shown = messages[-1]["content"].rsplit("Region:\n", 1)[1]
    above = EXAMPLE.file_before.split("\n")[-3:-1]
    for number, line in enumerate([*above, *EXAMPLE.region.split("\n")], 1):
        assert f"{number}|{line}\n" in region_shown
    answer = model_answer(RENAMED, EXAMPLE, "chat_span")
    assert answer.startswith("@@ ") and "```" not in answer
    assert read_answer(answer, EXAMPLE, "stop", "chat_span") == (RENAMED, None)


@pytest.mark.parametrize("typed", ["        if to", "        if total < 0:", "    ", ""])
def test_the_span_prompt_shows_the_cursor_where_its_lines_code_starts(typed: str) -> None:
    """Wherever an editor puts the cursor on its line (mid-word, at the end, in the
    indentation), chat_span shows it at the start of the line's code, as the adapter's
    examples have it; the region's text is unchanged, and chat_split shows it as sent."""
    line = "        if total < 0:"
    sent = line[: len(typed)] + CURSOR + line[len(typed) :]
    as_fixture = f"        {CURSOR}if total < 0:"
    prompt = dataclasses.replace(EXAMPLE, region=EXAMPLE.region.replace(as_fixture, sent))
    assert prompt.region.count(CURSOR) == 1 and sent in prompt.region
    span_shown = build_messages(prompt, style="chat_span")[-1]["content"]
    assert f"3|        {CURSOR}if total < 0:\n4|            total = 0.0\n" in span_shown
    assert sent in build_messages(prompt, style="chat_split")[-1]["content"]


HALF_TYPED = "    def most_expensive(self):\n        if not self.items:\n            return None\n"
COMPLETED = "        return max(self.items, key=lambda item: item.price)"


def test_a_span_that_completes_the_cursors_line_keeps_the_lines_its_header_took_in() -> None:
    """A half-typed line completed under a header one line too wide on either side (what the
    adapter wrote) replaces that line only: the ``return None`` before it and the blank line
    after it stay. The same text under a header that names the line alone reads the same."""
    region = HALF_TYPED + f"        return max(self.items, key=lambda item: item.{CURSOR}\n\n"
    region += "    def is_empty(self):\n        return not self.items"
    prompt = dataclasses.replace(EXAMPLE, region=region)
    completed = region_without_cursor(prompt).replace("item.\n", "item.price)\n")
    # Shown from the line above ``return None`` (two lines above the cursor's): numbered 1.
    for header in ("@@ 2,3", "@@ 2,2", "@@ 3,2", "@@ 3,1"):
        assert read_answer(f"{header}\n{COMPLETED}", prompt, "stop", "chat_span") == (
            completed,
            None,
        ), header


def test_a_span_is_read_as_written_where_it_does_not_complete_the_cursors_line() -> None:
    """Only a completion of the cursor's line narrows a span: a deletion written as a wider
    span, a line written unchanged, and a completion of a line the cursor is not on (three
    lines joined into one) are what their headers say."""
    region = f"{CURSOR}use a::{{\n    b,\n    c}};\nfn main() {{}}"
    prompt = dataclasses.replace(EXAMPLE, region=region)
    joined = "use a::{b, c};\nfn main() {}"
    assert read_answer("@@ 3,3\nuse a::{b, c};", prompt, "stop", "chat_span") == (joined, None)
    cursor_on_b = dataclasses.replace(
        prompt, region=region.replace(CURSOR, "").replace("    b,", f"    {CURSOR}b,")
    )
    deleted = "use a::{\n    c};\nfn main() {}"
    assert read_answer("@@ 2,2\nuse a::{", cursor_on_b, "stop", "chat_span") == (deleted, None)


def test_a_span_answer_is_read_back_onto_the_region_sent_however_it_was_cut() -> None:
    """Lines the prompt adds above the region sent are not the client's to change: an answer
    that edits them is no change. Lines of a region sent above the shown one (its cursor
    further down) come back as they were, with the answer's edit below them."""
    above = EXAMPLE.file_before.split("\n")[-3:-1]
    renamed_first = REGION.replace("if total", "if subtotal")
    assert read_answer("@@ 3,1\n        if subtotal < 0:", EXAMPLE, "stop", "chat_span") == (
        renamed_first,
        None,
    )
    assert read_answer(f"@@ 2,1\n{above[1]}  # x", EXAMPLE, "stop", "chat_span") == (
        REGION,
        "outside_region",
    )
    lower = dataclasses.replace(
        EXAMPLE,
        file_before=EXAMPLE.file_before.removesuffix(f"{above[0]}\n{above[1]}\n"),
        region=f"{above[0]}\n{above[1]}\n{EXAMPLE.region}".replace(
            f"        {CURSOR}if total", "        if total"
        ).replace("        return add_tax", f"        {CURSOR}return add_tax"),
    )
    shown = build_messages(lower, style="chat_span")[-1]["content"].rsplit("Region:\n", 1)[1]
    assert "\n1|        if total < 0:\n" in shown and above[0] not in shown
    answer = read_answer("@@ 3,1\n        return add_tax(subtotal)", lower, "stop", "chat_span")
    assert answer == (
        region_without_cursor(lower).replace("add_tax(total)", "add_tax(subtotal)"),
        None,
    )
    assert (
        read_answer(model_answer(answer[0], lower, "chat_span"), lower, "stop", "chat_span")
        == answer
    )


def test_a_span_answer_that_is_not_an_edit_of_this_region_is_no_change() -> None:
    lines = len(REGION.split("\n")) + 2  # as shown: two lines of the file above it
    assert read_answer("", EXAMPLE, "stop", "chat_span") == (REGION, None)
    assert read_answer("<|im_end|>", EXAMPLE, "stop", "chat_span") == (REGION, None)
    for answer in ("Sure, here:", "@@ 0,1\nx", f"@@ 2,{lines}\nx", "@@ -1,1 +1,1 @@\n-a\n+b"):
        assert read_answer(answer, EXAMPLE, "stop", "chat_span") == (REGION, "unusable"), answer
    # Cut off by max_tokens: its lines may be missing.
    assert read_answer("@@ 2,1\n        if sub", EXAMPLE, "length", "chat_span") == (
        REGION,
        "cut_off",
    )
    # A whole span that fails a check: every line deleted is not an edit to show.
    assert read_answer(f"@@ 3,{lines - 2}", EXAMPLE, "stop", "chat_span")[1] == "dropped_lines"


# --- the plain layouts of trained next-edit models (sweep, zeta) ------------------------------


@pytest.mark.parametrize("style", ["sweep", "zeta"])
def test_a_plain_answer_is_the_region_written_out_and_is_read_back(style: str) -> None:
    answer = model_answer(RENAMED, EXAMPLE, style)
    assert "```" not in answer and RENAMED.strip("\n") in answer
    assert read_answer(answer, EXAMPLE, "stop", style) == (RENAMED, None)
    # zeta's end marker is a stop: an answer that ended there reads the same without it.
    assert read_answer(RENAMED, EXAMPLE, "stop", style) == (RENAMED, None)
    assert read_answer(f"{CURSOR}{RENAMED}", EXAMPLE, "stop", style) == (RENAMED, None)


@pytest.mark.parametrize("style", ["sweep", "zeta"])
def test_a_plain_answer_that_is_not_an_edit_is_no_change(style: str) -> None:
    assert read_answer("", EXAMPLE, "stop", style) == (REGION, "unusable")
    assert read_answer(RENAMED[:20], EXAMPLE, "length", style) == (REGION, "cut_off")
    shifted = "\n".join("    " + line if line else line for line in RENAMED.split("\n"))
    assert read_answer(shifted, EXAMPLE, "stop", style) == (REGION, "indent_shift")


def test_a_region_holding_zetas_end_marker_is_read_whole() -> None:
    """A region that holds zeta's end marker as text is no stop, and its answer is read to
    the marker after the region's own: nothing of the region is cut."""
    from dataclasses import replace

    from serve_app.prompts.next_edit.messages import answer_stops
    from serve_app.prompts.next_edit.plain import ZETA_REGION_END

    line = f'        end = "{ZETA_REGION_END}"\n'
    prompt = replace(EXAMPLE, region=line + EXAMPLE.region)
    assert answer_stops(EXAMPLE, build_messages(EXAMPLE, style="zeta"), "zeta") == (
        ZETA_REGION_END,
    )
    assert answer_stops(prompt, build_messages(prompt, style="zeta"), "zeta") == ()
    answer = model_answer(line + RENAMED, prompt, "zeta") + "\n        more = 1"
    assert read_answer(answer, prompt, "stop", "zeta") == (line + RENAMED, None)


def test_zetas_prompt_marks_the_region_in_the_file_and_its_answer_closes_it() -> None:
    from serve_app.prompts.next_edit.plain import ZETA_CURSOR, ZETA_REGION_END, ZETA_REGION_START

    (piece,) = build_messages(EXAMPLE, style="zeta")
    text = piece["content"]
    region = EXAMPLE.region.replace(CURSOR, ZETA_CURSOR)
    assert f"{ZETA_REGION_START}\n{region}\n{ZETA_REGION_END}" in text
    assert text.endswith(f"### Response:\n{ZETA_REGION_START}\n") and CURSOR not in text
    assert model_answer(RENAMED, EXAMPLE, "zeta").endswith(f"\n{ZETA_REGION_END}")
