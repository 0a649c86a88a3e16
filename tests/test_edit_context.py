"""The next-edit prompt as chat messages, and fitting it into the context."""

from __future__ import annotations

import dataclasses
import re

import pytest

from serve_app.errors import ContextLengthExceededError
from serve_app.models.tiny import build_tiny_model
from serve_app.prompts.chat_encoding import encode_chat
from serve_app.prompts.next_edit import (
    CURSOR,
    EditPrompt,
    build_messages,
    file_window,
    fit_to_context,
    recent_renames,
    region_without_cursor,
)
from serve_app.prompts.next_edit.diffs import shown_diff
from serve_app.prompts.next_edit.messages import REGION_PLACEHOLDER
from serve_app.prompts.next_edit.window import WINDOW_CHARS, WINDOW_GRID, WINDOW_LINES
from tests.fixtures.edit import EXAMPLE


def test_messages_show_snippets_file_diffs_then_the_region_and_the_task() -> None:
    system, user = build_messages(EXAMPLE)
    assert system["role"] == "system" and "only the rewritten region" in system["content"]
    assert user["role"] == "user"
    text = user["content"]
    file_block = f"File shop/cart.py:\n```python\n{file_window(EXAMPLE).file_text}```"
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


def test_chat_split_is_chat_with_the_region_cut_out_of_the_file() -> None:
    chat = build_messages(EXAMPLE)
    system, user = build_messages(EXAMPLE, style="chat_split")
    assert system == chat[0]
    assert REGION_PLACEHOLDER in user["content"]
    # The region's lines once, with the cursor, in the region section; not in the file.
    assert region_without_cursor(EXAMPLE) in chat[1]["content"]
    assert region_without_cursor(EXAMPLE) not in user["content"]
    restored = user["content"].replace(REGION_PLACEHOLDER, region_without_cursor(EXAMPLE))
    assert restored == chat[1]["content"]


@pytest.mark.parametrize(("style", "kept"), [("chat", False), ("chat_split", True)])
def test_a_keystroke_in_the_region_keeps_chat_split_unchanged_up_to_the_newest_diff(
    style: str, kept: bool
) -> None:
    typed = dataclasses.replace(
        EXAMPLE,
        region=EXAMPLE.region.replace(f"{CURSOR}if total", f"if s{CURSOR}total"),
        diffs=[*EXAMPLE.diffs, "@@ -38 +38 @@\n-        if total < 0:\n+        if stotal < 0:"],
    )
    before = build_messages(EXAMPLE, style=style)[1]["content"]
    after = build_messages(typed, style=style)[1]["content"]
    newest = shown_diff(EXAMPLE.diffs[-1])
    history = before[: before.index(newest) + len(newest)]
    assert after.startswith(history) is kept


def test_diffs_are_shown_without_what_the_file_already_shows() -> None:
    """Line numbers and context beyond one line go; file headers, a client's note and every
    changed line stay, a removed line that starts like a file header too."""
    diff = (
        "// User accepted prediction:\n--- a/shop/cart.py\n+++ b/shop/cart.py\n"
        "@@ -10,7 +10,7 @@\n a\n b\n c\n--- old sql comment\n+-- new sql comment\n d\n e\n f\n"
        "@@ -30,2 +30,3 @@\n g\n+h\n i\n\\ No newline at end of file"
    )
    user = build_messages(dataclasses.replace(EXAMPLE, diffs=[diff]))[1]["content"]
    shown = user[user.index("```diff\n") + 8 : user.index("\n```\n\nRegion:")]
    assert shown == (
        "// User accepted prediction:\n--- a/shop/cart.py\n+++ b/shop/cart.py\n"
        "@@\n c\n--- old sql comment\n+-- new sql comment\n d\n"
        "@@\n g\n+h\n i\n\\ No newline at end of file"
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
    assert shown_diff(EXAMPLE.diffs[2]) in kept and shown_diff(EXAMPLE.diffs[1]) not in kept


def test_fit_to_context_raises_when_even_the_file_does_not_fit(tokenizer) -> None:
    smallest = token_count(tokenizer, build_messages(EXAMPLE, drop_snippets=3, drop_diffs=3))
    with pytest.raises(ContextLengthExceededError) as caught:
        fit_to_context(EXAMPLE, tokenizer, smallest - 1, context_length=32768)
    assert caught.value.param == "messages"
    assert caught.value.code == "context_length_exceeded"
    assert "maximum context length for this model of 32768" in caught.value.message


def test_sweeps_layout_is_files_then_the_region_before_now_and_to_write() -> None:
    """Every file (snippets, the file without its region, each diff as original/updated
    blocks) after a file separator, then the region before the newest diff, with the
    cursor, and the block the model writes; a keystroke changes nothing before the diffs."""
    from serve_app.prompts.next_edit.plain import MARKER

    pieces = build_messages(EXAMPLE, style="sweep")
    texts = [p["content"] for p in pieces if p["role"] != MARKER]
    assert all(p["content"] == "file_sep" for p in pieces if p["role"] == MARKER)
    assert len(texts) == len(EXAMPLE.snippets) + 1 + len(EXAMPLE.diffs) + 3
    assert REGION_PLACEHOLDER in texts[len(EXAMPLE.snippets)]
    assert "original:\n" in texts[-4] and "updated:\n" in texts[-4] and "\n-" not in texts[-4]
    path = EXAMPLE.file_path
    assert texts[-3].startswith(f"original/{path}\n") and CURSOR not in texts[-3]
    assert texts[-2] == f"current/{path}\n{EXAMPLE.region.strip(chr(10))}\n"
    assert texts[-1] == f"updated/{path}\n"
    typed = dataclasses.replace(
        EXAMPLE, region=EXAMPLE.region.replace(f"{CURSOR}if total", f"if s{CURSOR}total")
    )
    assert build_messages(typed, style="sweep")[:-6] == pieces[:-6]


def test_the_region_before_the_newest_diff_undoes_its_hunks_found_in_the_region() -> None:
    from serve_app.prompts.next_edit.plain import before_newest_diff

    diff = "--- a/x.py\n+++ b/x.py\n@@ -2,2 +2,2 @@\n a = 1\n-b = a\n+b = a + 1"
    assert before_newest_diff("a = 1\nb = a + 1\nc = b", diff) == "a = 1\nb = a\nc = b"
    assert before_newest_diff("elsewhere\nin the file", diff) == "elsewhere\nin the file"


def numbered_file_prompt(lines_before: int, lines_after: int, region_lines: int = 3) -> EditPrompt:
    """A prompt whose file is numbered lines (``line 0`` ...), the region in between."""
    before = "".join(f"line {n}\n" for n in range(lines_before))
    region = "\n".join(f"line {n}" for n in range(lines_before, lines_before + region_lines))
    first_after = lines_before + region_lines
    after = "".join(f"\nline {n}" for n in range(first_after, first_after + lines_after)) + "\n"
    return EditPrompt("big.py", before, CURSOR + region, after)


def shown_numbers(prompt: EditPrompt) -> list[int]:
    """The numbers of the file's lines the prompt shows, the region's left out."""
    user = build_messages(prompt, style="chat_split")[1]["content"]
    file = user[: user.index("Region:")]
    return [int(n) for n in re.findall(r"^line (\d+)$", file, flags=re.M)]


def test_a_long_file_is_shown_as_a_window_of_lines_on_the_grid() -> None:
    numbers = shown_numbers(numbered_file_prompt(1000, 1000))
    above = [n for n in numbers if n < 1000]
    below = [n for n in numbers if n > 1002]
    assert numbers == above + below and numbers == sorted(set(numbers))
    assert above == list(range(above[0], 1000)) and below == list(range(1003, below[-1] + 1))
    assert WINDOW_LINES <= len(above) < WINDOW_LINES + WINDOW_GRID and above[0] % WINDOW_GRID == 0
    assert WINDOW_LINES <= len(below) < WINDOW_LINES + WINDOW_GRID
    assert (below[-1] + 1) % WINDOW_GRID == 0


def test_a_file_within_the_window_is_shown_whole() -> None:
    short = numbered_file_prompt(5, 7)
    assert file_window(short) == short
    assert shown_numbers(short) == [*range(5), *range(8, 15)]


def test_long_lines_near_the_region_are_cut_to_whole_lines() -> None:
    """Minified code: a side holds at most ``WINDOW_CHARS`` characters of whole lines."""
    prompt = numbered_file_prompt(40, 40)
    huge = "x = " + "1" * WINDOW_CHARS
    lines = prompt.file_before.split("\n")
    lines[-4] = huge  # three lines above the region
    prompt = dataclasses.replace(prompt, file_before="\n".join(lines))
    shown = file_window(prompt)
    assert huge not in shown.file_before
    assert shown.file_before.split("\n")[-3:] == ["line 38", "line 39", ""]
    assert len(shown.file_after) <= WINDOW_CHARS + 1
