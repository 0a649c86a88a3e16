"""Parse the tagged next-edit message into its parts, and render parts back into that message.

An IDE sends one user message holding three top-level sections, in whatever order it likes
(Continue, Zed and Kilo Code send snippets, the file, then the history; the spec lists
snippets, history, file), with or without blank lines between them::

    <|recently_viewed_code_snippets|>
    <|recently_viewed_code_snippet|>
    code_snippet_file_path: shop/tax.py
    ...code...
    <|/recently_viewed_code_snippet|>
    <|/recently_viewed_code_snippets|>
    <|current_file_content|>
    current_file_path: shop/cart.py
    ...the file before the region...
    <|code_to_edit|>
    ...the region, with exactly one <|cursor|>...
    <|/code_to_edit|>
    ...the file after the region...
    <|/current_file_content|>
    <|edit_diff_history|>
    --- a/shop/cart.py
    +++ b/shop/cart.py
    @@ ... (unified diffs, oldest first)
    <|/edit_diff_history|>

Snippets and history may be empty or absent; ``code_to_edit`` may also come right after
``current_file_content`` instead of inside it. A trailing ``<|!@#IS_NEXT_EDIT!@#|>`` (Kilo Code's
marker for the public service) is dropped.

Newline convention, read off the clients: the newline right after ``<|code_to_edit|>`` and the
one right after ``<|/code_to_edit|>`` are layout. A newline right before ``<|/code_to_edit|>``
(Continue puts the tag on its own line) ends the region's last line in the file, so it moves
to the start of the text after the region: the region is then exactly the editable lines,
which is what every client replaces with the answer. ``file_before + region + file_after`` is
the file (cursor marker removed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from serve_app.errors import InvalidRequestError

CURSOR = "<|cursor|>"
SNIPPETS = "recently_viewed_code_snippets"
SNIPPET = "recently_viewed_code_snippet"
HISTORY = "edit_diff_history"
FILE = "current_file_content"
REGION = "code_to_edit"
SNIPPET_PATH_PREFIX = "code_snippet_file_path:"
FILE_PATH_PREFIX = "current_file_path:"
# Kilo Code appends the public service's next-edit marker; it is not part of the prompt.
NEXT_EDIT_MARKER = "<|!@#IS_NEXT_EDIT!@#|>"
# Zed writes this line before a diff that came from an accepted prediction.
ACCEPTED_PREDICTION = "// User accepted prediction:"

_SECTIONS = (SNIPPETS, HISTORY, FILE, REGION)
_REQUIRED = (FILE, REGION)


def opening(tag: str) -> str:
    return f"<|{tag}|>"


def closing(tag: str) -> str:
    return f"<|/{tag}|>"


@dataclass(frozen=True)
class Snippet:
    """A piece of another file the user looked at recently."""

    path: str
    code: str


@dataclass(frozen=True)
class EditPrompt:
    """The parsed next-edit request.

    ``region`` keeps the ``<|cursor|>`` marker so the cursor position travels with the text;
    ``region_inline`` says whether ``code_to_edit`` sat inside ``current_file_content``
    (the usual layout) or after it. Snippets and diffs are in the order sent, oldest first.
    """

    file_path: str
    file_before: str
    region: str
    file_after: str
    snippets: list[Snippet] = field(default_factory=list)
    diffs: list[str] = field(default_factory=list)
    region_inline: bool = True

    @property
    def cursor_offset(self) -> int:
        """Index of the cursor in the region text once the marker is removed."""
        return self.region.index(CURSOR)

    @property
    def file_text(self) -> str:
        """The whole current file, without the cursor marker."""
        return self.file_before + region_without_cursor(self) + self.file_after


def region_without_cursor(prompt: EditPrompt) -> str:
    """The region as it is in the file now (what a fallback answer returns)."""
    return prompt.region.replace(CURSOR, "")


class _Span(NamedTuple):
    """Offsets of one section in the content: tag start, body start, body end, tag end."""

    start: int
    body_start: int
    body_end: int
    end: int


_ABSENT = _Span(-1, -1, -1, -1)


def _invalid(message: str) -> InvalidRequestError:
    return InvalidRequestError(f"Invalid edit prompt: {message}.", param="messages")


def _times(count: int) -> str:
    return "twice" if count == 2 else f"{count} times"


def _strip_newline(text: str) -> str:
    """Drop the one layout newline that follows an opening tag."""
    for newline in ("\r\n", "\n"):
        if text.startswith(newline):
            return text[len(newline) :]
    return text


def parse_edit_prompt(content: str) -> EditPrompt:
    """Parse the user message of an edit request; every problem is an ``InvalidRequestError``
    with ``param="messages"`` whose message names the offending tag."""
    content = _drop_client_marker(content)
    spans = {tag: _find_section(content, tag) for tag in _SECTIONS}
    _check_layout(spans)
    region, region_newline = _split_region(_strip_newline(_body(content, spans[REGION])))
    _check_cursor(content, region)
    file_path, file_before, file_after, inline = _parse_file(content, spans, region)
    if inline:
        file_after = region_newline + file_after
    return EditPrompt(
        file_path=file_path,
        file_before=file_before,
        region=region,
        file_after=file_after,
        snippets=_parse_snippets(content, spans[SNIPPETS]),
        diffs=split_diffs(_strip_newline(_body(content, spans[HISTORY]))),
        region_inline=inline,
    )


def _drop_client_marker(content: str) -> str:
    stripped = content.rstrip()
    if stripped.endswith(NEXT_EDIT_MARKER):
        return stripped[: -len(NEXT_EDIT_MARKER)]
    return content


def _body(content: str, span: _Span) -> str:
    return "" if span is _ABSENT else content[span.body_start : span.body_end]


def _find_section(content: str, tag: str) -> _Span:
    """Locate a section whose opening and closing markers must each appear at most once
    (exactly once for the file and the region)."""
    open_tag, close_tag = opening(tag), closing(tag)
    opens, closes = content.count(open_tag), content.count(close_tag)
    if opens == 0 and closes == 0 and tag not in _REQUIRED:
        return _ABSENT
    if opens == 0:
        found_close = f" (found only its closing tag {close_tag})" if closes else ""
        raise _invalid(f"missing tag {open_tag}{found_close}")
    if opens > 1:
        raise _invalid(f"tag {open_tag} appears {_times(opens)}")
    if closes == 0:
        raise _invalid(f"tag {open_tag} is not closed: missing {close_tag}")
    if closes > 1:
        raise _invalid(f"closing tag {close_tag} appears {_times(closes)}")
    start, body_end = content.index(open_tag), content.index(close_tag)
    if body_end < start:
        raise _invalid(f"closing tag {close_tag} appears before {open_tag}")
    return _Span(start, start + len(open_tag), body_end, body_end + len(close_tag))


def _check_layout(spans: dict[str, _Span]) -> None:
    """Top-level sections in any order but not inside one another; the region inside the
    file or after it."""
    top = sorted(
        (span, tag) for tag, span in spans.items() if tag != REGION and span is not _ABSENT
    )
    for (first, first_tag), (second, second_tag) in zip(top, top[1:], strict=False):
        if first.end > second.start:
            raise _invalid(
                f"sections overlap: {opening(second_tag)} starts inside "
                f"{opening(first_tag)}...{closing(first_tag)}"
            )
    file, region = spans[FILE], spans[REGION]
    inside = file.body_start <= region.start and region.end <= file.body_end
    if not (inside or region.start >= file.end):
        raise _invalid(
            f"tags out of order: {opening(REGION)}...{closing(REGION)} must sit inside "
            f"{opening(FILE)}...{closing(FILE)} or come after it"
        )
    for tag in (SNIPPETS, HISTORY):
        span = spans[tag]
        if span is not _ABSENT and span.start < region.end and region.start < span.end:
            raise _invalid(f"sections overlap: {opening(REGION)} and {opening(tag)}")


def _split_region(body: str) -> tuple[str, str]:
    """The region and the newline that ends its last line in the file ('' when none)."""
    for newline in ("\r\n", "\n"):
        if body.endswith(newline):
            return body[: -len(newline)], newline
    return body, ""


def _check_cursor(content: str, region: str) -> None:
    inside = region.count(CURSOR)
    if inside != 1:
        raise _invalid(
            f"{opening(REGION)} must contain exactly one {CURSOR} marker; found {inside}"
        )
    outside = content.count(CURSOR) - inside
    if outside:
        raise _invalid(
            f"{CURSOR} may only appear inside {opening(REGION)}; found {outside} outside it"
        )


def _split_path_line(text: str, prefix: str, tag: str) -> tuple[str, str]:
    """Split ``PREFIX PATH`` off the first line; the rest is the code."""
    first, _, rest = text.partition("\n")
    if not first.startswith(prefix):
        raise _invalid(f"{opening(tag)} must start with a line '{prefix} PATH'")
    return first[len(prefix) :].strip(), rest


def _parse_file(content: str, spans: dict[str, _Span], region: str) -> tuple[str, str, str, bool]:
    """Return (path, text before the region, text after it, whether the region was inline)."""
    file, region_span = spans[FILE], spans[REGION]
    if region_span.start < file.end:  # inline: the region splits the file in two
        head = _strip_newline(content[file.body_start : region_span.start])
        path, before = _split_path_line(head, FILE_PATH_PREFIX, FILE)
        after = _strip_newline(content[region_span.end : file.body_end])
        return path, before, after, True
    # Region after the file: find it in the file. When it is not there verbatim, it is treated
    # as following the file (the model still sees the whole file, then the region).
    path, text = _split_path_line(_strip_newline(_body(content, file)), FILE_PATH_PREFIX, FILE)
    plain = region.replace(CURSOR, "")
    index = text.find(plain) if plain else -1
    if index < 0:
        return path, text, "", False
    return path, text[:index], text[index + len(plain) :], False


def _parse_snippets(content: str, span: _Span) -> list[Snippet]:
    """Read the ``<|recently_viewed_code_snippet|>`` blocks; only whitespace may sit between."""
    body, open_tag, close_tag = _body(content, span), opening(SNIPPET), closing(SNIPPET)
    for marker in (open_tag, close_tag):
        if content.count(marker) != body.count(marker):
            raise _invalid(f"tag {marker} found outside {opening(SNIPPETS)}")
    snippets: list[Snippet] = []
    pos = 0
    while True:
        start = body.find(open_tag, pos)
        between = body[pos : start if start >= 0 else len(body)]
        if close_tag in between:
            raise _invalid(f"closing tag {close_tag} has no opening {open_tag}")
        if between.strip():
            raise _invalid(f"text inside {opening(SNIPPETS)} must sit in {open_tag} blocks")
        if start < 0:
            return snippets
        end = body.find(close_tag, start)
        inner = body[start + len(open_tag) : end if end >= 0 else len(body)]
        if end < 0 or open_tag in inner:
            raise _invalid(f"tag {open_tag} is not closed: missing {close_tag}")
        path, code = _split_path_line(_strip_newline(inner), SNIPPET_PATH_PREFIX, SNIPPET)
        snippets.append(Snippet(path, code))
        pos = end + len(close_tag)


def _is_preamble(line: str) -> bool:
    """A line that opens a diff before its file header: git's, svn/jsdiff's, or Zed's note."""
    return line.startswith(("diff --git ", "Index: ")) or line.rstrip() == ACCEPTED_PREDICTION


def split_diffs(history: str) -> list[str]:
    """Split the edit history into one string per diff, oldest first.

    Clients join diffs with nothing, one or two newlines. A new diff starts at:

    - a preamble line (``diff --git``, ``Index:``, ``// User accepted prediction:``), unless
      the diff being collected holds only preamble lines so far (``Index:`` then ``===``, or
      Zed's note before a git header);
    - a ``--- `` line directly followed by a ``+++ `` line (a file header), unless the diff
      being collected has neither a file header nor a hunk yet (its preamble came first);
    - an ``@@`` hunk header, but only when the diff being collected has no file header and
      already holds a hunk: some clients send bare hunks, one per edit.

    Hunks under one file header stay together, since one edit may touch several places. Each
    diff is returned without its surrounding blank lines; blank input gives ``[]``.
    """
    chunks: list[list[str]] = []
    current: list[str] = []
    has_header = has_hunk = False
    lines = history.split("\n")
    for index, line in enumerate(lines):
        next_line = lines[index + 1] if index + 1 < len(lines) else ""
        is_file_header = line.startswith("--- ") and next_line.startswith("+++ ")
        is_hunk = line.startswith("@@")
        started = has_header or has_hunk
        starts_new = (
            (_is_preamble(line) and started)
            or (is_file_header and started)
            or (is_hunk and not has_header and has_hunk)
        )
        if starts_new and any(part.strip() for part in current):
            chunks.append(current)
            current, has_header, has_hunk = [], False, False
        current.append(line)
        has_header = has_header or is_file_header
        has_hunk = has_hunk or is_hunk
    chunks.append(current)
    diffs = ("\n".join(chunk).strip("\n") for chunk in chunks)
    return [diff for diff in diffs if diff.strip()]


def render_edit_prompt(prompt: EditPrompt) -> str:
    """The tagged user message for ``prompt`` in the spec's section order (snippets, history,
    file), with the region's tags on their own lines: ``parse_edit_prompt``'s inverse."""
    snippets = "".join(
        f"{opening(SNIPPET)}\n{SNIPPET_PATH_PREFIX} {snippet.path}\n{snippet.code}"
        f"{closing(SNIPPET)}\n"
        for snippet in prompt.snippets
    )
    diffs = "".join(f"{diff}\n" for diff in prompt.diffs)
    after = prompt.file_after
    if after.startswith("\n"):  # the region's last line ends: the closing tag gets its own line
        region, after = f"{opening(REGION)}\n{prompt.region}\n{closing(REGION)}\n", after[1:]
    else:
        region = f"{opening(REGION)}\n{prompt.region}{closing(REGION)}\n"
    if prompt.region_inline:
        file_body, trailer = prompt.file_before + region + after, ""
    else:
        file_body, trailer = prompt.file_text, "\n" + region.removesuffix("\n")
    return (
        f"{opening(SNIPPETS)}\n{snippets}{closing(SNIPPETS)}\n"
        f"{opening(HISTORY)}\n{diffs}{closing(HISTORY)}\n"
        f"{opening(FILE)}\n{FILE_PATH_PREFIX} {prompt.file_path}\n{file_body}{closing(FILE)}"
        f"{trailer}\n"
    )
