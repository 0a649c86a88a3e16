"""Next-edit examples from one commit's change to one file, in the shape clients send.

A commit's change to a file is split into hunks (line-level change blocks, blocks one line
apart merged), in file order. The user is taken to make them in that order:

- **An edit example** for hunk ``i`` (``i >= 1``) lying within ``NEAR`` lines of hunk
  ``i - 1``: the hunks before it are the edit history (the last ``MAX_HISTORY`` as unified
  diffs, each against the file as the one before left it), the file with them applied is the
  current file, the editable region is hunk ``i``'s old lines with ``CONTEXT_LINES`` lines either
  side, the cursor at the start of its first changed line's code, and the expected region is
  the same lines with hunk ``i`` applied.
- **A typing example** (``typing_example``, made from an edit example when a run asks for
  them): the user is halfway through typing the edit's first new line, the old lines it
  replaces gone, the cursor after what is typed (cut where a typist pauses, ``pause_points``),
  the typing the newest diff; the expected region is the edit's. Commits hold finished code
  only, but an IDE asks at every pause in typing, mostly with a line left unfinished at the
  cursor.
- **A no-change example**: every hunk applied, the region around the last one (the edit the
  user just finished), the cursor at the end of its last changed line. Nothing more is to be
  done there, so the expected region is the region itself.
- **A history-cursor example** (``history_cursor_example``, from an edit example when a run
  asks): the cursor at the end of the newest diff's last added line, where the user's last
  edit left it, instead of at the start of the line to change.

The file is sent as an excerpt of ``WINDOW`` lines either side of the region, as Zed sends.
"""

from __future__ import annotations

import dataclasses
import difflib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from serve_app.prompts.next_edit.recut import CONTEXT_LINES
from serve_app.prompts.next_edit.window import WINDOW_LINES

LANGUAGES = {
    ".py": "python",
    ".ts": "typescript",
    ".tsx": "typescript",
    ".js": "javascript",
    ".mjs": "javascript",
    ".go": "go",
    ".rs": "rust",
    ".java": "java",
    ".rb": "ruby",
    ".c": "c",
    ".h": "c",
    ".cpp": "cpp",
    ".hpp": "cpp",
}
NEAR = 40  # lines between the last history hunk and the expected one
MAX_CHANGE_LINES = 8  # old or new lines of the expected hunk
MAX_HISTORY_LINES = 30  # lines of one history hunk, old plus new
MAX_HISTORY = 3  # hunks (Continue sends up to 6 diffs; 3 keeps a CPU run short)
# Lines of the file kept either side of the region: as many as the service shows the model.
WINDOW = WINDOW_LINES
# Code tokens (words, numbers, single symbols) and the run of them an edit's new text must share
# with the prompt to count as shown there (``context_support``).
CODE_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+|\S")
SUPPORT_GRAM = 2

ExampleKind = Literal["edit", "no_change"]


@dataclass(frozen=True)
class Hunk:
    """Lines [a_start, a_end) of the old file become lines [b_start, b_end) of the new one."""

    a_start: int
    a_end: int
    b_start: int
    b_end: int

    @property
    def size(self) -> int:
        return (self.a_end - self.a_start) + (self.b_end - self.b_start)


@dataclass
class EditExample:
    """One next-edit request and its right answer, with where it came from."""

    repo: str
    commit: str
    path: str
    language: str
    file: str  # the current file (history applied), an excerpt around the region
    first_line: int  # the editable region, 0-based inclusive line numbers in ``file``
    last_line: int
    cursor: tuple[int, int]  # (line, column) in ``file``
    expected: str  # the region after the expected edit (the region itself: no change)
    hunks: list[str]  # the history, oldest first, unified hunks with 3 lines of context
    snippets: list[tuple[str, str]]  # (path, code) of recently viewed code
    kind: ExampleKind = "edit"

    @property
    def region(self) -> str:
        lines = self.file.split("\n")
        return "\n".join(lines[self.first_line : self.last_line + 1])


def _grams(text: str) -> set[tuple[str, ...]]:
    tokens = CODE_TOKEN.findall(text)
    return {tuple(tokens[i : i + SUPPORT_GRAM]) for i in range(len(tokens) - SUPPORT_GRAM + 1)}


class ShownContext(Protocol):
    """What the prompt shows besides the region (``EditExample``, the bench's scenarios)."""

    file: str
    first_line: int
    last_line: int
    hunks: Sequence[str]
    snippets: Sequence[Sequence[str]]


def context_support(context: ShownContext, expected: str) -> float:
    """The share of the expected edit's new text (bigrams of code tokens in the lines it
    writes) that the prompt already shows: the file, the history, the snippets. An edit that
    carries on what the user just did scores near 1; one that writes code from nowhere (a new
    call, a new constant), near 0: no editor state foretells it. 1 when it writes no bigram (a
    deletion)."""
    region = context.file.split("\n")[context.first_line : context.last_line + 1]
    new_lines = expected.split("\n")
    matcher = difflib.SequenceMatcher(None, region, new_lines, autojunk=False)
    written = [
        "\n".join(new_lines[j1:j2]) for tag, _, _, j1, j2 in matcher.get_opcodes() if tag != "equal"
    ]
    new = _grams("\n".join(written))
    if not new:
        return 1.0
    shown = "\n".join(
        [context.file, *context.hunks, *(snippet[-1] for snippet in context.snippets)]
    )
    return len(new & _grams(shown)) / len(new)


def language_of(path: str) -> str | None:
    return LANGUAGES.get(Path(path).suffix)


def hunks_of(old: list[str], new: list[str]) -> list[Hunk]:
    """Change blocks of a line diff, blocks separated by at most one unchanged line merged.
    The lines both versions start and end with are set aside first: a commit changes a few
    lines of a long file, and the matcher's cost grows with the square of what it is given."""
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    middle_old, middle_new = old[head : len(old) - tail], new[head : len(new) - tail]
    matcher = difflib.SequenceMatcher(None, middle_old, middle_new, autojunk=False)
    hunks: list[Hunk] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        i1, i2, j1, j2 = i1 + head, i2 + head, j1 + head, j2 + head
        if hunks and i1 - hunks[-1].a_end <= 1:
            last = hunks.pop()
            hunks.append(Hunk(last.a_start, i2, last.b_start, j2))
        else:
            hunks.append(Hunk(i1, i2, j1, j2))
    return hunks


def applied(old: list[str], new: list[str], hunk: Hunk) -> list[str]:
    """``old`` with every hunk up to and including ``hunk`` applied (hunks are in order)."""
    return new[: hunk.b_end] + old[hunk.a_end :]


def unified_hunk(before: list[str], after: list[str]) -> str:
    """The one-hunk unified diff body (from ``@@``) between two versions of a file."""
    lines = list(difflib.unified_diff(before, after, lineterm="", n=3))
    return "\n".join(lines[2:])


def edit_examples(
    repo: str, commit: str, path: str, old: list[str], new: list[str], snippets: list
) -> list[EditExample]:
    """Every edit example the change ``old`` -> ``new`` of ``path`` gives, in file order."""
    hunks = hunks_of(old, new)
    found = []
    for index in range(1, len(hunks)):
        target = hunks[index]
        if target.a_start - hunks[index - 1].a_end > NEAR:
            continue
        old_part, new_part = old[target.a_start : target.a_end], new[target.b_start : target.b_end]
        if max(len(old_part), len(new_part)) > MAX_CHANGE_LINES:
            continue
        if "".join(old_part).split() == "".join(new_part).split():
            continue  # whitespace only: nothing a model could be judged on
        if any(h.size > MAX_HISTORY_LINES for h in hunks[max(0, index - MAX_HISTORY) : index]):
            continue
        example = _edit_example(repo, commit, path, old, new, hunks[:index], target, snippets)
        if example is not None:
            found.append(example)
    return found


def no_change_example(
    repo: str, commit: str, path: str, old: list[str], new: list[str], snippets: list
) -> EditExample | None:
    """The file after the whole change, the region around its last hunk: nothing to do."""
    hunks = hunks_of(old, new)
    if not hunks or any(h.size > MAX_HISTORY_LINES for h in hunks[-MAX_HISTORY:]):
        return None
    last_hunk = hunks[-1]
    if last_hunk.b_end == last_hunk.b_start:
        return None  # a deletion: no line of it to sit on
    first = max(0, last_hunk.b_start - CONTEXT_LINES)
    last = min(len(new), last_hunk.b_end + CONTEXT_LINES) - 1
    cursor_line = last_hunk.b_end - 1
    return _example(
        repo,
        commit,
        path,
        _history(old, new, hunks),
        new,
        (first, last),
        (cursor_line, len(new[cursor_line])),
        "\n".join(new[first : last + 1]),
        snippets,
        "no_change",
    )


def typing_example(example: EditExample, rng: random.Random) -> EditExample | None:
    """``example`` caught while its first new line is being typed (module docstring); None
    for an edit that writes no line with code to type (a deletion, a blank line)."""
    lines = example.file.split("\n")
    region, expected = example.region.split("\n"), example.expected.split("\n")
    matcher = difflib.SequenceMatcher(None, region, expected, autojunk=False)
    change = next((op for op in matcher.get_opcodes() if op[0] != "equal"), None)
    if change is None or change[3] == change[4]:
        return None
    _, i1, i2, j1, _ = change
    line = expected[j1]
    indent = len(line) - len(line.lstrip())
    if len(line) - indent < 2:
        return None
    typed = line[: rng.choice(pause_points(line, indent))]
    at = example.first_line + i1
    typing = lines[:at] + [typed] + lines[example.first_line + i2 :]
    return dataclasses.replace(
        example,
        file="\n".join(typing),
        last_line=example.last_line - (i2 - i1) + 1,
        cursor=(at, len(typed)),
        hunks=[*example.hunks, unified_hunk(lines, typing)][-MAX_HISTORY:],
    )


def pause_points(line: str, indent: int) -> list[int]:
    """Where a typist pauses in ``line`` (at least a character typed, never all of it): at a
    boundary between a word and what is not one (after ``foo``, ``(``, ``.``, ``= ``), where an
    IDE's request comes; every position where the line has no such boundary."""
    inside = range(indent + 1, len(line))
    word = [char.isalnum() or char == "_" for char in line]
    boundaries = [at for at in inside if word[at - 1] != word[at]]
    return boundaries or list(inside)


def history_cursor_example(example: EditExample) -> EditExample | None:
    """``example`` with the cursor where the user's last edit left it: at the end of the
    newest diff's last added line, where that line is in the region once (an IDE asks after a
    pause, the cursor at the end of what was just written); None where it is not."""
    if not example.hunks:
        return None
    newest = example.hunks[-1].split("\n")
    added = [line[1:] for line in newest if line.startswith("+") and line[1:].strip()]
    if not added:
        return None
    lines = example.file.split("\n")
    region = range(example.first_line, example.last_line + 1)
    hits = [at for at in region if at < len(lines) and lines[at] == added[-1]]
    if len(hits) != 1 or example.cursor == (hits[0], len(added[-1])):
        return None
    return dataclasses.replace(example, cursor=(hits[0], len(added[-1])))


def _history(old: list[str], new: list[str], done: list[Hunk]) -> list[str]:
    versions = [old] + [applied(old, new, hunk) for hunk in done]
    return [unified_hunk(a, b) for a, b in zip(versions, versions[1:], strict=False)]


def _edit_example(
    repo: str,
    commit: str,
    path: str,
    old: list[str],
    new: list[str],
    done: list[Hunk],
    target: Hunk,
    snippets: list,
) -> EditExample | None:
    current = applied(old, new, done[-1])
    shift = done[-1].b_end - done[-1].a_end  # where the target's old lines sit in ``current``
    start, end = target.a_start + shift, target.a_end + shift
    first = max(0, start - CONTEXT_LINES)
    last = min(len(current), end + CONTEXT_LINES) - 1
    if last < first:
        return None
    region_new = current[first:start] + new[target.b_start : target.b_end] + current[end : last + 1]
    if start <= last:
        changed = current[start]
        cursor = (start, len(changed) - len(changed.lstrip()))
    else:
        cursor = (last, 0)
    return _example(
        repo,
        commit,
        path,
        _history(old, new, done),
        current,
        (first, last),
        cursor,
        "\n".join(region_new),
        snippets,
        "edit",
    )


def _example(
    repo: str,
    commit: str,
    path: str,
    history: list[str],
    current: list[str],
    region: tuple[int, int],
    cursor: tuple[int, int],
    expected: str,
    snippets: list,
    kind: ExampleKind,
) -> EditExample:
    """The example with ``current`` cut to ``WINDOW`` lines either side of ``region``."""
    first, last = region
    low, high = max(0, first - WINDOW), min(len(current), last + 1 + WINDOW)
    return EditExample(
        repo=repo,
        commit=commit,
        path=path,
        language=LANGUAGES[Path(path).suffix],
        file="\n".join(current[low:high]) + "\n",
        first_line=first - low,
        last_line=last - low,
        cursor=(cursor[0] - low, cursor[1]),
        expected=expected,
        hunks=history[-MAX_HISTORY:],
        snippets=snippets,
        kind=kind,
    )
