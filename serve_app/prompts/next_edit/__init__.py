"""Next-edit prompts: parse the tagged user message (``parse``), build the instruct model's
chat messages, or a plain prompt (``plain``), showing the file as a window around the region
(``window``), and fit them to its context (``messages``), read the answer back (``extract``)."""

from serve_app.prompts.next_edit.checks import EditRejection, rejected_edit
from serve_app.prompts.next_edit.extract import extract_edited_region, fence_region, read_answer
from serve_app.prompts.next_edit.messages import (
    PROMPT_STYLES,
    EditPromptStyle,
    answer_budget,
    answer_prefix,
    answer_stops,
    build_messages,
    encode_edit_prompt,
    fit_to_context,
    recent_renames,
)
from serve_app.prompts.next_edit.parse import (
    CURSOR,
    EditPrompt,
    Snippet,
    parse_edit_prompt,
    region_without_cursor,
    render_edit_prompt,
    split_diffs,
)
from serve_app.prompts.next_edit.window import file_window, shown_chars

__all__ = [
    "CURSOR",
    "PROMPT_STYLES",
    "EditPrompt",
    "EditRejection",
    "EditPromptStyle",
    "answer_budget",
    "answer_prefix",
    "answer_stops",
    "Snippet",
    "build_messages",
    "encode_edit_prompt",
    "extract_edited_region",
    "fence_region",
    "file_window",
    "fit_to_context",
    "parse_edit_prompt",
    "read_answer",
    "recent_renames",
    "region_without_cursor",
    "rejected_edit",
    "render_edit_prompt",
    "shown_chars",
    "split_diffs",
]
