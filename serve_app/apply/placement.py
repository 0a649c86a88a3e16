"""Where each chunk of an update lands in the original, and the merge that follows from it.

A chunk is placed by its anchors: its lines that equal original lines (exactly, then ignoring
whitespace), in order, after the previous chunk's place. The original lines between its first
and last anchor are replaced by the chunk ("named by its neighbours"); so are, at its edges, the
original lines next to an anchor that its unmatched edge lines are edits of (``similarity``),
and the old body of a block the chunk opens and gives a new body (below). A chunk with no
anchor is placed by a unique fuzzy match of one of its lines, or at the file's end (start)
when the update marks code before (after) it and nothing after (before). See docs/apply.md.
"""

from __future__ import annotations

import bisect
import difflib
from collections.abc import Callable
from dataclasses import dataclass

from serve_app.apply.update import (
    SIMILAR,
    Chunk,
    chunks_of,
    exact_key,
    indent,
    is_blank,
    is_significant,
    similarity,
    spaceless_key,
    usual_gap,
)
from serve_app.errors import MergeFailedError

STRAY_SLACK = 3  # a lone anchor inside new code may delete at most this many extra lines
UNIQUE_MARGIN = 0.05  # a fuzzy match is unique when the next best is this much less alike
SAME_LINE_EDITED = 0.8  # an anchorless chunk of several lines needs one line this like its own
MAX_PLACES = 64  # copies of a chunk's anchors weighed against each other
_CLOSING = ("}", ")", "]", "end")


@dataclass(frozen=True)
class Placement:
    """The chunk replaces original lines ``[start, end)``; ``kept`` are those among them it
    repeats (its anchors); ``gap`` blank lines go before it (a chunk added at the file end)."""

    start: int
    end: int
    kept: frozenset[int] = frozenset()
    gap: int = 0


@dataclass(frozen=True)
class ChunkPlan:
    """A chunk and the places it fits: none (unplaced), one, or several (ambiguous)."""

    chunk: Chunk
    places: tuple[Placement, ...]
    how: str = ""

    def problem(self) -> str | None:
        if not self.places:
            return (
                f"{self.chunk.describe()} matches no line of the original. Include a few "
                "unchanged lines around it (one that occurs once in the file), or start the "
                "update with a `... existing code ...` marker and end it with this chunk to "
                "add it at the end of the file."
            )
        if len(self.places) > 1:
            lines = ", ".join(str(place.start + 1) for place in self.places[:5])
            return (
                f"{self.chunk.describe()} fits {len(self.places)} places in the original "
                f"(lines {lines}). Include a few unchanged lines around it, one of them a "
                "line that occurs once in the file."
            )
        return None


@dataclass(frozen=True)
class Plan:
    """An update's chunks placed in the original (``plan_update``)."""

    lines: tuple[str, ...]
    chunks: tuple[ChunkPlan, ...]
    newline: str = "\n"
    final_newline: bool = False

    @property
    def is_certain(self) -> bool:
        """Every chunk lands in exactly one place: the merge needs no model."""
        return all(len(chunk.places) == 1 for chunk in self.chunks)

    def problem(self) -> str:
        """Why the chunks cannot all be placed (the first chunk that cannot)."""
        return next(
            (p for chunk in self.chunks if (p := chunk.problem())), "Every chunk is placed."
        )

    def merged(self) -> str:
        """The original with every chunk in its one place (only when ``is_certain``)."""
        return self.text(self.merged_lines([chunk.places[0] for chunk in self.chunks]))

    def merged_lines(self, places: list[Placement]) -> list[str]:
        out: list[str] = []
        cursor = 0
        for chunk, place in zip(self.chunks, places, strict=True):
            out += self.lines[cursor : place.start]
            out += [""] * place.gap + list(chunk.chunk.lines)
            cursor = max(cursor, place.end)
        return out + list(self.lines[cursor:])

    def text(self, lines: list[str]) -> str:
        body = self.newline.join(lines)
        return body + self.newline if self.final_newline and lines else body


def plan_update(original: str, update: str) -> Plan:
    """Place every chunk of ``update`` in ``original``. Raises ``MergeFailedError`` where the
    update contradicts the original (a chunk that only fits above the chunk before it)."""
    lines = tuple(original.splitlines())
    plans: list[ChunkPlan] = []
    low = 0
    for chunk in chunks_of(update):
        if not any(not is_blank(line) for line in lines):
            plans.append(ChunkPlan(chunk, (Placement(0, 0),), "empty original"))
            continue
        planned = _place(lines, chunk, low, plans[-1].chunk if plans else None)
        plans.append(planned)
        if planned.places:
            low = max(low, min(place.end for place in planned.places))
    return Plan(
        lines=lines,
        chunks=tuple(plans),
        newline="\r\n" if "\r\n" in original else "\n",
        final_newline=original.endswith("\n"),
    )


def _place(lines: tuple[str, ...], chunk: Chunk, low: int, previous: Chunk | None) -> ChunkPlan:
    for how, key in (("exact", exact_key), ("whitespace", spaceless_key)):
        places = _anchored(lines, chunk, low, key)
        if places:
            return ChunkPlan(chunk, places, how)
    if previous is not None and _anchored(lines, chunk, 0, exact_key):
        raise MergeFailedError(
            f"{chunk.describe()} matches the original only above {previous.describe()}. "
            "Give the chunks in the order their code has in the file.",
            param="messages",
        )
    edge = _at_file_edge(lines, chunk, low)
    if edge is not None:
        return ChunkPlan(chunk, (edge,), "file edge")
    return ChunkPlan(chunk, _fuzzy(lines, chunk, low), "fuzzy")


# --- anchors ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Block:
    at: int  # original index of its first line
    of: int  # chunk index of its first line
    size: int


def _anchored(
    lines: tuple[str, ...], chunk: Chunk, low: int, key: Callable[[str], str]
) -> tuple[Placement, ...]:
    """The places a chunk fits by its anchor lines under ``key``; () when it has none.

    As patience diff does: the chunk's lines that occur once in the original (below ``low``)
    and once in the chunk name the place; the other equal lines are aligned in the gaps
    between them. With no such line, every copy of the anchors is a place, and the one whose
    replaced lines are most like the chunk's new ones wins if it clearly does."""
    keys = [key(line) for line in lines]
    wanted = [key(line) for line in chunk.lines]
    # Only significant lines steer the alignment ("}" would pull it to the first "}"); the
    # blocks then grow over the equal lines after them.
    steering = [
        w if is_significant(line) else f"\0{i}"
        for i, (w, line) in enumerate(zip(wanted, chunk.lines, strict=True))
    ]
    chain = _unique_chain(keys, steering, low)
    if chain:
        blocks = _without_strays(_blocks_around(keys, steering, wanted, low, chain), chunk)
        return (_placement(lines, chunk, blocks, low),)
    blocks = _gap_blocks(keys, steering, wanted, (low, len(keys)), (0, len(wanted)), False)
    if not blocks:
        return ()
    blocks = _without_strays(blocks, chunk)
    first = blocks[0]
    places = []
    for start in _occurrences(keys, wanted[first.of : first.of + first.size], low, len(keys)):
        placed = _chained(keys, wanted, [_Block(start, first.of, first.size)], blocks[1:])
        if placed is not None:
            places.append(_placement(lines, chunk, placed, low))
    return _most_alike(lines, chunk, tuple(places[:MAX_PLACES]))


def _unique_chain(keys: list[str], steering: list[str], low: int) -> list[tuple[int, int]]:
    """(original, chunk) index pairs of lines that occur once in each, the longest run of
    them in the same order in both."""
    seen: dict[str, list[int]] = {}
    for at in range(low, len(keys)):
        seen.setdefault(keys[at], []).append(at)
    counts: dict[str, int] = {}
    for line in steering:
        counts[line] = counts.get(line, 0) + 1
    pairs = [
        (seen[line][0], of)
        for of, line in enumerate(steering)
        if counts[line] == 1 and len(seen.get(line, ())) == 1
    ]
    # Longest increasing subsequence of the original indexes (pairs are in chunk order).
    parent: list[int] = []
    ends: list[int] = []  # ends[k]: the pair ending the best run of length k + 1 so far
    for index, (at, _) in enumerate(pairs):
        slot = bisect.bisect_left([pairs[i][0] for i in ends], at)
        parent.append(ends[slot - 1] if slot else -1)
        ends[slot : slot + 1] = [index]
    chain, index = [], ends[-1] if ends else -1
    while index >= 0:
        chain.append(pairs[index])
        index = parent[index]
    return chain[::-1]


def _blocks_around(
    keys: list[str],
    steering: list[str],
    wanted: list[str],
    low: int,
    chain: list[tuple[int, int]],
) -> list[_Block]:
    """The chain's lines and the equal lines aligned in the gaps around them: above the
    first, nearest to it; between two, in that span; below the last, nearest to it."""
    blocks: list[_Block] = []
    first_at, first_of = chain[0]
    blocks += _gap_blocks(keys, steering, wanted, (low, first_at), (0, first_of), True)
    for (at, of), following in zip(chain, [*chain[1:], (len(keys), len(wanted))], strict=True):
        blocks.append(_Block(at, of, 1))
        span = (at + 1, following[0])
        blocks += _gap_blocks(keys, steering, wanted, span, (of + 1, following[1]), False)
    ordered: list[_Block] = []
    for block in sorted(blocks, key=lambda block: block.of):
        grown = _grown(block, keys, wanted)
        if grown is None:
            continue
        if ordered and grown.of < ordered[-1].of + ordered[-1].size:
            continue  # inside the block before it, which grew over it
        ordered.append(grown)
    return ordered


def _gap_blocks(
    keys: list[str],
    steering: list[str],
    wanted: list[str],
    span: tuple[int, int],
    of_span: tuple[int, int],
    nearest_last: bool,
) -> list[_Block]:
    """Blocks of equal lines between ``steering[of_span]`` and ``keys[span]``; difflib takes
    the earliest of equal candidates, so ``nearest_last`` aligns the reversed lines."""
    a, b = keys[span[0] : span[1]], steering[of_span[0] : of_span[1]]
    if nearest_last:
        a, b = a[::-1], b[::-1]
    found = []
    for i, j, size in difflib.SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks():
        if not size:
            continue
        if nearest_last:
            block = _Block(span[1] - i - size, of_span[1] - j - size, size)
        else:
            block = _Block(span[0] + i, of_span[0] + j, size)
        grown = _grown(block, keys, wanted)
        if grown is not None:
            found.append(grown)
    return sorted(found, key=lambda block: block.of)


def _chained(
    keys: list[str], wanted: list[str], placed: list[_Block], rest: list[_Block]
) -> list[_Block] | None:
    """``placed`` followed by each of ``rest`` at its next copy, or None when one has none."""
    for block in rest:
        after = placed[-1].at + placed[-1].size
        copies = _occurrences(keys, wanted[block.of : block.of + block.size], after, len(keys))
        if not copies:
            return None
        placed = [*placed, _Block(copies[0], block.of, block.size)]
    return placed


def _most_alike(
    lines: tuple[str, ...], chunk: Chunk, places: tuple[Placement, ...]
) -> tuple[Placement, ...]:
    """The one place whose replaced lines are clearly the most like the chunk's lines (an
    edit there), else all of them."""
    if len(places) < 2:
        return places
    scores = sorted(((_likeness(lines, chunk, place), place) for place in places), key=_first)
    (best, place), (second, _) = scores[-1], scores[-2]
    return (place,) if best - second >= UNIQUE_MARGIN else places


def _first(scored: tuple[float, Placement]) -> float:
    return scored[0]


def _likeness(lines: tuple[str, ...], chunk: Chunk, place: Placement) -> float:
    """How well the chunk's lines and the lines it replaces pair up (1.0: each has an equal
    line on the other side); a span replacing lines nothing in the chunk is like scores low."""
    own = [line for line in chunk.lines if not is_blank(line)]
    replaced = [lines[i] for i in range(place.start, place.end) if not is_blank(lines[i])]
    if not own or not replaced:
        return 0.0
    ours = sum(max(similarity(old, line) for old in replaced) for line in own)
    theirs = sum(max(similarity(old, line) for line in own) for old in replaced)
    return (ours + theirs) / (len(own) + len(replaced))


def _grown(block: _Block, keys: list[str], wanted: list[str]) -> _Block | None:
    """The block grown over the equal lines after it, and over those before it when they run
    up to the chunk's first line (context it starts with), then without blank lines at its
    edges (they belong to the code around the chunk). Otherwise not upwards: a new function's
    closing "}" just above an anchor is new code, not the "}" above it in the original."""
    at, of, size = block.at, block.of, block.size
    back = 0
    while back < min(at, of) and keys[at - back - 1] == wanted[of - back - 1]:
        back += 1
    if back == of:
        at, of, size = at - back, 0, size + back
    while (
        at + size < len(keys) and of + size < len(wanted) and keys[at + size] == wanted[of + size]
    ):
        size += 1
    while size and not wanted[of]:
        at, of, size = at + 1, of + 1, size - 1
    while size and not wanted[of + size - 1]:
        size -= 1
    return _Block(at, of, size) if size else None


def _without_strays(blocks: list[_Block], chunk: Chunk) -> list[_Block]:
    """Drop a first or last block that sits alone inside new code and would delete many more
    original lines than the chunk has there: new code that happens to repeat a line far
    away, not an anchor (taking it would delete everything in between)."""
    blocks = list(blocks)
    while len(blocks) > 1:
        first, second = blocks[0], blocks[1]
        last, before = blocks[-1], blocks[-2]
        if _is_stray(chunk, first, second, after=True):
            blocks.pop(0)
        elif _is_stray(chunk, last, before, after=False):
            blocks.pop()
        else:
            break
    return blocks


def _is_stray(chunk: Chunk, block: _Block, neighbour: _Block, *, after: bool) -> bool:
    lines = chunk.lines
    outside = lines[: block.of] if after else lines[block.of + block.size :]
    if not any(not is_blank(line) for line in outside):
        return False  # at the chunk's edge: an anchor, not code inside new code
    if after:
        deleted = neighbour.at - (block.at + block.size)
        written = neighbour.of - (block.of + block.size)
    else:
        deleted = block.at - (neighbour.at + neighbour.size)
        written = block.of - (neighbour.of + neighbour.size)
    return deleted > written + STRAY_SLACK


def _occurrences(keys: list[str], run: list[str], low: int, high: int) -> list[int]:
    return [at for at in range(low, high - len(run) + 1) if keys[at : at + len(run)] == run]


def _placement(lines: tuple[str, ...], chunk: Chunk, blocks: list[_Block], low: int) -> Placement:
    kept = frozenset(at for block in blocks for at in range(block.at, block.at + block.size))
    start, end = blocks[0].at, blocks[-1].at + blocks[-1].size
    head = list(chunk.lines[: blocks[0].of])
    tail = list(chunk.lines[blocks[-1].of + blocks[-1].size :])
    start = _edited_before(lines, start, head, floor=low)
    edited = _edited_after(lines, end, tail)
    code_tail = [line for line in tail if not is_blank(line)]
    end = edited if edited > end else _new_body_end(lines, chunk, end, code_tail) or end
    return Placement(start, end, kept)


def _edited_before(lines: tuple[str, ...], start: int, head: list[str], floor: int) -> int:
    """Extend ``start`` up over the original lines that the chunk lines just above its anchor
    are edits of, line for line, up to a blank line on either side."""
    origin = start
    for line in reversed(head):
        if start <= floor or not _is_edit(lines[start - 1], line, first=start == origin):
            break
        start -= 1
    return start


def _edited_after(lines: tuple[str, ...], end: int, tail: list[str]) -> int:
    """Extend ``end`` down over the original lines that the chunk lines just below its anchor
    are edits of, line for line, up to a blank line on either side."""
    origin = end
    for line in tail:
        if end >= len(lines) or not _is_edit(lines[end], line, first=end == origin):
            break
        end += 1
    return end


def _is_edit(original: str, line: str, *, first: bool) -> bool:
    """Whether ``line`` is an edit of ``original`` next to an anchor: alike, neither blank, and
    the first of a run says something ("}" next to "}" is no edit, it is the code around)."""
    if is_blank(line) or is_blank(original) or (first and not is_significant(line)):
        return False
    return similarity(original, line) >= SIMILAR


def _new_body_end(lines: tuple[str, ...], chunk: Chunk, end: int, tail: list[str]) -> int | None:
    """Where the old body ends when the chunk's last anchor opens a block (``def f():``,
    ``function f() {``) and the chunk goes on with a whole new body for it: lines indented
    deeper, closed as the old one is. None when it does not, when a marker inside the block
    follows the chunk (the rest of the block is kept), or when the old body is over twice as
    long as the new one (a method added to a class, not a class rewritten). Asked only when
    the chunk's next line is no edit of the old body's first."""
    opener = lines[end - 1]
    depth = indent(opener)
    after = next((i for i in range(end, len(lines)) if not is_blank(lines[i])), None)
    if not tail or after is None or indent(lines[after]) <= depth:
        return None
    marker = chunk.next_marker_indent
    if marker is not None and marker > depth:
        return None
    body, closer = tail, None
    if indent(tail[-1]) == depth and tail[-1].strip().startswith(_CLOSING):
        body, closer = tail[:-1], tail[-1]
    if not body or any(indent(line) <= depth for line in body):
        return None
    stop = end
    while stop < len(lines) and (is_blank(lines[stop]) or indent(lines[stop]) > depth):
        stop += 1
    old_end = stop
    while old_end > end and is_blank(lines[old_end - 1]):
        old_end -= 1
    if closer is not None:
        if stop >= len(lines) or not lines[stop].strip().startswith(_CLOSING):
            return None
        old_end = stop + 1
    old = sum(1 for line in lines[end:old_end] if not is_blank(line))
    return old_end if old <= 2 * len(tail) + 2 else None


# --- chunks without anchors ------------------------------------------------------------------


def _at_file_edge(lines: tuple[str, ...], chunk: Chunk, low: int) -> Placement | None:
    """A chunk the update puts at the file's end (markers before it, none after) or start:
    its edge lines replace the file's edge lines they are edits of, the rest is added there.
    None for a chunk with markers on both sides or none."""
    code = [i for i, line in enumerate(lines) if not is_blank(line)]
    if chunk.closes_file and not chunk.opens_file:
        last = code[-1] + 1
        start = _edited_before(lines, last, list(chunk.lines), floor=low)
        added = sum(1 for line in chunk.lines if not is_blank(line)) > last - start
        gap = usual_gap(lines) if added and start and not is_blank(lines[start - 1]) else 0
        return Placement(start, last, gap=gap)
    if chunk.opens_file and not chunk.closes_file and low == 0:
        first = code[0]
        end = _edited_after(lines, first, list(chunk.lines))
        return Placement(first, end)
    return None


def _fuzzy(lines: tuple[str, ...], chunk: Chunk, low: int) -> tuple[Placement, ...]:
    """Places where the chunk is an edit of the original line for line: each of its lines
    like the original line at the same position (blank lines aside) and, in a chunk of
    several lines, one plainly that line edited: short lines look alike by their keywords
    alone (``def helper():`` / ``return 1`` are 0.61 / 0.67 like ``def area(r):`` / ``return
    3.14 * r * r``), and such a new function replaced another. One place when it is clearly
    most alike there, all of them when several are as alike."""
    code = [i for i in range(low, len(lines)) if not is_blank(lines[i])]
    own = [line for line in chunk.lines if not is_blank(line)]
    scored: list[tuple[float, int]] = []
    for first in range(len(code) - len(own) + 1):
        scores: list[float] = []
        for offset, line in enumerate(own):
            score = similarity(lines[code[first + offset]], line)
            if score < SIMILAR:
                break
            scores.append(score)
        else:
            if len(own) == 1 or max(scores) >= SAME_LINE_EDITED:
                scored.append((sum(scores) / len(own), first))
    if not scored:
        return ()
    top = max(score for score, _ in scored)
    alike = sorted(first for score, first in scored if score > top - UNIQUE_MARGIN)
    return tuple(Placement(code[first], code[first + len(own) - 1] + 1) for first in alike)
