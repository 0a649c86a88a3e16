"""The one check every apply answer passes before it is sent (docs/apply.md).

The answer is aligned, code line by code line (blank lines aside), with what the plan says the
merge is made of: the original lines no chunk replaces, in order, and each placed chunk's lines
where its place is. A chunk the plan could not place (no anchor) may sit anywhere between its
neighbours, and one that fits several places must sit in one of them. So every original line
is accounted for as kept, replaced by a chunk, or deleted by one, and a line missing anywhere
in the file (the shape a small model's merge loses code in) fails, whatever the file's size.
"""

from __future__ import annotations

import difflib
import itertools
from dataclasses import dataclass

from serve_app.apply.placement import Placement, Plan
from serve_app.apply.update import exact_key, is_blank, is_marker, is_significant
from serve_app.errors import MergeFailedError

MAX_LAYOUTS = 64  # combinations of ambiguous places tried against one answer


@dataclass(frozen=True)
class _Insert:
    """An unplaced chunk's lines: they may go anywhere between the chunks around them."""

    number: int
    lines: tuple[str, ...]


def check_merge(plan: Plan, answer: str) -> None:
    """Raise ``MergeFailedError`` naming the first thing ``answer`` breaks; return if it keeps
    every original line the update does not replace and has every line of the update."""
    lines = answer.splitlines()
    original = {exact_key(line) for line in plan.lines}
    stray = next(
        (line for line in lines if is_marker(line) and exact_key(line) not in original), None
    )
    if stray is not None:
        raise _failed(f"The merge still has the elision marker `{stray.strip()}`.")
    answered = [exact_key(line) for line in lines if not is_blank(line)]
    inserts = [
        _Insert(chunk.chunk.number, _code(chunk.chunk.lines))
        for chunk in plan.chunks
        if not chunk.places
    ]
    layouts = itertools.islice(
        itertools.product(*(chunk.places for chunk in plan.chunks if chunk.places)), MAX_LAYOUTS
    )
    expected: list[str] = []
    for layout in layouts:
        expected = _expected(plan, list(layout))
        if _matches(expected, inserts, answered):
            return
    raise _failed(_first_difference(expected, inserts, answered))


def _code(lines: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return tuple(exact_key(line) for line in lines if not is_blank(line))


def _expected(plan: Plan, layout: list[Placement]) -> list[str]:
    """The code lines of the merge with the placed chunks at ``layout``'s places."""
    placed = [chunk for chunk in plan.chunks if chunk.places]
    merged = Plan(plan.lines, tuple(placed)).merged_lines(layout)
    return list(_code(merged))


def _matches(expected: list[str], inserts: list[_Insert], answered: list[str]) -> bool:
    """Whether ``answered`` is ``expected`` with each unplaced chunk's lines, in order, put
    in one piece between two lines of it (a search over where each one goes)."""
    seen: set[tuple[int, int, int]] = set()
    stack = [(0, 0, 0)]
    while stack:
        state = stack.pop()
        if state in seen:
            continue
        seen.add(state)
        at, got, done = state
        if at == len(expected) and got == len(answered) and done == len(inserts):
            return True
        if done < len(inserts):
            chunk = inserts[done].lines
            if tuple(answered[got : got + len(chunk)]) == chunk:
                stack.append((at, got + len(chunk), done + 1))
        if at < len(expected) and got < len(answered) and expected[at] == answered[got]:
            stack.append((at + 1, got + 1, done))
    return False


def _first_difference(expected: list[str], inserts: list[_Insert], answered: list[str]) -> str:
    """What the answer lost or added, in words, for the error message."""
    inserted = {line for insert in inserts for line in insert.lines}
    answered = [line for line in answered if line not in inserted]
    matcher = difflib.SequenceMatcher(None, expected, answered, autojunk=False)
    for tag, i1, i2, j1, _ in matcher.get_opcodes():
        if tag in ("delete", "replace"):
            lost = expected[i1:i2]
            missing = next((line for line in lost if is_significant(line)), lost[0]).strip()
            return f"The merge lost `{missing[:80]}` ({i2 - i1} line(s) from there on)."
        if tag == "insert":
            extra = answered[j1].strip()
            return f"The merge has `{extra[:80]}`, which is neither in the original nor the update."
    return "The merge does not place every chunk of the update in one piece."


def _failed(reason: str) -> MergeFailedError:
    return MergeFailedError(
        f"{reason} No answer is sent that loses code: include a few unchanged lines around "
        "each change so that it lands in one place.",
        param="messages",
    )
