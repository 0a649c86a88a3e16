"""An update's structure: elision markers, the chunks between them, and line comparison.

A marker is a comment line that stands for original code left out: ``// ... existing code ...``,
``# ... rest unchanged``, ``/* ... */``, ``<!-- ... -->``, ``-- ...``, or any comment that
says "existing code". A bare ``...`` line is code (Python's Ellipsis), never a marker.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

_COMMENT = r"(?:#+|//+|/\*+|<!--|--|;+|%+|\{/\*|\*)"
_MARKER = re.compile(
    rf"{_COMMENT}\s*(?:\.\.\.|…).*|{_COMMENT}.*\bexisting code\b.*",
    re.IGNORECASE,
)
# An anchor must say something: a line of punctuation ("}", ");") or a bare keyword that
# closes a block ("end", "fi") matches too many places to name one.
_SIGNIFICANT = re.compile(r"\w{2,}.*\w|\w.*\w{2,}")
_CLOSERS = ("end", "fi", "esac", "done", "endif", "else:", "pass", "break", "continue")

SIMILAR = 0.6  # a changed line at least this like an original line may be its edit
PREFIX_MIN = 5  # or it extends (or shortens) that line, which has at least this many chars


def is_marker(line: str) -> bool:
    return bool(_MARKER.fullmatch(line.strip()))


def is_blank(line: str) -> bool:
    return not line.strip()


def is_significant(line: str) -> bool:
    """Whether a matching line can name a place in the file (see ``_SIGNIFICANT``)."""
    text = line.strip()
    return bool(_SIGNIFICANT.search(text)) and text.lower() not in _CLOSERS


def exact_key(line: str) -> str:
    return line.rstrip()


def spaceless_key(line: str) -> str:
    return "".join(line.split())


def similarity(original: str, changed: str) -> float:
    """How alike two lines are, ignoring whitespace: difflib's ratio, or 1.0 when one extends
    the other (``return x`` -> ``return x  # why``) from a prefix long enough to mean it."""
    a, b = spaceless_key(original), spaceless_key(changed)
    if not a or not b:
        return 0.0
    shorter, longer = sorted((a, b), key=len)
    if len(shorter) >= PREFIX_MIN and longer.startswith(shorter):
        return 1.0
    return difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def indent(line: str) -> int:
    return len(line) - len(line.lstrip())


@dataclass(frozen=True)
class Chunk:
    """A run of update lines between markers, blank lines at its edges dropped (they belong
    to the code the markers stand for). ``opens_file``: no marker before it, and it is the
    update's first; ``closes_file``: no marker after it, and it is the last. A marker after it
    indented deeper than a block the chunk opens keeps the rest of that block."""

    number: int
    lines: tuple[str, ...]
    opens_file: bool
    closes_file: bool
    next_marker_indent: int | None = None  # the marker after it, if any: how deep it sits

    def describe(self) -> str:
        return f"chunk {self.number} (`{self.lines[0].strip()[:60]}`)"


def chunks_of(update: str) -> list[Chunk]:
    """The update's chunks, in order; none for an update of only markers and blank lines."""
    runs: list[list[str]] = [[]]
    marker_indents: list[int] = []
    for line in update.splitlines():
        if is_marker(line):
            runs.append([])
            marker_indents.append(indent(line))
        else:
            runs[-1].append(line)
    chunks: list[Chunk] = []
    for position, run in enumerate(runs):
        code = [i for i, line in enumerate(run) if not is_blank(line)]
        if not code:
            continue
        chunks.append(
            Chunk(
                number=len(chunks) + 1,
                lines=tuple(run[code[0] : code[-1] + 1]),
                opens_file=position == 0,
                closes_file=position == len(runs) - 1,
                next_marker_indent=marker_indents[position]
                if position < len(marker_indents)
                else None,
            )
        )
    return chunks


def usual_gap(lines: tuple[str, ...]) -> int:
    """Blank lines before the file's last block: what sets off a chunk added after it."""
    run, gap = 0, 1
    for line in lines:
        if is_blank(line):
            run += 1
        else:
            gap, run = (run if run else gap), 0
    return gap
