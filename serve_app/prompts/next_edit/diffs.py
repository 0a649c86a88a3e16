"""The edit history as the chat prompts show it: each change with one line of context.

A client's diff repeats what the prompt already shows: three lines of context around each
change (the file is shown whole) and hunk line numbers the model cannot use (the file is
shown without them). A repeat request re-reads the newest diff on every keystroke, so those
lines cost each keystroke's latency. Shown here instead: each change with ``CONTEXT_LINES``
of its context and hunk headers reduced to ``@@``; file headers and a client's notes stay
(without the file headers, the 0.5B left the rename in Zed's request of
tests/test_clients_edit.py undone). Measured on bench/next_edit.py's 40 real edits in
docs/next_edit_log.md.

A hunk is read by its header's line counts, so a removed line that starts with ``--`` (an SQL
comment, say) stays a change and is never taken for a file header.
"""

from __future__ import annotations

import re

CONTEXT_LINES = 1
_HUNK = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


def shown_diff(diff: str) -> str:
    """``diff`` with each hunk cut to its changes and ``CONTEXT_LINES`` around them; lines
    outside hunks (file headers, a client's notes) as they are."""
    lines, shown, index = diff.split("\n"), [], 0
    while index < len(lines):
        header = _HUNK.match(lines[index])
        if header is None:
            shown.append(lines[index])
            index += 1
            continue
        hunk = _hunk_lines(lines, index + 1, header)
        shown.append("@@")
        shown.extend(_near_changes(hunk))
        index += 1 + len(hunk)
    return "\n".join(shown)


def _hunk_lines(lines: list[str], start: int, header: re.Match) -> list[str]:
    """The lines of the hunk that starts at ``start``: as many as its header counts."""
    old, new = (int(count) if count is not None else 1 for count in header.groups())
    end = start
    while end < len(lines) and (old > 0 or new > 0 or lines[end].startswith("\\")):
        if _HUNK.match(lines[end]):  # a header that counted more lines than it has
            break
        kind = lines[end][:1]
        if kind not in ("-", "+", "\\"):  # context: " ", or "" where a client trimmed it
            old, new = old - 1, new - 1
        elif kind == "-":
            old -= 1
        elif kind == "+":
            new -= 1
        end += 1
    return lines[start:end]


def _near_changes(hunk: list[str]) -> list[str]:
    changed = [i for i, line in enumerate(hunk) if line[:1] in ("-", "+")]
    near = {j for i in changed for j in range(i - CONTEXT_LINES, i + CONTEXT_LINES + 1)}
    return [line for i, line in enumerate(hunk) if i in near or line.startswith("\\")]


def hunk_sides(diff: str) -> list[tuple[str, str]]:
    """Each hunk of ``diff`` as its two sides, the text before and after the change, cut like
    ``shown_diff`` to the changes and ``CONTEXT_LINES`` around them (the ``sweep`` layout shows
    a diff this way, as ``original:``/``updated:`` blocks, without diff syntax)."""
    lines, sides, index = diff.split("\n"), [], 0
    while index < len(lines):
        header = _HUNK.match(lines[index])
        if header is None:
            index += 1
            continue
        hunk = _hunk_lines(lines, index + 1, header)
        shown = [line for line in _near_changes(hunk) if not line.startswith("\\")]
        before = [line[1:] for line in shown if line[:1] != "+"]
        after = [line[1:] for line in shown if line[:1] != "-"]
        sides.append(("\n".join(before), "\n".join(after)))
        index += 1 + len(hunk)
    return sides
