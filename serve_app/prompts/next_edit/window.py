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

from serve_app.prompts.next_edit.parse import EditPrompt, region_without_cursor

WINDOW_LINES = 20  # at least this many lines either side of the region, where the file has them
WINDOW_GRID = 8  # the window starts and ends on a multiple of this many lines
WINDOW_CHARS = 4000  # at most this many characters either side


def file_window(prompt: EditPrompt) -> EditPrompt:
    """``prompt`` with the file cut to the window around its region (snippets, diffs and the
    region as they were). A file within the window comes back unchanged. Every prompt a
    request builds shows the window, so it is found by walking out from the region, never by
    splitting the whole file: a request's cost stays that of its window."""
    first = prompt.file_before.count("\n")  # the region's first line in the file
    start = max(0, (first - WINDOW_LINES) // WINDOW_GRID * WINDOW_GRID)
    last = first + region_without_cursor(prompt).count("\n")
    end = -(-(last + 1 + WINDOW_LINES) // WINDOW_GRID) * WINDOW_GRID  # ceiling: exclusive
    return dataclasses.replace(
        prompt,
        file_before=_lines_above(prompt.file_before, first - start),
        file_after=_lines_below(prompt.file_after, end - last - 1),
    )


def _lines_above(text: str, count: int) -> str:
    """The end of ``text`` (the file before the region): its last, partial line (the region's
    own line, before the region), and up to ``count`` whole lines above it, nearest first,
    while they fit in ``WINDOW_CHARS``."""
    line_start = text.rfind("\n") + 1  # where that partial line starts
    kept = line_start
    for _ in range(count):
        if kept == 0:
            break
        above = text.rfind("\n", 0, kept - 1) + 1
        if line_start - above > WINDOW_CHARS:
            break
        kept = above
    return text[kept:]


def _lines_below(text: str, count: int) -> str:
    """The start of ``text`` (the file after the region): its first, partial line (the rest of
    the region's last line), and up to ``count`` whole lines below it, nearest first, while
    they fit in ``WINDOW_CHARS``. Only blank lines past them (the file's last newlines) are
    kept too, where they fit."""
    line_end = text.find("\n")  # where that partial line ends
    if line_end < 0:
        return text
    kept = line_end
    for _ in range(count):
        if kept == len(text):
            break
        below = text.find("\n", kept + 1)
        below = len(text) if below < 0 else below
        if below - line_end > WINDOW_CHARS:
            break
        kept = below
    if not text[kept:].strip() and len(text) - line_end <= WINDOW_CHARS:
        return text
    return text[:kept]


def shown_chars(prompt: EditPrompt) -> int:
    """The characters of ``prompt`` the model can be shown, the part of the file outside the
    window left out: what the context must hold, where the request's length is not."""
    shown = file_window(prompt)
    parts = [shown.file_before, shown.region, shown.file_after, *shown.diffs]
    parts += [snippet.path + snippet.code for snippet in shown.snippets]
    return sum(map(len, parts))
