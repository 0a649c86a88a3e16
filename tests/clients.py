"""Requests as the real clients build them and answers parsed as they parse them (clients.md).

Written from each client's documented behaviour, not copied from its code.
"""

from __future__ import annotations

import json

from tests.conftest import AUTH

# Continue's autocomplete stop list and headers.
CONTINUE_STOP = ["/src/", "#- coding: utf-8", "```", "\n\n", "\n \n"]
CONTINUE_HEADERS = {**AUTH, "Accept": "application/json"}


def tagged_apply(original: str, snippet: str) -> str:
    """The public service's apply format (ProxyAI sends it)."""
    return (
        f"<|original_code|>\n{original}\n<|/original_code|>\n\n"
        f"<|update_snippet|>\n{snippet}\n<|/update_snippet|>"
    )


def continue_apply_messages(original: str, edit: str) -> list[dict]:
    """Continue's apply: one user message and the assistant prefill "```\\n"."""
    user = (
        f"ORIGINAL CODE:\n```\n{original}\n```\n\nSUGGESTED EDIT:\n```\n{edit}\n```\n\n"
        "Apply the SUGGESTED EDIT to the ORIGINAL CODE. Output this as a complete code block."
    )
    return [{"role": "user", "content": user}, {"role": "assistant", "content": "```\n"}]


def continue_stream_texts(response) -> list[str]:
    """Continue's reader: `data:` lines are JSON; `error` throws; a missing `choices` throws;
    an empty `choices` is skipped; the text is `choices[0].text`."""
    texts = []
    for line in response.text.splitlines():
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:
            raise AssertionError(chunk["error"])
        if "choices" not in chunk:
            raise AssertionError(f"chunk without choices: {chunk}")
        if chunk["choices"]:
            texts.append(chunk["choices"][0]["text"])
    return texts


def sse_chunks(response) -> list[dict]:
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def updated_code(content: str) -> str:
    """ProxyAI's reader: what sits between the updated_code tags, trimmed."""
    start = content.index("<|updated_code|>") + len("<|updated_code|>")
    return content[start : content.index("<|/updated_code|>")].strip()


def continue_apply_text(response) -> str:
    """Continue's apply reader: delta.content, fence lines and <|updated_code|> lines dropped,
    reading stops at ``` or <|/updated_code|>."""
    text = "".join(
        chunk["choices"][0]["delta"].get("content") or ""
        for chunk in sse_chunks(response)
        if chunk["choices"]
    )
    kept = []
    for line in text.split("\n"):
        if line.startswith("<|/updated_code|>") or (kept and line.startswith("```")):
            break
        if line.startswith("```") or line.startswith("<|updated_code|>"):
            continue
        kept.append(line)
    return "\n".join(kept)


def kilo_stream(response) -> tuple[str, dict | None]:
    """Kilo Code's reader: `choices[0].delta.content`, else `choices[0].text`; usage if sent."""
    text, usage = "", None
    for chunk in sse_chunks(response):
        if chunk["choices"]:
            choice = chunk["choices"][0]
            text += (choice.get("delta") or {}).get("content") or choice.get("text") or ""
        usage = chunk.get("usage") or usage
    return text, usage


def code_lines(code: str) -> list[str]:
    """A file's non-blank lines: what a merge must keep (blank-line spacing aside)."""
    return [line.rstrip() for line in code.splitlines() if line.strip()]
