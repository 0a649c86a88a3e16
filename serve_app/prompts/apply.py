"""Apply: merge an update snippet into original code (POST /v1/apply/completions).

Two request layouts are read (clients.md): the public service's tagged one (ProxyAI)

    <|original_code|>\\n{code}\\n<|/original_code|>\\n\\n
    <|update_snippet|>\\n{snippet}\\n<|/update_snippet|>

and Continue's fenced one (a user message
``ORIGINAL CODE:\\n```\\n{code}\\n```\\n\\nSUGGESTED EDIT:\\n```\\n{edit}\\n```...``
and an assistant prefill, ignored).
The snippet shows the changed code; lines such as ``// ... existing code ...`` (in any comment
syntax) stand for unchanged code left out.

The merge itself is ``serve_app.apply`` (docs/apply.md): deterministic where every chunk of
the snippet lands in one place; this module's prompt asks the model only when one does not,
and the model's answer passes the same check.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from serve_app.errors import InvalidRequestError

UPDATED_OPEN, UPDATED_CLOSE = "<|updated_code|>", "<|/updated_code|>"
_TAGS = ("<|original_code|>", "<|/original_code|>", "<|update_snippet|>", "<|/update_snippet|>")
_CONTINUE = re.compile(
    r"ORIGINAL CODE:\n```[^\n]*\n(.*?)\n?```\n\nSUGGESTED EDIT:\n```[^\n]*\n", re.S
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
