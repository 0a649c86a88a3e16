"""Next-edit prompts that are not a chat: one text the model continues.

Each layout is a list of pieces (roles ``MARKER``: a tokenizer special token named by its
``FimFormat`` field; ``TEXT``: plain text), which ``messages.encode_edit_prompt`` turns into
ids. Three layouts:

- ``fim``: the region is the hole of a fill-in-the-middle prompt (the untuned model's);
- ``sweep``: Sweep's next-edit layout, Qwen2.5-Coder's repository pretraining format (a
  ``<|file_sep|>`` and a path before each file): the snippets and the file as files, each diff
  as a ``.diff`` file of ``original:``/``updated:`` blocks (no diff syntax), then the region
  three times, ``original/`` (before the newest diff), ``current/`` (the cursor in it) and
  ``updated/``, which the model writes: the region rewritten, then its end token;
- ``zeta``: Zed's Zeta layout: an instruction, the diffs, the file with its editable region
  marked inline (the cursor in it), then ``### Response:``; the answer is the region rewritten
  and the region's end marker.

``sweep`` and ``zeta`` are for a model trained on them (``training.render``); their answer is
the region as plain text, read back by ``extract.read_answer``.
"""

from __future__ import annotations

from serve_app.prompts.next_edit.diffs import hunk_sides, shown_diff
from serve_app.prompts.next_edit.parse import CURSOR, EditPrompt, region_without_cursor

# Roles of the pieces: the service's own markers, named by their ``FimFormat`` field and
# spelled by the tokenizer's format, and text.
MARKER, TEXT = "marker", "text"

ZETA_REGION_START, ZETA_REGION_END = "<|editable_region_start|>", "<|editable_region_end|>"
ZETA_CURSOR = "<|user_cursor_is_here|>"
ZETA_INSTRUCTION = (
    "### Instruction:\nRewrite the editable region of the excerpt with the edit the programmer "
    "makes next, from their recent edits and the cursor.\n\n"
)
ZETA_RESPONSE = "### Response:\n"


def fim_pieces(prompt: EditPrompt) -> list[dict[str, str]]:
    """A repo-level FIM prompt whose hole is the region: each snippet as a file, the recent
    diffs as a file, then the current file with the region cut out. The model writes the
    region from what surrounds it and what the diffs did; it never sees the old region as
    such, so it cannot merely copy it."""
    pieces = _snippet_files(prompt)
    if prompt.diffs:
        pieces += [_marker("file_sep"), _text("recent_edits.diff\n" + "\n".join(prompt.diffs))]
        pieces.append(_text("\n"))
    return pieces + [
        _marker("file_sep"),
        _text(f"{prompt.file_path}\n"),
        _marker("prefix"),
        _text(prompt.file_before),
        _marker("suffix"),
        _text(prompt.file_after),
        _marker("middle"),
    ]


def sweep_pieces(prompt: EditPrompt, split_file: str) -> list[dict[str, str]]:
    """Sweep's layout (module docstring). ``split_file``: the file with its region cut out,
    as chat_split shows it, so that a keystroke in the region changes nothing before the
    diffs and a repeat re-reads only the newest diff and the region's blocks."""
    path = prompt.file_path
    pieces = _snippet_files(prompt) + [_marker("file_sep"), _text(f"{path}\n{split_file}\n")]
    for diff in prompt.diffs:
        blocks = "".join(
            f"original:\n{before}\nupdated:\n{after}\n" for before, after in hunk_sides(diff)
        )
        pieces += [_marker("file_sep"), _text(f"{_diff_path(diff, path)}.diff\n{blocks}")]
    current = region_without_cursor(prompt)
    original = before_newest_diff(current, prompt.diffs[-1]) if prompt.diffs else current
    return pieces + [
        _marker("file_sep"),
        _text(f"original/{path}\n{original.strip(chr(10))}\n"),
        _marker("file_sep"),
        _text(f"current/{path}\n{prompt.region.strip(chr(10))}\n"),
        _marker("file_sep"),
        _text(f"updated/{path}\n"),
    ]


def zeta_pieces(prompt: EditPrompt) -> list[dict[str, str]]:
    """Zeta's layout (module docstring): the file whole, the region's markers on lines of
    their own around it, so the model learns where its answer ends."""
    history = "".join(
        f'User edited "{_diff_path(diff, prompt.file_path)}":\n```diff\n{shown_diff(diff)}\n```\n\n'
        for diff in prompt.diffs
    )
    region = prompt.region.strip("\n").replace(CURSOR, ZETA_CURSOR)
    excerpt = (
        f"{prompt.file_before}{ZETA_REGION_START}\n{region}\n{ZETA_REGION_END}{prompt.file_after}"
    )
    return [
        _text(
            f"{ZETA_INSTRUCTION}### User Edits:\n\n{history}### User Excerpt:\n\n"
            f"```{prompt.file_path}\n{excerpt}\n```\n\n{ZETA_RESPONSE}{ZETA_REGION_START}\n"
        )
    ]


def plain_answer(expected: str, style: str) -> str:
    """What a model trained on ``sweep`` or ``zeta`` writes for the region ``expected``
    (before its end token)."""
    region = expected.strip("\n")
    return f"{region}\n{ZETA_REGION_END}" if style == "zeta" else region


def before_newest_diff(region: str, diff: str) -> str:
    """``region`` as it was before ``diff``, where each hunk's new side appears in it exactly
    once (a hunk elsewhere in the file leaves it as it is)."""
    for before, after in reversed(hunk_sides(diff)):
        if after and region.count(after) == 1:
            region = region.replace(after, before)
    return region


def _diff_path(diff: str, default: str) -> str:
    """The path a diff's ``+++`` header names (its ``b/`` dropped), else ``default``."""
    for line in diff.split("\n"):
        if line.startswith("+++ "):
            name = line[4:].split("\t")[0].strip()
            return name.removeprefix("b/") or default
    return default


def _snippet_files(prompt: EditPrompt) -> list[dict[str, str]]:
    pieces: list[dict[str, str]] = []
    for snippet in prompt.snippets:
        pieces += [_marker("file_sep"), _text(f"{snippet.path}\n{snippet.code}\n")]
    return pieces


def _marker(name: str) -> dict[str, str]:
    return {"role": MARKER, "content": name}


def _text(text: str) -> dict[str, str]:
    return {"role": TEXT, "content": text}
