"""The changed-span answer (``chat_span``): the model names the region's lines it replaces and
writes only their new text, or nothing for "no change".

    @@ 3,2
    new text of line 3
    new text of line 4, and a line more

replaces 2 lines from line 3 (the region's lines are numbered in the prompt); a count of 0
inserts before the line, a header with no lines after it deletes. An answer this shape never
spends a decode step on a line it keeps, and a model trained on it (``training.render``)
learns from the change alone, where a rewritten region is mostly copied text.
"""

from __future__ import annotations

import re

_HEADER = re.compile(r"@@ (\d+),(\d+)[ \t]*")


def shown_region(region: str, cursor: str) -> str:
    """The region (with its ``cursor`` marker) as the prompt shows it: its lines numbered,
    ``1|first line``, ``2|...``, and the cursor at the start of its line's code.

    The cursor moves because the examples an adapter learns this layout from are cut from
    commits, which place it where the next edit begins, at the start of a line's code, while
    an editor sends it where the user stopped typing: mid-line or at the line's end. The
    shipped adapter, shown such a cursor, answered "no change" to nearly all of
    bench/next_edit's edits (docs/next_edit_log.md, 2026-12-02). Its line is still
    the one it names, and the line as typed so far is in the region and the newest diff."""
    lines = region.split("\n")
    for index, line in enumerate(lines):
        if cursor in line:
            line = line.replace(cursor, "")
            indent = len(line) - len(line.lstrip())
            lines[index] = line[:indent] + cursor + line[indent:]
    return "\n".join(f"{number}|{line}" for number, line in enumerate(lines, 1))


def span_answer(original: str, expected: str) -> str:
    """What a model that knows the answer writes: the smallest run of the region's lines that
    turns ``original`` into ``expected``, or "" when they are the same."""
    old, new = original.split("\n"), expected.split("\n")
    if old == new:
        return ""
    same_start = 0
    while same_start < min(len(old), len(new)) and old[same_start] == new[same_start]:
        same_start += 1
    same_end = 0
    room = min(len(old), len(new)) - same_start
    while same_end < room and old[-1 - same_end] == new[-1 - same_end]:
        same_end += 1
    header = f"@@ {same_start + 1},{len(old) - same_start - same_end}"
    lines = new[same_start : len(new) - same_end]
    return header + "".join(f"\n{line}" for line in lines)


def apply_span(answer: str, original: str, cursor_line: int | None = None) -> str | None:
    """The region after ``answer`` (``span_answer``'s shape); ``original`` for an empty
    answer; None when the answer is not a span of this region (no header, or lines it does
    not have). ``cursor_line``: the region's line (0-based) the cursor is on (``_narrowed``)."""
    if not answer.strip():
        return original
    header, newline, body = answer.lstrip("\n").partition("\n")
    match = _HEADER.fullmatch(header)
    if match is None:
        return None
    first, count = int(match[1]), int(match[2])
    old = original.split("\n")
    if first < 1 or first - 1 + count > len(old):
        return None
    lines = body.split("\n") if newline else []
    start, end = first - 1, first - 1 + count
    if cursor_line is not None and lines:
        start, end = _narrowed(old, start, end, lines, cursor_line)
    return "\n".join(old[:start] + lines + old[end:])


def _narrowed(
    old: list[str], start: int, end: int, lines: list[str], cursor: int
) -> tuple[int, int]:
    """The part of ``old[start:end]`` that ``lines`` replace where they complete the cursor's
    line: from that line where the first of ``lines`` completes it and none of the lines
    before it is written again; up to it where the last completes it and only blank lines
    follow.

    The adapter, shown a half-typed line, completes it under a header that starts a line early
    or ends late (``@@ 3,3`` over a ``return None``, the half-typed line and a blank line, to
    write the one completed line): read as written, the answer deletes lines the user never
    touched. A line completes another when it is longer and starts with all of it (trailing
    whitespace aside), so a line written unchanged completes nothing and a deletion written
    as a wider span stays one. Read back from the mined edits' own answers (cursor on the
    edit's first line), all but a stray one come out as written (docs/next_edit_log.md)."""
    if not start <= cursor < end:
        return start, end
    written = {line.strip() for line in lines}
    rewritten_before = any(line.strip() in written for line in old[start:cursor])
    if _completes(lines[0], old[cursor]) and not rewritten_before:
        start = cursor
    code_after = any(line.strip() for line in old[cursor + 1 : end])
    if _completes(lines[-1], old[cursor]) and not code_after:
        end = cursor + 1
    return start, end


def _completes(written: str, line: str) -> bool:
    typed = line.rstrip()
    return bool(typed.strip()) and len(written.rstrip()) > len(typed) and written.startswith(typed)
