"""Is the model's rewritten region an edit? Checked before it is sent, as apply's merge is.

A client shows whatever region it gets back as a suggestion, so an answer that is not an edit
the user could want is worse than none. These are the ways a small model's answer fails
(measured on bench/next_edit.py's real edits) that can be told from the answer itself:

- ``diff_markers``: a line of the region or the history came back with a diff's ``+``/``-``
  in front of it, or a hunk header did: the model wrote a diff into the code;
- ``indent_shift``: every line moved by the same indentation (a level lost, mostly);
- ``dropped_lines``: more than half of the region's lines are gone, its last line with them
  (the model stopped early; a real deletion keeps the lines after what it deletes);
- ``history_copy``: most of the answer is lines of the edit history that the region does not
  hold, and most of the region is gone: the model rewrote a diff's hunk, not the region;
- ``reformat_only``: only whitespace changed: not an edit, so the honest answer is none;
- ``instruction_echo``: the answer holds the service's own instructions (``Rewrite the
  region: finish the code at ...``), which the request never sent: the model copied the
  task into the code;
- ``border_copy``, ``breaks_syntax``: the answer would damage the file (``damage``).

For any of them the service answers "no change" (the region as it was). ``cut_off`` (the
answer hit max_tokens) and ``unusable`` (nothing code-like in it) are the service's other two
reasons, named here so that every reason is counted under one name.
"""

from __future__ import annotations

import re
from typing import Literal

from serve_app.prompts.next_edit.damage import damage
from serve_app.prompts.next_edit.messages import INSTRUCTION_PHRASES
from serve_app.prompts.next_edit.parse import EditPrompt, region_without_cursor

EditRejection = Literal[
    "cut_off",
    "unusable",
    "diff_markers",
    "indent_shift",
    "dropped_lines",
    "history_copy",
    "reformat_only",
    "instruction_echo",
    "outside_region",
    "border_copy",
    "breaks_syntax",
]

_HUNK_HEADER = re.compile(r"^@@ -\d+(?:,\d+)? \+\d+(?:,\d+)? @@")


def rejected_edit(answer: str, prompt: EditPrompt) -> EditRejection | None:
    """Why ``answer`` (the rewritten region, read out of the model's text) is not an edit to
    send, or None when it is one (an unchanged region is one: "no change")."""
    region = region_without_cursor(prompt)
    if answer == region:
        return None
    if _echoes_instructions(answer, prompt):
        return "instruction_echo"
    region_lines, answer_lines = region.split("\n"), answer.split("\n")
    if _leaks_diff_markers(answer_lines, region_lines, prompt.diffs):
        return "diff_markers"
    if _shifts_indentation(_code(answer_lines), _code(region_lines)):
        return "indent_shift"
    if _drops_most_lines(_code(answer_lines), _code(region_lines)):
        return "dropped_lines"
    if _copies_history(_code(answer_lines), _code(region_lines), prompt.diffs):
        return "history_copy"
    if answer.split() == region.split():
        return "reformat_only"
    return damage(answer, prompt)


def _echoes_instructions(answer: str, prompt: EditPrompt) -> bool:
    """A phrase of the service's instructions in the answer that no text of the request
    holds (a file may well say "keep the other lines" itself). The request's text is only
    gathered when the answer holds a phrase: most answers hold none."""
    said = answer.lower()
    echoed = [phrase for phrase in INSTRUCTION_PHRASES if phrase in said]
    if not echoed:
        return False
    sent = "\n".join(
        [prompt.file_text, *prompt.diffs, *(snippet.code for snippet in prompt.snippets)]
    ).lower()
    return any(phrase not in sent for phrase in echoed)


def _code(lines: list[str]) -> list[str]:
    return [line for line in lines if line.strip()]


def _history_lines(diffs: list[str], kinds: str) -> set[str]:
    """Lines of the diffs' hunks whose marker is one of ``kinds`` (" ", "+", "-"), unmarked."""
    found = set()
    for diff in diffs:
        for line in diff.split("\n"):
            if line.startswith(("--- ", "+++ ")) or not line or line[0] not in kinds:
                continue
            found.add(line[1:])
    return found


def _leaks_diff_markers(answer: list[str], region: list[str], diffs: list[str]) -> bool:
    known = set(region) | _history_lines(diffs, " +-")
    for line in answer:
        if line in region:
            continue
        if _HUNK_HEADER.match(line):
            return True
        if line[:1] in ("+", "-") and line[1:].strip() and line[1:] in known:
            return True
    return False


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _shifts_indentation(answer: list[str], region: list[str]) -> bool:
    """Every line moved by one nonzero amount: line for line when the answer has as many
    lines as the region (edited lines included), else the lines it kept from the region."""
    if len(answer) < 2 or len(region) < 2:
        return False
    shift = min(map(_indent, answer)) - min(map(_indent, region))
    if shift == 0:
        return False
    if len(answer) == len(region):
        pairs = zip(answer, region, strict=True)
        return all(_indent(new) - _indent(old) == shift for new, old in pairs)
    placed = {(line.strip(), _indent(line)) for line in region}
    same = [line for line in answer if line.strip() in {text for text, _ in placed}]
    return len(same) * 2 > len(answer) and all(
        (line.strip(), _indent(line) - shift) in placed for line in same
    )


def _drops_most_lines(answer: list[str], region: list[str]) -> bool:
    if len(region) < 3 or len(answer) * 2 >= len(region):
        return False
    return region[-1].strip() not in {line.strip() for line in answer}


def _copies_history(answer: list[str], region: list[str], diffs: list[str]) -> bool:
    """Most of the answer is text the history shows in the file now (context and added
    lines) and the region does not hold; a moved block (lines the history removed) is not."""
    in_region = {line.strip() for line in region}
    history = {line.strip() for line in _history_lines(diffs, " +")}
    lifted = [line for line in answer if line.strip() not in in_region and line.strip() in history]
    kept = [line for line in region if line.strip() in {a.strip() for a in answer}]
    return len(lifted) >= 2 and len(lifted) * 2 >= len(answer) and len(kept) * 2 < len(region)
