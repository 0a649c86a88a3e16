"""Prompts for the instruct model that predicts the next edit, fitted to its context.

The model sees one canonical layout built from the parsed sections, whatever order the client
sent them in, in one of several styles (``EditPromptStyle``; which one a model gets is its
``edit_prompt`` setting, chosen by bench/next_edit.py). Every style puts what stays the same
while the user types first (instructions, examples, snippets, the file) and what changes with
each keystroke last (the newest diff, the region with its cursor), so a repeat request reads
only its changed tail past the prefix cache.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import keyword
import re
from typing import Any, get_args

from serve_app.config import EditPromptStyle
from serve_app.errors import ContextLengthExceededError
from serve_app.prompts.chat_encoding import encode_chat, encode_trusted, encode_untrusted
from serve_app.prompts.fim import FimFormat, fim_format_for
from serve_app.prompts.next_edit.diffs import shown_diff
from serve_app.prompts.next_edit.parse import (
    CURSOR,
    FILE,
    FILE_PATH_PREFIX,
    HISTORY,
    REGION,
    SNIPPET,
    SNIPPET_PATH_PREFIX,
    SNIPPETS,
    EditPrompt,
    Snippet,
    closing,
    opening,
    region_without_cursor,
)
from serve_app.prompts.next_edit.plain import (
    MARKER,
    TEXT,
    ZETA_REGION_END,
    fim_pieces,
    sweep_pieces,
    zeta_pieces,
)
from serve_app.prompts.next_edit.recut import recut
from serve_app.prompts.next_edit.span import shown_region
from serve_app.prompts.next_edit.window import file_window

# chat: an instruction (system prompt, the sections as markdown, the task last);
# chat_split: chat, the file shown with its region cut out (``REGION_PLACEHOLDER``);
# tagged: the client's tagged sections as one user message, nothing added;
# few_shot: chat, after two worked examples, the answer's fence prefilled;
# fim: no chat at all: the region is the hole of a fill-in-the-middle prompt;
# chat_span: chat_split, the region's lines numbered, the answer only the lines it changes
# (``span``: for a model trained on it, the next-edit adapter);
# sweep, zeta: the layouts of Sweep's and Zed's next-edit models, not a chat (``plain``), for
# a model trained on them.
PROMPT_STYLES: tuple[str, ...] = get_args(EditPromptStyle)

# What a prefilled answer starts with; it ends at the closing fence.
ANSWER_FENCE = "```\n"
PREFILLED_STOPS = ("\n```",)
# Tokens an answer may add beyond twice the region's (``answer_budget``).
ANSWER_ROOM = 96
# chat_split's file shows this line where the region is. A keystroke in the region then
# changes nothing before the diffs, so a repeat request matches the cached prompt up to the
# newest diff and re-reads only that diff, the region and the task; with the region inline,
# it re-reads from the keystroke's place in the file on. One fixed line of prose, code in no
# language, that points at the "Region:" section. ("[region: shown below]" scored a little
# higher on bench/next_edit.py, docs/next_edit_log.md, but left the rename in Zed's request of
# tests/test_clients_edit.py undone; the other four wordings tried there all made it.)
REGION_PLACEHOLDER = "(the region, shown below, goes here)"
# Fragments of the service's own wording in a prompt (``_task``, ``REGION_PLACEHOLDER``), never
# request text: an answer holding one that the request did not send copied the instructions
# into the code (checks.py: ``instruction_echo``).
INSTRUCTION_PHRASES = (
    "rewrite the region",
    "finish the code at",
    "keep the other lines",
    "as the recent edits did",
    REGION_PLACEHOLDER,
)

SYSTEM_PROMPT = (
    "You predict a programmer's next code edit. You are shown the current file, the "
    "programmer's recent edits as diffs, and a region of the file that contains the cursor. "
    "Rewrite the region to make the edit the programmer is most likely to make next: continue "
    "the recent edits and finish the code at the cursor. Keep the other lines of the region as "
    "they are. Reply with only the rewritten region in one ``` code block, no explanations."
)
SPAN_SYSTEM_PROMPT = (
    "You predict a programmer's next code edit. You are shown the current file, the "
    "programmer's recent edits as diffs, and a region of the file, its lines numbered, that "
    "contains the cursor. Write the edit the programmer is most likely to make next in the "
    "region: a line `@@ FIRST,COUNT` (the COUNT lines from line FIRST are replaced; 0 inserts "
    "before FIRST), then the new lines, nothing else. Write nothing if the region needs no edit."
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
    prompt: EditPrompt,
    *,
    style: EditPromptStyle = "chat",
    drop_snippets: int = 0,
    drop_diffs: int = 0,
) -> list[dict[str, str]]:
    """The prompt for ``prompt`` in ``style``: chat messages (a last ``assistant`` message is
    the start of the answer, continued by the model), or for ``fim``, ``sweep`` and ``zeta``
    the pieces of a plain prompt (``plain``); ``encode_edit_prompt`` turns either into ids.

    The file is shown as a window of lines around the region (``window``), and
    ``drop_snippets``/``drop_diffs`` leave out that many of the oldest snippets/diffs (used by
    ``fit_to_context``). Empty sections are left out, to keep the prompt short.
    """
    if style == "chat_span":  # the region as its trained examples are cut (``recut``)
        prompt = recut(prompt).shown
    shown = dataclasses.replace(
        file_window(prompt),
        snippets=prompt.snippets[drop_snippets:],
        diffs=prompt.diffs[drop_diffs:],
    )
    if style == "fim":
        return fim_pieces(shown)
    if style == "sweep":
        return sweep_pieces(shown, _split_file(shown))
    if style == "zeta":
        return zeta_pieces(shown)
    if style == "tagged":
        return [{"role": "user", "content": _tagged(shown)}]
    if style == "chat_span":
        return [
            {"role": "system", "content": SPAN_SYSTEM_PROMPT},
            {"role": "user", "content": _instruction(shown, split=True, span=True)},
        ]
    if style == "few_shot":
        return [
            {"role": "system", "content": SYSTEM_PROMPT},
            *_EXAMPLE_TURNS,
            {"role": "user", "content": _instruction(shown)},
            {"role": "assistant", "content": ANSWER_FENCE},
        ]
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": _instruction(shown, split=style == "chat_split")},
    ]


def _instruction(prompt: EditPrompt, *, split: bool = False, span: bool = False) -> str:
    """The user message of the chat styles: snippets, the file, the diffs, the region with its
    cursor, then what to do. What comes last weighs most for a 0.5B model, which otherwise
    copies the region unchanged; so the closing line names the renames the diffs made that the
    region still lacks (``recent_renames``), when there are any. The file is shown plain: with
    the region marked in it, the model tended to echo the file. The diffs are cut to what the
    file does not show (``diffs.shown_diff``). ``split``: the file without
    its region, ``REGION_PLACEHOLDER`` in its place (chat_split); ``span``: the region's lines
    numbered, and the task asks for the changed lines only (chat_span)."""
    language = fence_language(prompt.file_path)
    parts = []
    if prompt.snippets:
        parts.append(_snippets_section([_shown_snippet(s) for s in prompt.snippets]))
    file = _split_file(prompt) if split else prompt.file_text
    parts.append(f"File {prompt.file_path}:\n{_fenced(file, language)}")
    if prompt.diffs:
        parts.append(_history_section([shown_diff(diff) for diff in prompt.diffs]))
    region = shown_region(prompt.region, CURSOR) if span else prompt.region
    task = _task(prompt, prompt.diffs, span=span)
    parts.append(f"Region:\n{_fenced(region, language)}\n{task}")
    return "\n\n".join(parts)


def _split_file(prompt: EditPrompt) -> str:
    """The file with its region cut out and ``REGION_PLACEHOLDER`` in its place."""
    return prompt.file_before + REGION_PLACEHOLDER + prompt.file_after


def _snippets_section(shown: list[str]) -> str:
    return "Recently viewed code:\n" + "\n".join(shown)


def _history_section(shown: list[str]) -> str:
    return "Recent edits, oldest first:\n" + _fenced("\n".join(shown), "diff")


def _tagged(prompt: EditPrompt) -> str:
    """The sections as the clients tag them, in the order Continue and Zed send them (snippets,
    file, history: the history changes most often, so it comes last)."""
    snippets = "".join(
        f"{opening(SNIPPET)}\n{SNIPPET_PATH_PREFIX} {snippet.path}\n{snippet.code}\n"
        f"{closing(SNIPPET)}\n"
        for snippet in prompt.snippets
    )
    region = f"{opening(REGION)}\n{prompt.region}\n{closing(REGION)}"
    after = prompt.file_after.removeprefix("\n")
    diffs = "".join(f"{diff}\n" for diff in prompt.diffs)
    return (
        f"{opening(SNIPPETS)}\n{snippets}{closing(SNIPPETS)}\n"
        f"{opening(FILE)}\n{FILE_PATH_PREFIX} {prompt.file_path}\n{prompt.file_before}{region}\n"
        f"{after}{closing(FILE)}\n"
        f"{opening(HISTORY)}\n{diffs}{closing(HISTORY)}\n"
    )


def encode_edit_prompt(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Token ids of what ``build_messages`` built: chat messages under the chat template (a
    final assistant message continued, not closed), or FIM pieces with markers as the
    tokenizer's own special tokens and all request text as plain text."""
    if messages and messages[0]["role"] in (MARKER, TEXT):
        fim = _fim_format(tokenizer)
        ids: list[int] = []
        for piece in messages:
            if piece["role"] == MARKER:
                ids += encode_trusted(tokenizer, getattr(fim, piece["content"]) or "")
            else:
                ids += encode_untrusted(tokenizer, piece["content"])
        return ids
    prefilled = messages[-1]["role"] == "assistant"
    return encode_chat(tokenizer, messages, continue_final_message=prefilled)


@functools.cache
def _fim_format(tokenizer: Any) -> FimFormat:
    """The tokenizer's FIM format, found once: it reads the whole vocabulary."""
    return fim_format_for(tokenizer)


def answer_prefix(messages: list[dict[str, str]]) -> str:
    """The text the model's answer continues (a prefilled fence), for reading the answer."""
    return messages[-1]["content"] if messages[-1]["role"] == "assistant" else ""


def answer_budget(prompt: EditPrompt, tokenizer: Any) -> int:
    """The most tokens a rewrite of the region needs: twice the region, plus room for new
    lines. An answer is the region rewritten; past this the model is not rewriting it (it
    repeats, or explains), and the answer would be cut off anyway (``checks``: cut_off), so
    a request never waits for the client's max_tokens (4096 from Continue) to run out."""
    region = encode_untrusted(tokenizer, region_without_cursor(prompt))
    return 2 * len(region) + ANSWER_ROOM


def answer_stops(
    prompt: EditPrompt, messages: list[dict[str, str]], style: EditPromptStyle
) -> tuple[str, ...]:
    """Where an answer ends, besides the model's end token: a prefilled fenced answer at its
    closing fence; a FIM answer where it starts writing the file's next line of code (the
    hole is filled, and the model goes on through the suffix it was shown); zeta's at the
    region's end marker, unless the region holds that text itself (``read_answer`` then cuts
    the answer at the marker after the region's own)."""
    if answer_prefix(messages):
        return PREFILLED_STOPS
    if style == "zeta":
        return () if ZETA_REGION_END in prompt.region else (ZETA_REGION_END,)
    if style == "fim":
        after = next((line for line in prompt.file_after.split("\n") if line.strip()), None)
        return ("\n" + after,) if after else ()
    return ()


def _shown_snippet(snippet: Snippet) -> str:
    return f"{snippet.path}:\n{_fenced(snippet.code, fence_language(snippet.path))}"


def _task(prompt: EditPrompt, diffs: list[str], *, span: bool = False) -> str:
    renames = recent_renames(diffs, region_without_cursor(prompt))
    lead = "Write the region's next edit" if span else "Rewrite the region"
    if not renames:
        rest = "" if span else " and keep the other lines"
        return f"{lead}: finish the code at {CURSOR}{rest}."
    pairs = " and ".join(f"`{old}` to `{new}`" for old, new in renames)
    return f"{lead}: rename {pairs} in it, as the recent edits did."


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
    style: EditPromptStyle = "chat",
) -> tuple[list[dict[str, str]], list[int]]:
    """Messages (in ``style``) and prompt token ids that fit in ``max_prompt_tokens``: the
    smallest drop, in ``_drop_plans`` order, that fits. The file's window (``window``) and the
    region are never cut. If even dropping everything does not fit, raise
    ``ContextLengthExceededError`` naming ``context_length`` (the model's, for the message;
    defaults to ``max_prompt_tokens``).

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
            messages = build_messages(
                prompt, style=style, drop_snippets=drop_snippets, drop_diffs=drop_diffs
            )
            encoded[index] = messages, encode_edit_prompt(tokenizer, messages)
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
    snippets = [_shown_snippet(snippet) for snippet in prompt.snippets]
    snippets_saved = _drop_savings(tokenizer, snippets, _snippets_section(snippets))
    diffs = [shown_diff(diff) for diff in prompt.diffs]
    diffs_saved = _drop_savings(tokenizer, diffs, _history_section(diffs))
    for index, (drop_snippets, drop_diffs) in enumerate(plans[1:], start=1):
        saved = snippets_saved[drop_snippets] + diffs_saved[drop_diffs]
        if full - saved <= budget:
            return index
    return len(plans) - 1


def _drop_savings(tokenizer: Any, pieces: list[str], section: str) -> list[int]:
    """Tokens saved by dropping the oldest d of a section's ``pieces``, d = 0..all: the
    pieces' own tokens, and once all go, the whole ``section`` with its header and joins.
    Each piece is encoded once (a history of thousands of diffs stays linear)."""
    costs = [len(encode_untrusted(tokenizer, piece + "\n")) for piece in pieces]
    saved = list(itertools.accumulate(costs, initial=0))
    if pieces:
        saved[-1] = len(encode_untrusted(tokenizer, section))
    return saved


# Two worked examples for ``few_shot``, written for it (no bench case is among them): the
# edit carries on what the diff started, every other line of the region stays as it was.
_EXAMPLES = (
    (
        EditPrompt(
            file_path="client.py",
            file_before=(
                "import requests\n\n\nclass Client:\n    def __init__(self, base_url):\n"
                "        self.base_url = base_url\n\n    def get(self, path, timeout=10):\n"
            ),
            region=f"        url = self.base_url + path\n        {CURSOR}return requests.get(url)",
            file_after=(
                "\n\n    def delete(self, path):\n        url = self.base_url + path\n"
                "        return requests.delete(url)\n"
            ),
            diffs=[
                "--- a/client.py\n+++ b/client.py\n@@ -7,3 +7,3 @@\n \n"
                "-    def get(self, path):\n+    def get(self, path, timeout=10):\n"
                "         url = self.base_url + path"
            ],
        ),
        "        url = self.base_url + path\n        return requests.get(url, timeout=timeout)",
    ),
    (
        EditPrompt(
            file_path="src/format.ts",
            file_before="export function formatPrice(value: number, currency: string): string {\n",
            region=(
                f"  const rounded = Math.round({CURSOR}amount * 100) / 100;\n"
                "  return `${rounded.toFixed(2)} ${currency}`;"
            ),
            file_after="\n}\n",
            diffs=[
                "--- a/src/format.ts\n+++ b/src/format.ts\n@@ -1,3 +1,3 @@\n"
                "-export function formatPrice(amount: number, currency: string): string {\n"
                "+export function formatPrice(value: number, currency: string): string {\n"
                "   const rounded = Math.round(amount * 100) / 100;"
            ],
        ),
        "  const rounded = Math.round(value * 100) / 100;\n"
        "  return `${rounded.toFixed(2)} ${currency}`;",
    ),
)
_EXAMPLE_TURNS = [
    turn
    for example, answer in _EXAMPLES
    for turn in (
        {"role": "user", "content": _instruction(example)},
        {"role": "assistant", "content": f"{ANSWER_FENCE}{answer}\n```"},
    )
]
