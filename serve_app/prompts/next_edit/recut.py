"""The region re-cut the way a trained layout's examples are cut, and its answer read back.

Mined examples (``training.edits``) hold ``CONTEXT_LINES`` lines either side of the edit, the
cursor on its first line; a model trained on them learns that the edit begins on the region's
third line and is as long as the region less ``CONTEXT_LINES`` at each end, whatever the cursor
says. Clients cut regions otherwise: Continue's starts at the cursor's line, Zed's excerpt holds
it anywhere. With Continue's cut, the shipped adapter wrote on the wrong lines, often losing one
of the user's lines (docs/next_edit.md; the runs: docs/next_edit_log.md). So, for such a
layout, the model is shown the region from
``CONTEXT_LINES`` lines above the cursor's line to as many below it (lines the sent region lacks
above taken from the file, its other lines left out), the same window in training and serving,
and its answer is read back onto the region the client sent: a line it changed outside that
region makes it no change.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from serve_app.prompts.next_edit.parse import CURSOR, EditPrompt

# Unchanged lines either side of the expected change in a mined example's region
# (``training.edits`` cuts them so): the cursor's line is the region's third.
CONTEXT_LINES = 2


@dataclass(frozen=True)
class Recut:
    """``shown``: the prompt the model answers; ``added``: lines of the file above the sent
    region that it shows; ``before`` and ``after``: the sent region's lines above and below
    the shown one."""

    shown: EditPrompt
    added: list[str]
    before: list[str]
    after: list[str]

    def sent_region(self, answer: str) -> str | None:
        """The sent region after ``answer`` (the shown region after the model's edit), or None
        where the answer changed a line the sent region does not hold."""
        lines = answer.split("\n")
        if lines[: len(self.added)] != self.added:
            return None
        return "\n".join(self.before + lines[len(self.added) :] + self.after)


def shown_expected(cut: Recut, expected: str) -> str | None:
    """``cut``'s shown region after the edit that makes the sent region ``expected`` (what a
    model shown it writes), or None where that edit changes a line it does not show."""
    lines = expected.split("\n")
    kept = len(lines) - len(cut.after)
    if lines[: len(cut.before)] != cut.before or lines[kept:] != cut.after:
        return None
    return "\n".join(cut.added + lines[len(cut.before) : kept])


def recut(prompt: EditPrompt) -> Recut:
    """``prompt`` with its region from ``CONTEXT_LINES`` lines above the cursor's line (the
    file's first line at the least) to as many below it (the region's last at the most). A
    region that does not start at a line's start (a client's region inside a line) is shown
    as sent."""
    lines = prompt.region.split("\n")
    if prompt.file_before and not prompt.file_before.endswith("\n"):
        return Recut(prompt, [], [], [])
    cursor_line = next(i for i, line in enumerate(lines) if CURSOR in line)
    above = prompt.file_before.split("\n")[:-1]  # whole lines: file_before ends with "\n"
    start = cursor_line - CONTEXT_LINES  # in the region's lines; < 0: lines of the file above
    added = above[max(0, len(above) + start) :] if start < 0 else []
    before = lines[: max(0, start)]
    end = cursor_line + CONTEXT_LINES + 1
    after = lines[end:]
    shown = dataclasses.replace(
        prompt,
        file_before="".join(line + "\n" for line in above[: len(above) - len(added)] + before),
        region="\n".join(added + lines[max(0, start) : end]),
        file_after="".join("\n" + line for line in after) + prompt.file_after,
    )
    return Recut(shown, added, before, after)
