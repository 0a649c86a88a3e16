"""Would the answer damage the user's file? Checked for every answer, whatever the layout.

A client splices the answer in place of the region, so the lines outside it cannot change;
what can still hurt is what the answer brings into the region:

- ``border_copy``: a line the region did not hold that is a copy, or a near copy, of one of
  the file's lines just above or just below the region, and closer to it than to any line of
  the region: the model rewrote its context, not the region (an edited copy of the line above
  left a second ``return`` at module level in the README's own example). Short lines
  (``} else {``, ``return None``) are common in real edits and never count, nor does a line
  that finishes the one the user is typing (the cursor's).
- ``breaks_syntax``: the file parsed before and does not after (``syntax.parses``: Python by
  ``ast``, JavaScript, TypeScript, Go, Rust, Java, C and C++ by tree-sitter; a file that did
  not parse, half-typed, is not judged, nor a language with no parser here).

Either makes the answer "no change".
"""

from __future__ import annotations

from collections import Counter
from difflib import SequenceMatcher
from typing import Literal

from serve_app.prompts.next_edit.parse import CURSOR, EditPrompt, region_without_cursor
from serve_app.prompts.next_edit.syntax import parses

Damage = Literal["border_copy", "breaks_syntax"]

# Lines of the file either side of the region whose copies are looked for.
BORDER_LINES = 3
# The shortest line (stripped) whose exact copy counts, and whose near copy does: shorter
# ones (``} else {``, ``return None``) recur in real edits; and the shortest begun line.
MIN_COPY_CHARS = 12
MIN_NEAR_CHARS = 12
MIN_BEGUN_CHARS = 4
NEAR_RATIO = 0.8


def damage(answer: str, prompt: EditPrompt) -> Damage | None:
    """How ``answer`` (the new region) would damage the file, or None."""
    region = region_without_cursor(prompt)
    if _copies_a_border_line(answer, region, _border_lines(prompt), _cursor_line(prompt)):
        return "border_copy"
    if _breaks_syntax(answer, region, prompt):
        return "breaks_syntax"
    return None


def _border_lines(prompt: EditPrompt) -> list[str]:
    """The last non-blank whole lines above the region and the first below it."""
    above = prompt.file_before.split("\n")[:-1]  # the last piece is the region's own line
    below = prompt.file_after.split("\n")[1:]  # the first piece is the region's own line
    above = [line.strip() for line in above if line.strip()][-BORDER_LINES:]
    below = [line.strip() for line in below if line.strip()][:BORDER_LINES]
    return above + below


def new_lines(answer: str, region: str) -> list[str]:
    """The answer's lines (stripped, non-blank) beyond what the region holds of each."""
    held = Counter(line.strip() for line in region.split("\n"))
    found = []
    for line in (line.strip() for line in answer.split("\n")):
        if not line:
            continue
        if held[line]:
            held[line] -= 1
        else:
            found.append(line)
    return found


def _cursor_line(prompt: EditPrompt) -> str:
    """The cursor's line (stripped, the marker out): the line the user is typing."""
    line = next(line for line in prompt.region.split("\n") if CURSOR in line)
    return line.replace(CURSOR, "").strip()


def is_border_copy(line: str, border: list[str], region_lines: list[str], begun: str) -> bool:
    """``line`` (stripped) copies a border line: exactly, or nearly and closer to it than to
    any line of the region (then it is the region's line edited, not the border's copied).
    A line that finishes ``begun``, the cursor's line, is the user's half-typed line, however
    like a border line it reads (an ``else`` branch's twin)."""
    if len(begun) >= MIN_BEGUN_CHARS and line.startswith(begun):
        return False
    if len(line) >= MIN_COPY_CHARS and line in border:
        return True
    if len(line) < MIN_NEAR_CHARS:
        return False
    to_border = max((_likeness(line, other) for other in border), default=0.0)
    if to_border < NEAR_RATIO:
        return False
    return to_border > max((_likeness(line, other) for other in region_lines), default=0.0)


def _copies_a_border_line(answer: str, region: str, border: list[str], begun: str) -> bool:
    region_lines = [line.strip() for line in region.split("\n") if line.strip()]
    return any(
        is_border_copy(line, border, region_lines, begun) for line in new_lines(answer, region)
    )


def _likeness(a: str, b: str) -> float:
    return SequenceMatcher(None, a, b, autojunk=False).ratio()


def _breaks_syntax(answer: str, region: str, prompt: EditPrompt) -> bool:
    """The file parsed with the region and does not with the answer in its place. A request
    that names no file is taken as Python (Continue's tagged prompt often names none)."""
    path = prompt.file_path or "file.py"
    if parses(path, prompt.file_before + region + prompt.file_after) is not True:
        return False
    return parses(path, prompt.file_before + answer + prompt.file_after) is False
