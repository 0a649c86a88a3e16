"""Chat messages for the instruct model that predicts the next edit, fitted to its context.

The model sees one canonical layout built from the parsed sections, whatever order the client
sent them in: recently viewed snippets, the file, the recent diffs, the region, the task.
"""

from __future__ import annotations

import keyword
import re
from typing import Any

from serve_app.engine.prompts.chat_encoding import encode_chat, encode_untrusted
from serve_app.engine.prompts.edit.parse import (
    CURSOR,
    EditPrompt,
    Snippet,
    region_without_cursor,
)
from serve_app.errors import ContextLengthExceededError

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
        parts.append("Recently viewed code:\n" + "\n".join(map(_shown_snippet, snippets)))
    parts.append(f"File {prompt.file_path}:\n{_fenced(prompt.file_text, language)}")
    diffs = prompt.diffs[drop_diffs:]
    if diffs:
        parts.append("Recent edits, oldest first:\n" + _fenced("\n".join(diffs), "diff"))
    parts.append(f"Region:\n{_fenced(prompt.region, language)}\n{_task(prompt, diffs)}")
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "\n\n".join(parts)},
    ]


def _shown_snippet(snippet: Snippet) -> str:
    return f"{snippet.path}:\n{_fenced(snippet.code, fence_language(snippet.path))}"


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


def _drop_plans(prompt: EditPrompt) -> list[tuple[int, int]]:
    """(snippets, diffs) to leave out, in the order tried: oldest snippets first (context the
    user merely looked at), then oldest diffs (the latest edits predict the next one best)."""
    plans = [(s, 0) for s in range(len(prompt.snippets) + 1)]
    return plans + [(len(prompt.snippets), d) for d in range(1, len(prompt.diffs) + 1)]


def fit_to_context(
    prompt: EditPrompt,
    tokenizer: Any,
    max_prompt_tokens: int,
    *,
    context_length: int | None = None,
) -> tuple[list[dict[str, str]], list[int]]:
    """Messages and prompt token ids that fit in ``max_prompt_tokens``: the smallest drop, in
    ``_drop_plans`` order, that fits. The file and the region are never cut. If even dropping
    everything does not fit, raise ``ContextLengthExceededError`` naming ``context_length``
    (the model's, for the message; defaults to ``max_prompt_tokens``).

    The whole prompt is tokenised once; when it is too long, each snippet and diff is
    tokenised once more on its own, and the length of every plan is estimated as the whole
    less what it drops. Tokens can merge across a piece's edges, so the estimate is only
    close: the plan it picks is confirmed by encoding it, then its neighbours are checked
    until one fits and the one before it does not (dropping more never lengthens the prompt).
    Usually two or three encodings of the prompt in all, however long the history.
    """
    plans = _drop_plans(prompt)
    encoded: dict[int, tuple[list[dict[str, str]], list[int]]] = {}

    def attempt(index: int) -> tuple[list[dict[str, str]], list[int]]:
        if index not in encoded:
            drop_snippets, drop_diffs = plans[index]
            messages = build_messages(prompt, drop_snippets=drop_snippets, drop_diffs=drop_diffs)
            encoded[index] = messages, encode_chat(tokenizer, messages)
        return encoded[index]

    def fits(index: int) -> bool:
        return len(attempt(index)[1]) <= max_prompt_tokens

    if fits(0):
        return attempt(0)
    index = _estimated_first_fit(prompt, tokenizer, plans, len(attempt(0)[1]), max_prompt_tokens)
    while not fits(index):
        if index == len(plans) - 1:
            limit = context_length if context_length is not None else max_prompt_tokens
            raise ContextLengthExceededError.for_limit(limit, param="messages")
        index += 1
    while index > 1 and fits(index - 1):
        index -= 1
    return attempt(index)


def _estimated_first_fit(
    prompt: EditPrompt, tokenizer: Any, plans: list[tuple[int, int]], full: int, budget: int
) -> int:
    """The first plan (after the first) whose estimated length fits; the last when none."""
    snippet_costs = [
        len(encode_untrusted(tokenizer, _shown_snippet(snippet) + "\n"))
        for snippet in prompt.snippets
    ]
    diff_costs = [len(encode_untrusted(tokenizer, diff + "\n")) for diff in prompt.diffs]
    for index, (drop_snippets, drop_diffs) in enumerate(plans[1:], start=1):
        saved = sum(snippet_costs[:drop_snippets]) + sum(diff_costs[:drop_diffs])
        if full - saved <= budget:
            return index
    return len(plans) - 1
