"""Next-edit prompts: parse the tagged user message, build the chat prompt, read the answer back.

An IDE sends one user message whose content holds four tagged sections, in this order::

    <|recently_viewed_code_snippets|>
    <|recently_viewed_code_snippet|>
    code_snippet_file_path: shop/tax.py
    ...code...
    <|/recently_viewed_code_snippet|>
    <|/recently_viewed_code_snippets|>
    <|edit_diff_history|>
    --- a/shop/cart.py
    +++ b/shop/cart.py
    @@ ... (unified diffs, oldest first)
    <|/edit_diff_history|>
    <|current_file_content|>
    current_file_path: shop/cart.py
    ...the file before the region...
    <|code_to_edit|>
    ...the region, with exactly one <|cursor|>...
    <|/code_to_edit|>
    ...the file after the region...
    <|/current_file_content|>

``code_to_edit`` may also come right after ``current_file_content`` instead of inside it.
The answer is the rewritten region only: no tags, no cursor marker, no markdown.

Newline convention (what makes ``render_edit_prompt`` the exact inverse of
``parse_edit_prompt``): the one newline right after an opening tag belongs to the layout, not to
the text; so does the newline right after ``<|/code_to_edit|>`` when the region ends with one.
Everything else is kept byte for byte, so ``file_before + region + file_after`` is the file.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from serve_app.errors import ContextLengthExceededError, InvalidRequestError

CURSOR = "<|cursor|>"
SNIPPETS = "recently_viewed_code_snippets"
SNIPPET = "recently_viewed_code_snippet"
HISTORY = "edit_diff_history"
FILE = "current_file_content"
REGION = "code_to_edit"
SNIPPET_PATH_PREFIX = "code_snippet_file_path:"
FILE_PATH_PREFIX = "current_file_path:"

_SECTIONS = (SNIPPETS, HISTORY, FILE, REGION)


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


# ---------------------------------------------------------------------------------------------
# Parsing


class _Span(NamedTuple):
    """Offsets of one section in the content: tag start, body start, body end, tag end."""

    start: int
    body_start: int
    body_end: int
    end: int


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
    spans = {tag: _find_section(content, tag) for tag in _SECTIONS}
    _check_order(spans)
    region = _strip_newline(_body(content, spans[REGION]))
    _check_cursor(content, region)
    file_path, file_before, file_after, inline = _parse_file(content, spans, region)
    return EditPrompt(
        file_path=file_path,
        file_before=file_before,
        region=region,
        file_after=file_after,
        snippets=_parse_snippets(content, spans[SNIPPETS]),
        diffs=split_diffs(_strip_newline(_body(content, spans[HISTORY]))),
        region_inline=inline,
    )


def _body(content: str, span: _Span) -> str:
    return content[span.body_start : span.body_end]


def _find_section(content: str, tag: str) -> _Span:
    """Locate a section whose opening and closing markers must each appear exactly once."""
    open_tag, close_tag = opening(tag), closing(tag)
    opens, closes = content.count(open_tag), content.count(close_tag)
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


def _check_order(spans: dict[str, _Span]) -> None:
    for first, second in ((SNIPPETS, HISTORY), (HISTORY, FILE)):
        if spans[first].end > spans[second].start:
            raise _invalid(
                f"tags out of order: {opening(first)}...{closing(first)} "
                f"must come before {opening(second)}"
            )
    file, region = spans[FILE], spans[REGION]
    inside = file.body_start <= region.start and region.end <= file.body_end
    if not (inside or region.start >= file.end):
        raise _invalid(
            f"tags out of order: {opening(REGION)}...{closing(REGION)} must sit inside "
            f"{opening(FILE)}...{closing(FILE)} or come after it"
        )


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
        after = content[region_span.end : file.body_end]
        return path, before, _strip_newline(after) if region.endswith("\n") else after, True
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


def split_diffs(history: str) -> list[str]:
    """Split the edit history into one string per diff, oldest first.

    A new diff starts at:

    - a ``diff --git`` line;
    - a ``--- `` line directly followed by a ``+++ `` line (a file header), unless it completes
      the ``diff --git`` header just before it;
    - an ``@@`` hunk header, but only when the diff being collected has no file header and
      already holds a hunk: some clients send bare hunks, one per edit.

    Hunks under one file header stay together, since one edit may touch several places. Each
    diff is returned without its surrounding blank lines; blank input gives ``[]``.
    """
    chunks: list[list[str]] = []
    current: list[str] = []
    has_header = awaiting_file_header = has_hunk = False
    lines = history.split("\n")
    for index, line in enumerate(lines):
        next_line = lines[index + 1] if index + 1 < len(lines) else ""
        is_git = line.startswith("diff --git ")
        is_file_header = line.startswith("--- ") and next_line.startswith("+++ ")
        is_hunk = line.startswith("@@")
        starts_new = (
            is_git
            or (is_file_header and not (awaiting_file_header and not has_hunk))
            or (is_hunk and not has_header and has_hunk)
        )
        if starts_new and any(part.strip() for part in current):
            chunks.append(current)
            current, has_header, awaiting_file_header, has_hunk = [], False, False, False
        current.append(line)
        has_header = has_header or is_git or is_file_header
        awaiting_file_header = is_git or (awaiting_file_header and not is_file_header)
        has_hunk = has_hunk or is_hunk
    chunks.append(current)
    diffs = ("\n".join(chunk).strip("\n") for chunk in chunks)
    return [diff for diff in diffs if diff.strip()]


# ---------------------------------------------------------------------------------------------
# Rendering


def render_edit_prompt(prompt: EditPrompt) -> str:
    """The tagged user message for ``prompt``: ``parse_edit_prompt``'s exact inverse."""
    snippets = "".join(
        f"{opening(SNIPPET)}\n{SNIPPET_PATH_PREFIX} {snippet.path}\n{snippet.code}"
        f"{closing(SNIPPET)}\n"
        for snippet in prompt.snippets
    )
    diffs = "".join(f"{diff}\n" for diff in prompt.diffs)
    region = f"{opening(REGION)}\n{prompt.region}{closing(REGION)}"
    if prompt.region_inline:
        newline = "\n" if prompt.region.endswith("\n") else ""
        file_body, trailer = prompt.file_before + region + newline + prompt.file_after, ""
    else:
        file_body, trailer = prompt.file_text, f"\n{region}\n"
    return (
        f"{opening(SNIPPETS)}\n{snippets}{closing(SNIPPETS)}\n"
        f"{opening(HISTORY)}\n{diffs}{closing(HISTORY)}\n"
        f"{opening(FILE)}\n{FILE_PATH_PREFIX} {prompt.file_path}\n{file_body}{closing(FILE)}"
        f"{trailer}\n"
    )


# ---------------------------------------------------------------------------------------------
# Chat messages for the instruct model

SYSTEM_PROMPT = (
    "You predict a programmer's next code edit. You are shown the current file, the "
    "programmer's recent edits as diffs, and a region of the file that contains the cursor. "
    "Rewrite the region to make the edit the programmer is most likely to make next: continue "
    "the recent edits and finish the code at the cursor. Keep the other lines of the region as "
    "they are. Reply with only the rewritten region in one ``` code block, no explanations."
)

# File suffix -> markdown fence label: a labelled fence tells the model the language.
# fmt: off
_LANGUAGES = {
    "py": "python", "js": "javascript", "jsx": "jsx", "ts": "typescript", "tsx": "tsx",
    "go": "go", "rs": "rust", "java": "java", "kt": "kotlin", "c": "c", "h": "c", "cc": "cpp",
    "cpp": "cpp", "hpp": "cpp", "cs": "csharp", "rb": "ruby", "php": "php", "swift": "swift",
    "sh": "bash", "sql": "sql", "html": "html", "css": "css", "json": "json", "yaml": "yaml",
    "yml": "yaml", "md": "markdown",
}
# fmt: on


def fence_language(path: str) -> str:
    """The markdown fence label for a file path ('' when unknown)."""
    name = path.rsplit("/", 1)[-1]
    return _LANGUAGES.get(name.rsplit(".", 1)[-1].lower(), "") if "." in name else ""


def _fenced(code: str, language: str = "") -> str:
    return f"```{language}\n{code.rstrip(chr(10))}\n```"


def build_messages(
    prompt: EditPrompt, *, drop_snippets: int = 0, drop_diffs: int = 0
) -> list[dict[str, str]]:
    """System and user messages for the instruct model.

    The user message shows, in this order: recently viewed snippets, the file, the recent
    diffs, the region with its cursor, then what to do. What comes last weighs most for a 0.5B
    model, which otherwise copies the region unchanged; so the closing line names the renames
    the diffs made that the region still lacks (``recent_renames``), when there are any. The
    file is shown plain: with the region marked in it, the model tended to echo the file.

    ``drop_snippets``/``drop_diffs`` leave out that many of the oldest snippets/diffs (used by
    ``fit_to_context``). Empty sections are left out, to keep the prompt short.
    """
    language = fence_language(prompt.file_path)
    parts = []
    snippets = prompt.snippets[drop_snippets:]
    if snippets:
        shown = (f"{s.path}:\n{_fenced(s.code, fence_language(s.path))}" for s in snippets)
        parts.append("Recently viewed code:\n" + "\n".join(shown))
    parts.append(f"File {prompt.file_path}:\n{_fenced(prompt.file_text, language)}")
    diffs = prompt.diffs[drop_diffs:]
    if diffs:
        parts.append("Recent edits, oldest first:\n" + _fenced("\n".join(diffs), "diff"))
    parts.append(f"Region:\n{_fenced(prompt.region, language)}\n{_task(prompt, diffs)}")
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def _task(prompt: EditPrompt, diffs: list[str]) -> str:
    renames = recent_renames(diffs, region_without_cursor(prompt))
    if not renames:
        return f"Rewrite the region: finish the code at {CURSOR} and keep the other lines."
    pairs = " and ".join(f"`{old}` to `{new}`" for old, new in renames)
    return f"Rewrite the region: rename {pairs} in it, as the recent edits did."


_WORD = re.compile(r"[A-Za-z_]\w*|\S")


def recent_renames(diffs: list[str], region: str, limit: int = 3) -> list[tuple[str, str]]:
    """Identifier renames the diffs made that ``region`` still has the old name of.

    A rename shows in a changed line pair (the n-th removed and n-th added line of a block
    with as many of each) whose tokens differ only where one identifier replaces another.
    Later edits win; at most ``limit`` renames, the most recent, are returned.
    """
    renames: dict[str, str] = {}
    for diff in diffs:
        for removed, added in _changed_line_pairs(diff):
            for old, new in _identifier_swaps(removed, added):
                renames.pop(old, None)
                renames[old] = new
    in_region = set(_WORD.findall(region))
    found = [(old, new) for old, new in renames.items() if old in in_region]
    return found[-limit:]


def _changed_line_pairs(diff: str) -> list[tuple[str, str]]:
    """Pair removed and added lines of each change block that has as many of each."""
    pairs: list[tuple[str, str]] = []
    removed: list[str] = []
    added: list[str] = []
    for line in [*diff.split("\n"), ""]:
        is_removed = line.startswith("-") and not line.startswith("--- ")
        if line.startswith("+") and not line.startswith("+++ "):
            added.append(line[1:])
        elif is_removed and not added:
            removed.append(line[1:])
        else:  # the block ended: pair it up, and a removal starts the next one
            if len(removed) == len(added):
                pairs.extend(zip(removed, added, strict=True))
            removed, added = ([line[1:]] if is_removed else []), []
    return pairs


def _identifier_swaps(before: str, after: str) -> list[tuple[str, str]]:
    """Identifiers replaced one for one between two versions of a line."""
    old, new = _WORD.findall(before), _WORD.findall(after)
    if len(old) != len(new):
        return []
    swaps = {(a, b) for a, b in zip(old, new, strict=True) if a != b}
    if not all(_is_identifier(a) and _is_identifier(b) for a, b in swaps):
        return []  # more than a rename changed (an operator, a literal, ...)
    olds = [a for a, _ in swaps]
    return sorted(swaps) if len(olds) == len(set(olds)) else []


def _is_identifier(token: str) -> bool:
    return token.isidentifier() and not keyword.iskeyword(token)


def _encode(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    encoded = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )
    return list(encoded["input_ids"])


def fit_to_context(
    prompt: EditPrompt,
    tokenizer: Any,
    max_prompt_tokens: int,
    *,
    context_length: int | None = None,
) -> tuple[list[dict[str, str]], list[int]]:
    """Messages and prompt token ids that fit in ``max_prompt_tokens``.

    While too long, the oldest snippets are dropped first (context the user merely looked at),
    then the oldest diffs (the latest edits predict the next one best); the file and the region
    are never cut. If even that does not fit, raise ``ContextLengthExceededError`` naming
    ``context_length`` (the model's, for the message; defaults to ``max_prompt_tokens``).

    Dropping more never lengthens the prompt, so the smallest drop that fits is found by binary
    search over that order: a handful of tokenisations even for long histories.
    """
    plans = [(s, 0) for s in range(len(prompt.snippets) + 1)]
    plans += [(len(prompt.snippets), d) for d in range(1, len(prompt.diffs) + 1)]

    def attempt(index: int) -> tuple[list[dict[str, str]], list[int]]:
        drop_snippets, drop_diffs = plans[index]
        messages = build_messages(prompt, drop_snippets=drop_snippets, drop_diffs=drop_diffs)
        return messages, _encode(tokenizer, messages)

    best = attempt(0)
    if len(best[1]) <= max_prompt_tokens:
        return best
    best = attempt(len(plans) - 1)
    if len(best[1]) > max_prompt_tokens:
        limit = context_length if context_length is not None else max_prompt_tokens
        raise ContextLengthExceededError.for_limit(limit, param="messages")
    too_long, fits = 0, len(plans) - 1
    while fits - too_long > 1:
        middle = (too_long + fits) // 2
        candidate = attempt(middle)
        if len(candidate[1]) <= max_prompt_tokens:
            fits, best = middle, candidate
        else:
            too_long = middle
    return best


# ---------------------------------------------------------------------------------------------
# Reading the model's answer

# Special-token-like tags: <|cursor|>, <|im_end|>, <|code_to_edit|>, ...
_TAG = re.compile(r"<\|/?[A-Za-z_][A-Za-z0-9_]*\|>")
# A line of English at the left margin: a capitalised word, two more words, no code symbols.
_PROSE = re.compile(r"^[A-Z][a-z']*[,.:!]?(?:[ \t]+\S+){2,}$")
_CODE_SYMBOLS = set('=(){}[];<>#"\\')


def extract_edited_region(completion: str, prompt: EditPrompt) -> tuple[str, bool]:
    """The rewritten region from the model's raw text, and whether the text was usable.

    Removes every ``<|...|>`` tag (the cursor marker included), takes the first fenced block
    (or, unfenced, the text less any prose lines around it) and gives it the region's leading
    and trailing newlines. Tags that the user's own region holds (a tokenizer's source, say)
    are kept: the answer replaces that code. When nothing usable is left it returns the
    original region (cursor removed) and ``False``.
    """
    original = region_without_cursor(prompt)
    text = _strip_tags(completion, keep=set(_TAG.findall(original)))
    code = _fenced_block(text, original)
    if code is None:
        code = _strip_prose(text, original)
    if not code.strip():
        return original, False
    return _match_edge_newlines(code, original), True


def _strip_tags(text: str, keep: set[str]) -> str:
    """Remove tags until none is left (removing one could join the halves of another)."""
    while True:
        stripped = _TAG.sub(lambda m: m.group(0) if m.group(0) in keep else "", text)
        if stripped == text:
            return text
        text = stripped


def _fenced_block(text: str, original: str) -> str | None:
    """The body of the first ``` block; None when the text has no fence at all.

    A lone fence is an opening one when labelled (```python) or when nothing but prose precedes
    it (the answer was cut off); otherwise it closes an answer whose opening fence was omitted.
    """
    lines = text.split("\n")
    fences = [i for i, line in enumerate(lines) if line.lstrip().startswith("```")]
    if not fences:
        return None
    first = fences[0]
    if len(fences) > 1:
        return "\n".join(lines[first + 1 : fences[1]])
    before = _strip_prose("\n".join(lines[:first]), original)
    labelled = lines[first].strip() != "```"
    if labelled or not before.strip():
        return "\n".join(lines[first + 1 :])
    return before


def _is_prose(line: str, original_lines: set[str]) -> bool:
    if not line.strip():
        return True  # blank lines at the edges carry nothing
    if line in original_lines or line != line.lstrip():
        return False  # copied from the region, or indented: code
    return bool(_PROSE.match(line.rstrip())) and not (_CODE_SYMBOLS & set(line))


def _strip_prose(text: str, original: str) -> str:
    """Drop blank and prose lines before and after the code; lines in between are kept."""
    lines = text.split("\n")
    original_lines = set(original.split("\n"))
    start, end = 0, len(lines)
    while start < end and _is_prose(lines[start], original_lines):
        start += 1
    while end > start and _is_prose(lines[end - 1], original_lines):
        end -= 1
    return "\n".join(lines[start:end])


def _match_edge_newlines(code: str, original: str) -> str:
    """Give ``code`` the original region's leading and trailing newlines, so it splices back."""
    body = original.strip("\n")
    if not body:
        return code.strip("\n") + original
    leading = len(original) - len(original.lstrip("\n"))
    trailing = len(original) - len(original.rstrip("\n"))
    return "\n" * leading + code.strip("\n") + "\n" * trailing


# ---------------------------------------------------------------------------------------------
# A realistic request (README, benchmarks and tests): the user renamed ``total`` to
# ``subtotal`` in two lines, so the likely next edit renames it in the region too.

EXAMPLE_EDIT_CONTENT = '''<|recently_viewed_code_snippets|>
<|recently_viewed_code_snippet|>
code_snippet_file_path: shop/models.py
@dataclass
class Item:
    name: str
    price: float
    quantity: int = 1
<|/recently_viewed_code_snippet|>
<|recently_viewed_code_snippet|>
code_snippet_file_path: shop/discounts.py
def apply_discount(amount: float, code: str | None) -> float:
    """Apply a discount code; unknown codes change nothing."""
    return amount * (1 - DISCOUNTS.get(code, 0.0))
<|/recently_viewed_code_snippet|>
<|recently_viewed_code_snippet|>
code_snippet_file_path: shop/tax.py
TAX_RATE = 0.2


def add_tax(amount: float) -> float:
    return round(amount * (1 + TAX_RATE), 2)
<|/recently_viewed_code_snippet|>
<|/recently_viewed_code_snippets|>

<|edit_diff_history|>
--- a/shop/cart.py
+++ b/shop/cart.py
@@ -7,2 +7,3 @@
 from shop.discounts import apply_discount
 from shop.models import Item
+from shop.tax import add_tax
--- a/shop/cart.py
+++ b/shop/cart.py
@@ -35,6 +35,6 @@
     def checkout_total(self, code: str | None = None) -> float:
-        total = sum(item.price * item.quantity for item in self.items)
+        subtotal = sum(item.price * item.quantity for item in self.items)
         total = apply_discount(total, code)
         if total < 0:
             total = 0.0
--- a/shop/cart.py
+++ b/shop/cart.py
@@ -35,6 +35,6 @@
     def checkout_total(self, code: str | None = None) -> float:
         subtotal = sum(item.price * item.quantity for item in self.items)
-        total = apply_discount(total, code)
+        subtotal = apply_discount(subtotal, code)
         if total < 0:
             total = 0.0
         return add_tax(total)
<|/edit_diff_history|>

<|current_file_content|>
current_file_path: shop/cart.py
"""Shopping cart: items, quantities and the checkout total."""

from __future__ import annotations

from dataclasses import dataclass, field

from shop.discounts import apply_discount
from shop.models import Item
from shop.tax import add_tax


@dataclass
class Cart:
    """A customer's cart; items keep the order they were added in."""

    items: list[Item] = field(default_factory=list)

    def add(self, item: Item) -> None:
        for existing in self.items:
            if existing.name == item.name:
                existing.quantity += item.quantity
                return
        self.items.append(item)

    def remove(self, name: str) -> None:
        self.items = [item for item in self.items if item.name != name]

    def count(self) -> int:
        """Number of units in the cart, not of distinct items."""
        return sum(item.quantity for item in self.items)

    def is_empty(self) -> bool:
        return not self.items

    def checkout_total(self, code: str | None = None) -> float:
        subtotal = sum(item.price * item.quantity for item in self.items)
        subtotal = apply_discount(subtotal, code)
<|code_to_edit|>
        <|cursor|>if total < 0:
            total = 0.0
        return add_tax(total)
<|/code_to_edit|>
<|/current_file_content|>
'''
