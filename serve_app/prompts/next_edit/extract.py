"""Read the rewritten region back out of the model's raw text, and fence it for the client."""

from __future__ import annotations

import re

from serve_app.prompts.next_edit.checks import EditRejection, rejected_edit
from serve_app.prompts.next_edit.messages import EditPromptStyle
from serve_app.prompts.next_edit.parse import EditPrompt, region_without_cursor
from serve_app.prompts.next_edit.plain import ZETA_REGION_END, plain_answer
from serve_app.prompts.next_edit.recut import recut, shown_expected
from serve_app.prompts.next_edit.span import apply_span, span_answer

# Styles whose answer is the region as plain text, no fence (``plain``).
PLAIN_ANSWERS = ("sweep", "zeta")
# Special-token-like tags: <|cursor|>, <|im_end|>, <|code_to_edit|>, ...
_TAG = re.compile(r"<\|/?[A-Za-z_][A-Za-z0-9_]*\|>")
# A line of English at the left margin: a capitalised word, two more words, no code symbols.
_PROSE = re.compile(r"^[A-Z][a-z']*[,.:!]?(?:[ \t]+\S+){2,}$")
_CODE_SYMBOLS = set('=(){}[];<>#"\\')


def extract_edited_region(completion: str, prompt: EditPrompt) -> tuple[str, bool]:
    """The rewritten region from the model's raw text, and whether the text was usable.

    Removes every ``<|...|>`` tag (the cursor marker included), takes the first fenced block
    (or, unfenced, the text less any prose lines around it), drops lines above the region that
    the model copied in front of it (``_drop_echoed_lines_above``) and gives it the region's
    leading and trailing newlines. Tags that the user's own region holds (a tokenizer's source, say)
    are kept: the answer replaces that code. When nothing usable is left it returns the
    original region (cursor removed) and ``False``.
    """
    original = region_without_cursor(prompt)
    text = _strip_tags(completion, keep=set(_TAG.findall(original)))
    code = _fenced_block(text, original)
    if code is None:
        code = _strip_prose(text, original)
    code = _drop_echoed_lines_above(code, prompt.file_before, original)
    if not code.strip() or (_is_a_diff(code) and not _is_a_diff(original)):
        return original, False
    return _match_edge_newlines(code, original), True


def _strip_tags(text: str, keep: set[str]) -> str:
    """Remove tags until none is left (removing one could join the halves of another)."""
    while True:
        stripped = _TAG.sub(lambda m: m.group(0) if m.group(0) in keep else "", text)
        if stripped == text:
            return text
        text = stripped


def _fenced_block(text: str, original: str) -> str | None:
    """The body of the first ``` block; None when the text has no fence at all.

    A lone fence is an opening one when labelled (```python) or when nothing but prose precedes
    it (the answer was cut off); otherwise it closes an answer whose opening fence was omitted.
    """
    lines = text.split("\n")
    fences = [i for i, line in enumerate(lines) if line.lstrip().startswith("```")]
    if not fences:
        return None
    first = fences[0]
    if len(fences) > 1:
        return "\n".join(lines[first + 1 : fences[1]])
    before = _strip_prose("\n".join(lines[:first]), original)
    labelled = lines[first].strip() != "```"
    if labelled or not before.strip():
        return "\n".join(lines[first + 1 :])
    return before


def _is_prose(line: str, original_lines: set[str]) -> bool:
    if not line.strip():
        return True  # blank lines at the edges carry nothing
    if line in original_lines or line != line.lstrip():
        return False  # copied from the region, or indented: code
    return bool(_PROSE.match(line.rstrip())) and not (_CODE_SYMBOLS & set(line))


def _strip_prose(text: str, original: str) -> str:
    """Drop blank and prose lines before and after the code; lines in between are kept."""
    lines = text.split("\n")
    original_lines = set(original.split("\n"))
    start, end = 0, len(lines)
    while start < end and _is_prose(lines[start], original_lines):
        start += 1
    while end > start and _is_prose(lines[end - 1], original_lines):
        end -= 1
    return "\n".join(lines[start:end])


_DIFF_HEADER = re.compile(r"^(?:--- |\+\+\+ )\S", re.MULTILINE)
_HUNK_HEADER = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@", re.MULTILINE)


def _is_a_diff(text: str) -> bool:
    return bool(_DIFF_HEADER.search(text) and _HUNK_HEADER.search(text))


def _drop_echoed_lines_above(code: str, file_before: str, original: str) -> str:
    """``code`` less a copy of the file's lines just above the region at its start.

    A small model asked to rewrite a region sometimes starts from the lines above it (the lines
    the recent edits touched, most often); a client splices the answer in place of the region,
    so those lines would end up twice in the user's file. The copy is dropped only when it is
    exactly the last k whole lines above the region (k as large as matches), holds some code,
    leaves some code, and the region does not itself start with those lines.
    """
    if file_before and not file_before.endswith("\n"):
        return code  # the region starts mid-line: no whole line sits right above it
    above = file_before.split("\n")[:-1]
    lines = code.strip("\n").split("\n")
    region = original.strip("\n").split("\n")
    for k in range(min(len(above), len(lines) - 1), 0, -1):
        echoed = lines[:k]
        if echoed == above[-k:] and echoed != region[:k] and any(map(str.strip, echoed)):
            return "\n".join(lines[k:])
    return code


def _match_edge_newlines(code: str, original: str) -> str:
    """Give ``code`` the original region's leading and trailing newlines, so it splices back."""
    body = original.strip("\n")
    if not body:
        return code.strip("\n") + original
    leading = len(original) - len(original.lstrip("\n"))
    trailing = len(original) - len(original.rstrip("\n"))
    return "\n" * leading + code.strip("\n") + "\n" * trailing


def fence_region(region: str) -> str:
    """The answer every client parses: the region in a plain fence, no language tag. Zed and
    Continue cut exactly "```\\n" off the front and "\\n```" off the end."""
    return f"```\n{region}\n```"


def model_answer(expected: str, prompt: EditPrompt, style: EditPromptStyle) -> str | None:
    """What a model asked in ``style`` writes when its answer is ``expected`` (the region
    after the edit): the region fenced, for ``chat_span`` the changed lines only, for the
    plain layouts the region as text. What ``read_answer`` reads back, and what an adapter is
    trained to write. None where no answer can write it: a ``chat_span`` edit of lines the
    region as shown (``recut``) leaves out."""
    if style == "chat_span":
        cut = recut(prompt)
        shown = shown_expected(cut, expected)
        return None if shown is None else span_answer(region_without_cursor(cut.shown), shown)
    if style in PLAIN_ANSWERS:
        return plain_answer(expected, style)
    return fence_region(expected)


def read_answer(
    text: str, prompt: EditPrompt, finish_reason: str | None, style: EditPromptStyle = "chat"
) -> tuple[str, EditRejection | None]:
    """The region to send for the model's ``text`` in ``style``, and why it is the region
    unchanged when the model's answer was not an edit (``checks``). An answer cut off by
    max_tokens before its code block closed (or, a span, at all) would drop the region's tail;
    one with nothing usable, or one that fails a check, is "no change"."""
    original = region_without_cursor(prompt)
    if style == "chat_span":
        return _read_span(text, prompt, finish_reason)
    if style in PLAIN_ANSWERS:
        return _read_plain(text, prompt, finish_reason)
    if finish_reason == "length" and text.count("```") < 2:
        return original, "cut_off"
    region, usable = extract_edited_region(text, prompt)
    if not usable:
        return original, "unusable"
    return _checked(region, original, prompt)


def _read_span(
    text: str, prompt: EditPrompt, finish_reason: str | None
) -> tuple[str, EditRejection | None]:
    sent = region_without_cursor(prompt)
    if finish_reason == "length":
        return sent, "cut_off"
    cut = recut(prompt)  # the region the model was shown (``build_messages``)
    shown = cut.shown
    original = region_without_cursor(shown)
    cursor_line = shown.region[: shown.cursor_offset].count("\n")
    answer = _strip_tags(text, keep=set(_TAG.findall(original)))
    region = apply_span(answer, original, cursor_line)
    if region is None:
        return sent, "unusable"
    region = cut.sent_region(region)
    if region is None:
        return sent, "outside_region"
    return _checked(region, sent, prompt)


def _read_plain(
    text: str, prompt: EditPrompt, finish_reason: str | None
) -> tuple[str, EditRejection | None]:
    """The region a plain layout's answer writes: its text up to zeta's end marker, the one
    after as many as the region holds itself (the marker is a stop unless the region holds
    it, so it is there only where no stop applied)."""
    original = region_without_cursor(prompt)
    if finish_reason == "length":
        return original, "cut_off"
    pieces = text.split(ZETA_REGION_END)
    written = ZETA_REGION_END.join(pieces[: original.count(ZETA_REGION_END) + 1])
    code = _strip_tags(written, keep=set(_TAG.findall(original)))
    if not code.strip() and original.strip():
        return original, "unusable"
    region = _match_edge_newlines(code, original)
    return _checked(region, original, prompt)


def _checked(region: str, original: str, prompt: EditPrompt) -> tuple[str, EditRejection | None]:
    """``region`` unless a check rejects it (``checks``): then ``original``, and why."""
    rejection = rejected_edit(region, prompt)
    return (original, rejection) if rejection else (region, None)
