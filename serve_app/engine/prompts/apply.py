"""Apply: merge an update snippet into original code (POST /v1/apply/completions).

Two request layouts are read (clients.md): the public service's tagged one (ProxyAI)

    <|original_code|>\\n{code}\\n<|/original_code|>\\n\\n
    <|update_snippet|>\\n{snippet}\\n<|/update_snippet|>

and Continue's fenced one (a user message
``ORIGINAL CODE:\\n```\\n{code}\\n```\\n\\nSUGGESTED EDIT:\\n```\\n{edit}\\n```...``
and an assistant prefill, ignored).
The snippet shows the changed code; lines such as ``// ... existing code ...`` (in any comment
syntax) stand for unchanged code left out.

The model writes the merged file. Because a small model may drop or rewrite lines it should
have copied, its answer is checked (``keeps_untouched``): every line of the original outside
the regions the snippet covers must still be there, in order, and every line of the snippet
must be there too; where the snippet cannot be placed, the answer may lose no more original
lines than the snippet has. An answer that fails is replaced by ``merge_snippet``, a
deterministic line-anchored merge, when the snippet can be placed unambiguously; otherwise the
request fails (``MergeFailedError``) rather than answer a file with code lost: a client such as
ProxyAI writes the answer over the whole file.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from serve_app.errors import InvalidRequestError

UPDATED_OPEN, UPDATED_CLOSE = "<|updated_code|>", "<|/updated_code|>"
_TAGS = ("<|original_code|>", "<|/original_code|>", "<|update_snippet|>", "<|/update_snippet|>")
_CONTINUE = re.compile(
    r"ORIGINAL CODE:\n```[^\n]*\n(.*?)\n?```\n\nSUGGESTED EDIT:\n```[^\n]*\n", re.S
)
# "// ... existing code ...", "# ... existing code ...", "<!-- ... existing code ... -->", ...
_ELISION = re.compile(
    r"\W*\.\.\.\s*(existing code|rest of (the )?(code|file)|unchanged code)\b.*", re.I
)

INSTRUCTION = (
    "You merge code edits. You are given the original code and an update snippet. The snippet "
    "shows the changed parts of the code; a comment such as `// ... existing code ...` stands "
    "for unchanged code that was left out. Write the complete updated code: every line of the "
    "original code, in order, with the snippet's changes applied. Never drop, summarise or "
    "reorder unchanged code, and do not write the `... existing code ...` comments. Answer "
    "with the code only, in one ``` block."
)


@dataclass(frozen=True)
class ApplyInput:
    original: str
    snippet: str

    def messages(self) -> list[dict[str, str]]:
        """The chat the model sees; the assistant turn is prefilled with the opening fence."""
        user = (
            f"Original code:\n```\n{self.original}\n```\n\n"
            f"Update snippet:\n```\n{self.snippet}\n```\n\n"
            "Write the complete updated code."
        )
        return [
            {"role": "system", "content": INSTRUCTION},
            {"role": "user", "content": user},
            {"role": "assistant", "content": "```\n"},
        ]


def parse_apply_request(content: str) -> ApplyInput:
    """The original code and the snippet of a user message in either layout (400 otherwise)."""
    if all(tag in content for tag in _TAGS):
        return _parse_tagged(content)
    match = _CONTINUE.search(content)
    if match:
        rest = content[match.end() :]
        end = rest.rfind("\n```", 0, _instructions_start(rest))
        snippet = rest if end < 0 else rest[:end]
        return ApplyInput(original=match.group(1), snippet=snippet)
    raise InvalidRequestError(
        "The last user message must hold <|original_code|>...<|/original_code|> and "
        "<|update_snippet|>...<|/update_snippet|>, or ORIGINAL CODE and SUGGESTED EDIT blocks.",
        param="messages",
    )


def _instructions_start(rest: str) -> int:
    at = rest.find("\n\nApply the SUGGESTED EDIT")
    return len(rest) if at < 0 else at + 1


def _parse_tagged(content: str) -> ApplyInput:
    open_code, close_code, open_snippet, close_snippet = _TAGS
    start = content.index(open_code) + len(open_code)
    snippet_start = content.find(open_snippet, start)
    code_end = content.rfind(close_code, start, snippet_start if snippet_start >= 0 else None)
    snippet_end = content.rfind(close_snippet)
    if snippet_start < 0 or code_end < 0 or snippet_end < snippet_start:
        raise InvalidRequestError(
            "Write <|original_code|>...<|/original_code|> before "
            "<|update_snippet|>...<|/update_snippet|>.",
            param="messages",
        )
    return ApplyInput(
        original=_strip_newlines(content[start:code_end]),
        snippet=_strip_newlines(content[snippet_start + len(open_snippet) : snippet_end]),
    )


def _strip_newlines(text: str) -> str:
    """The tags sit on their own lines: drop exactly the newline after and before them."""
    return text.removeprefix("\n").removesuffix("\n")


def wrap_updated(code: str) -> str:
    return f"{UPDATED_OPEN}\n{code}\n{UPDATED_CLOSE}"


def clean_model_output(text: str) -> str:
    """The model's merged code: the fenced block it was asked for, without the fence."""
    text = text.removesuffix("```").rstrip("\n")
    return text.removeprefix(UPDATED_OPEN).removesuffix(UPDATED_CLOSE).strip("\n")


# --- checking and the deterministic merge ---------------------------------------------------


def is_elision(line: str) -> bool:
    return bool(_ELISION.fullmatch(line.strip()))


def _segments(snippet: str) -> list[list[str]]:
    """The snippet's runs of code between elision markers (blank-only runs dropped)."""
    segments: list[list[str]] = [[]]
    for line in snippet.splitlines():
        if is_elision(line):
            segments.append([])
        else:
            segments[-1].append(line)
    return [segment for segment in segments if any(line.strip() for line in segment)]


SIMILAR = 0.6  # an edited line this like an original line is taken as its edit


def _locate(original: list[str], cursor: int, segment: list[str]) -> tuple[int, int] | None:
    """The span of ``original`` (from ``cursor``) that ``segment`` replaces, or None when it
    cannot be placed unambiguously: no line of it matches, or the span would delete more
    original lines than the segment has (a changed line matched far away, not an anchor)."""
    rest = [line.strip() for line in original[cursor:]]
    wanted = [line.strip() for line in segment]
    matcher = difflib.SequenceMatcher(None, rest, wanted, autojunk=False)
    blocks = [
        block
        for block in matcher.get_matching_blocks()
        if block.size and any(rest[block.a : block.a + block.size])
    ]
    if not blocks:
        return _locate_one_changed_line(rest, wanted)
    start, end = blocks[0].a, blocks[-1].a + blocks[-1].size
    while end > start and not rest[end - 1]:  # blank lines at the edges stay where they are
        end -= 1
    while start < end and not rest[start]:
        start += 1
    # Unmatched lines at the segment's edges replace the original lines next to the span when
    # they are edits of them ("return x" -> "return y"); otherwise they are insertions.
    tail = [line for line in wanted[blocks[-1].b + blocks[-1].size :] if line]
    while tail and end < len(rest) and _similar(rest[end], tail[0]):
        end, tail = end + 1, tail[1:]
    head = [line for line in wanted[: blocks[0].b] if line]
    while head and start > 0 and _similar(rest[start - 1], head[-1]):
        start, head = start - 1, head[:-1]
    matched = sum(block.size for block in blocks)
    if (end - start) - matched > len(segment):
        return None
    return cursor + start, cursor + end


def _locate_one_changed_line(rest: list[str], wanted: list[str]) -> tuple[int, int] | None:
    """A one-line segment that matches no line exactly ("y = 2" -> "y = 3") replaces the one
    original line most like it, if that line is similar and no other is as similar."""
    edited = [line for line in wanted if line]
    if len(edited) != 1:
        return None
    ratios = [_ratio(line, edited[0]) if line else 0.0 for line in rest]
    best = max(ratios, default=0.0)
    if best < SIMILAR or ratios.count(best) != 1:
        return None
    at = ratios.index(best)
    return at, at + 1


def _similar(original: str, edited: str) -> bool:
    return _ratio(original, edited) >= SIMILAR


def _ratio(original: str, edited: str) -> float:
    return difflib.SequenceMatcher(None, original, edited, autojunk=False).ratio()


def _spans(original: list[str], snippet: str) -> list[tuple[int, int, list[str]]] | None:
    spans, cursor = [], 0
    for segment in _segments(snippet):
        located = _locate(original, cursor, segment)
        if located is None:
            return None
        spans.append((*located, segment))
        cursor = located[1]
    return spans


def merge_snippet(original: str, snippet: str) -> str | None:
    """The snippet merged by line anchors: each segment replaces the span of the original it
    matches; everything between and around the spans is kept. None when it cannot be placed."""
    lines = original.splitlines()
    if not any(line.strip() for line in lines):  # nothing to keep: the snippet is the file
        return "\n".join(line for segment in _segments(snippet) for line in segment)
    spans = _spans(lines, snippet)
    if spans is None:
        return None
    merged, cursor = [], 0
    for start, end, segment in spans:
        merged += lines[cursor:start] + _trim_blank_edges(segment)
        cursor = end
    return "\n".join(merged + lines[cursor:])


def _trim_blank_edges(segment: list[str]) -> list[str]:
    """Blank lines at a segment's edges belong to the kept code around it, not to the edit."""
    first = next(i for i, line in enumerate(segment) if line.strip())
    last = max(i for i, line in enumerate(segment) if line.strip())
    return segment[first : last + 1]


def keeps_untouched(original: str, snippet: str, merged: str) -> bool:
    """Whether ``merged`` keeps, in order, every non-blank original line outside the spans the
    snippet covers and every non-blank line of the snippet, and has no elision marker left.
    A snippet the anchors cannot place may stand for as many original lines as it has lines
    (the bound ``_locate`` keeps to), no more: the rest of the original must stay, so an
    answer of the snippet alone never passes for a file longer than it."""
    lines = original.splitlines()
    merged_lines = merged.splitlines()
    if any(is_elision(line) for line in merged_lines):
        return False
    spans = _spans(lines, snippet)
    kept, cursor = [], 0
    for start, end, _ in spans or []:
        kept += lines[cursor:start]
        cursor = end
    kept += lines[cursor:]
    snippet_lines = [line for segment in _segments(snippet) for line in segment]
    if not _in_order(snippet_lines, merged_lines):
        return False
    if spans is not None:
        return _in_order(kept, merged_lines)
    return _lost(kept, merged_lines) <= len(_code(snippet_lines))


def _code(lines: list[str]) -> list[str]:
    return [line.rstrip() for line in lines if line.strip()]


def _in_order(needed: list[str], lines: list[str]) -> bool:
    remaining = iter(line.rstrip() for line in lines)
    return all(line in remaining for line in _code(needed))


def _lost(needed: list[str], lines: list[str]) -> int:
    """How many non-blank ``needed`` lines ``lines`` does not keep in order."""
    wanted = _code(needed)
    matcher = difflib.SequenceMatcher(None, wanted, _code(lines), autojunk=False)
    return len(wanted) - sum(block.size for block in matcher.get_matching_blocks())
