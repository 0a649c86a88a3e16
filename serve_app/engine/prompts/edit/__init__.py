"""Next-edit prompts: parse the tagged user message (``parse``), build the instruct model's
chat messages and fit them to its context (``messages``), read the answer back (``extract``)."""

from serve_app.engine.prompts.edit.extract import extract_edited_region, fence_region
from serve_app.engine.prompts.edit.messages import build_messages, fit_to_context, recent_renames
from serve_app.engine.prompts.edit.parse import (
    CURSOR,
    EditPrompt,
    Snippet,
    parse_edit_prompt,
    region_without_cursor,
    render_edit_prompt,
    split_diffs,
)

__all__ = [
    "CURSOR",
    "EditPrompt",
    "Snippet",
    "build_messages",
    "extract_edited_region",
    "fence_region",
    "fit_to_context",
    "parse_edit_prompt",
    "recent_renames",
    "region_without_cursor",
    "render_edit_prompt",
    "split_diffs",
]
