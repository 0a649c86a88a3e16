"""An example as the served model sees it: the request a client sends, then the prompt and
answer tokens the edit service would build from it. Training and serving share one path
(``parse_edit_prompt``, ``build_messages``, ``encode_edit_prompt``), so an adapter learns
exactly the prompt it will be asked."""

from __future__ import annotations

import difflib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from serve_app.prompts.chat_encoding import encode_untrusted
from serve_app.prompts.next_edit.extract import fence_region, model_answer
from serve_app.prompts.next_edit.messages import (
    EditPromptStyle,
    build_messages,
    encode_edit_prompt,
)
from serve_app.prompts.next_edit.parse import CURSOR, parse_edit_prompt, region_without_cursor

REGION_OPEN, REGION_CLOSE = "<|code_to_edit|>", "<|/code_to_edit|>"
IGNORED = -100  # a label the loss skips: prompt tokens teach nothing


class EditContext(Protocol):
    """What the editor knows: ``EditExample`` and the tests' ``Scenario`` both are one."""

    path: str
    file: str
    cursor: tuple[int, int]
    first_line: int
    last_line: int
    snippets: Sequence[Sequence[str]]
    hunks: Sequence[str]


def tagged_file(context: EditContext) -> str:
    """The whole file, the cursor inline, the region's tags on lines of their own."""
    lines = context.file.split("\n")
    row, column = context.cursor
    lines[row] = lines[row][:column] + CURSOR + lines[row][column:]
    first, last = context.first_line, context.last_line
    return "\n".join(
        [*lines[:first], REGION_OPEN, *lines[first : last + 1], REGION_CLOSE, *lines[last + 1 :]]
    )


def tagged_snippets(context: EditContext) -> str:
    return "\n".join(
        f"<|recently_viewed_code_snippet|>\ncode_snippet_file_path: {path}\n{code}\n"
        "<|/recently_viewed_code_snippet|>"
        for path, code in context.snippets
    )


def tagged_request(context: EditContext, diff_separator: str = "\n") -> str:
    """The user message in the contract's tagged layout, as Continue builds it: snippets, the
    file, then the diffs (jsdiff patches without their Index and === lines), oldest first."""
    diffs = diff_separator.join(
        f"--- {context.path}\n+++ {context.path}\n{hunk}" for hunk in context.hunks
    )
    return (
        f"<|recently_viewed_code_snippets|>\n{tagged_snippets(context)}\n"
        "<|/recently_viewed_code_snippets|>\n\n"
        f"<|current_file_content|>\ncurrent_file_path: {context.path.rsplit('/', 1)[-1]}\n"
        f"{tagged_file(context)}\n<|/current_file_content|>\n\n"
        f"<|edit_diff_history|>\n{diffs}\n<|/edit_diff_history|>\n"
    )


@dataclass(frozen=True)
class TrainingPair:
    """One example's tokens: the prompt then the answer (``ids``), the answer's tokens again
    as ``labels`` (``IGNORED`` under the prompt), and which labels write a change."""

    ids: list[int]
    labels: list[int]
    changed: list[bool]  # per position of ``labels``: the token writes changed text


def training_pair(
    context: EditContext, expected: str, tokenizer: Any, style: EditPromptStyle
) -> TrainingPair | None:
    """One example: the served prompt in ``style``, then the answer the service reads as
    ``expected`` (``model_answer``: the region in a plain fence, or the changed span) and the
    end of the turn. Only the answer's tokens carry labels. None where the prompt cannot
    show the edit (``chat_span``: lines more than two below the cursor's line, 617 of the
    6,399 mined training edits)."""
    request = parse_edit_prompt(tagged_request(context))
    answer_text = model_answer(expected, request, style)
    if answer_text is None:
        return None
    prompt = encode_edit_prompt(tokenizer, build_messages(request, style=style))
    answer = encode_untrusted(tokenizer, answer_text) + [tokenizer.eos_token_id]
    marked = changed_characters(region_without_cursor(request), expected, answer_text)
    changed = [False] * len(prompt) + tokens_touching(answer[:-1], marked, tokenizer) + [False]
    return TrainingPair(prompt + answer, [IGNORED] * len(prompt) + answer, changed)


def changed_characters(region: str, expected: str, answer_text: str) -> list[bool]:
    """Per character of ``answer_text``: does it write what the edit changed? The lines of
    ``expected`` that replace or add to the region's, and where lines were deleted, the
    first character that copying them would write otherwise. An answer that
    is not the region written out, fenced or plain (a span), is all change."""
    if answer_text == fence_region(expected):
        start = answer_text.index("\n") + 1  # after the fence's opening line
    elif expected.strip("\n") and answer_text.startswith(expected.strip("\n")):
        start, region, expected = 0, region.strip("\n"), expected.strip("\n")  # plain
    else:
        return [True] * len(answer_text)
    marked = [False] * len(answer_text)
    old, new = region.split("\n"), expected.split("\n")
    line_starts = [0]
    for line in new:
        line_starts.append(line_starts[-1] + len(line) + 1)
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, deleted_from, deleted_to, first, last in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            for at in range(start + line_starts[first], start + line_starts[last]):
                marked[min(at, len(marked) - 1)] = True
        elif tag == "delete":  # where copying the region would write the deleted line
            kept = "\n".join(new[first:])
            copied = "\n".join([*old[deleted_from:deleted_to], *new[first:]])
            at = start + line_starts[first] + len(os.path.commonprefix([kept, copied]))
            marked[min(at, len(marked) - 1)] = True
    return marked


def tokens_touching(ids: list[int], marked: list[bool], tokenizer: Any) -> list[bool]:
    """Per token: does its text cover a marked character? A token's characters are what it
    adds to the decoded text of the few tokens before it (a character split across tokens
    decodes whole only once its last byte comes), so the offsets are the text's own."""
    touching, end = [], 0
    for count in range(1, len(ids) + 1):
        window = ids[max(0, count - 8) : count]
        added = len(tokenizer.decode(window)) - len(tokenizer.decode(window[:-1]))
        start, end = end, end + max(0, added)
        touching.append(any(marked[start:end]))
    return touching


def pack(pairs: list[TrainingPair]) -> dict[str, Any]:
    """``pairs`` as a few flat tensors: an answer's labels are the tail of its ids."""
    starts = [pair.labels.index(next(t for t in pair.labels if t != IGNORED)) for pair in pairs]
    for pair, start in zip(pairs, starts, strict=True):
        assert pair.labels[start:] == pair.ids[start:] and set(pair.labels[:start]) == {IGNORED}
    return {
        "ids": torch.tensor([t for pair in pairs for t in pair.ids], dtype=torch.int32),
        "changed": torch.tensor([c for pair in pairs for c in pair.changed], dtype=torch.bool),
        "lengths": torch.tensor([len(pair.ids) for pair in pairs]),
        "starts": torch.tensor(starts),
    }


def unpack(packed: dict[str, Any]) -> list[TrainingPair]:
    ids, changed = packed["ids"].tolist(), packed["changed"].tolist()
    pairs, offset = [], 0
    for length, start in zip(packed["lengths"].tolist(), packed["starts"].tolist(), strict=True):
        row = ids[offset : offset + length]
        labels = [IGNORED] * start + row[start:]
        pairs.append(TrainingPair(row, labels, changed[offset : offset + length]))
        offset += length
    return pairs
