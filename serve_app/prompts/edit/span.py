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


def numbered(region: str) -> str:
    """The region's lines as the prompt shows them: ``1|first line``, ``2|...``."""
    return "\n".join(f"{number}|{line}" for number, line in enumerate(region.split("\n"), 1))


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


def apply_span(answer: str, original: str) -> str | None:
    """The region after ``answer`` (``span_answer``'s shape); ``original`` for an empty
    answer; None when the answer is not a span of this region (no header, or lines it does
    not have)."""
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
    return "\n".join(old[: first - 1] + lines + old[first - 1 + count :])
