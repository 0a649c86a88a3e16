"""The part of the file a next-edit prompt shows: a window of lines around the region.

Continue and Kilo Code send the whole file (clients.md), Zed an excerpt. The model needs the
lines near the region, and every token it reads costs the user time on each cold request
(a 2,600-line module is ~20,000 tokens: over a minute on a CPU, where an IDE gives up after
seconds). So every style shows ``WINDOW_LINES`` lines either side of the region, as the
training examples are cut (``training.edits``), whatever the client sent.

The window's edges fall on multiples of ``WINDOW_GRID`` lines of the file, so the cursor
moving a line or two (a new region) mostly keeps the same first lines, and the prompt's cached
prefix with them. A side longer than ``WINDOW_CHARS`` (minified code, generated tables) keeps
only the whole lines nearest the region that fit.
"""

from __future__ import annotations

import dataclasses

from serve_app.prompts.edit.parse import EditPrompt, region_without_cursor

WINDOW_LINES = 20  # at least this many lines either side of the region, where the file has them
WINDOW_GRID = 8  # the window starts and ends on a multiple of this many lines
WINDOW_CHARS = 4000  # at most this many characters either side


def file_window(prompt: EditPrompt) -> EditPrompt:
    """``prompt`` with the file cut to the window around its region (snippets, diffs and the
    region as they were). A file within the window comes back unchanged."""
    before = prompt.file_before.split("\n")  # the last item is the region's line, before it
    first = len(before) - 1  # the region's first line in the file
    start = max(0, (first - WINDOW_LINES) // WINDOW_GRID * WINDOW_GRID)
    after = prompt.file_after.split("\n")  # the first item is the region's last line, after it
    last = first + region_without_cursor(prompt).count("\n")
    end = -(-(last + 1 + WINDOW_LINES) // WINDOW_GRID) * WINDOW_GRID  # ceiling: exclusive
    shown_before = _nearest(before[start:-1], reverse=True) + before[-1:]
    below, past = after[1 : end - last], after[end - last :]
    if not any(line.strip() for line in past):  # only blank lines past the window: keep them
        below += past
    shown_after = after[:1] + _nearest(below, reverse=False)
    return dataclasses.replace(
        prompt, file_before="\n".join(shown_before), file_after="\n".join(shown_after)
    )


def _nearest(lines: list[str], *, reverse: bool) -> list[str]:
    """The lines nearest the region (the end of ``lines`` when ``reverse``, else the start)
    whose characters, newlines included, fit in ``WINDOW_CHARS``."""
    kept, size = 0, 0
    for line in reversed(lines) if reverse else lines:
        size += len(line) + 1
        if size > WINDOW_CHARS:
            break
        kept += 1
    if reverse:
        return lines[len(lines) - kept :]
    return lines[:kept]


def shown_chars(prompt: EditPrompt) -> int:
    """The characters of ``prompt`` the model can be shown, the part of the file outside the
    window left out: what the context must hold, where the request's length is not."""
    shown = file_window(prompt)
    parts = [shown.file_before, shown.region, shown.file_after, *shown.diffs]
    parts += [snippet.path + snippet.code for snippet in shown.snippets]
    return sum(map(len, parts))
