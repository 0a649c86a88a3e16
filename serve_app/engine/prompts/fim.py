"""Fill-in-the-middle prompts, by model family, from the tokenizer's own special tokens.

Like llama.cpp's ``format_prompt_infill``, this is only a prompt builder: the result is an
ordinary prompt that the engine completes. PSM order (prefix, suffix, middle) throughout.

Real clients write some of the format's markers into their text (api-notes.md, "FIM — the
OpenAI-compatible path"), and those are read as what they mean:

- a leading prefix marker (Kilo Code sends ``"<|fim_prefix|>" + prefix``) is dropped, since
  the prompt gets its own;
- repo-level context at the very start (``<|repo_name|>name\n``, ``<|file_sep|>path\n``
  followed by that file's content; Continue sends ``<|file_sep|>dir/file\n<|fim_prefix|>``
  for a blank file) keeps its markers as real tokens, which is the model's own repo-level
  format: the context comes first, then the FIM prompt. Without a prefix marker, the text after
  the last context line is the prefix (the file being completed);
- a suffix of exactly ``<|endoftext|>`` (Continue's "no suffix") is an empty suffix.

Everything else, including marker spellings anywhere else in the code, stays plain text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from serve_app.engine.prompts.chat_encoding import encode_trusted, encode_untrusted
from serve_app.errors import InvalidRequestError

# Continue sends this literal suffix when there is nothing after the cursor.
EMPTY_SUFFIX_SPELLING = "<|endoftext|>"


@dataclass(frozen=True)
class FimFormat:
    name: str
    prefix: str
    suffix: str
    middle: str
    # Repo-level context markers; None when the format (or this tokenizer) has none.
    repo_name: str | None = None
    file_sep: str | None = None

    def render(self, prefix: str, suffix: str) -> str:
        return f"{self.prefix}{prefix}{self.suffix}{suffix}{self.middle}"

    @property
    def context_markers(self) -> tuple[str, ...]:
        return tuple(marker for marker in (self.repo_name, self.file_sep) if marker)


FIM_FORMATS = {
    "qwen": FimFormat(
        "qwen",
        "<|fim_prefix|>",
        "<|fim_suffix|>",
        "<|fim_middle|>",
        "<|repo_name|>",
        "<|file_sep|>",
    ),
    "starcoder": FimFormat(
        "starcoder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<reponame>", "<file_sep>"
    ),
    "deepseek": FimFormat("deepseek", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
    "codellama": FimFormat("codellama", "<PRE> ", " <SUF>", " <MID>"),
}

# Which format a model type uses when its tokenizer has the tokens for it.
MODEL_TYPE_FORMATS = {
    "qwen2": "qwen",
    "qwen3": "qwen",
    "starcoder2": "starcoder",
    "gpt_bigcode": "starcoder",
    "llama": "codellama",
}


def fim_format_for(tokenizer: Any, model_type: str = "") -> FimFormat:
    """The FIM format whose special tokens this tokenizer really has.

    The model type names the preferred family; the vocabulary decides, so a fine-tune that
    dropped the FIM tokens gets a clear error instead of a prompt it cannot understand.
    """
    preferred = MODEL_TYPE_FORMATS.get(model_type)
    candidates = [preferred] if preferred else []
    candidates += [name for name in FIM_FORMATS if name != preferred]
    vocab = tokenizer.get_vocab()
    for name in candidates:
        fmt = FIM_FORMATS[name]
        markers = [fmt.prefix.strip(), fmt.suffix.strip(), fmt.middle.strip()]
        if all(marker in vocab for marker in markers):
            return replace(
                fmt,
                repo_name=fmt.repo_name if fmt.repo_name in vocab else None,
                file_sep=fmt.file_sep if fmt.file_sep in vocab else None,
            )
    raise InvalidRequestError(
        f"This model (type {model_type or 'unknown'}) has no fill-in-the-middle tokens; "
        "use a code model with FIM support.",
        param="model",
    )


def build_fim_prompt(fmt: FimFormat, tokenizer: Any, prompt: str, suffix: str) -> list[int]:
    """Token ids of the FIM prompt for a client's ``prompt`` and ``suffix``.

    The user's text is encoded with special tokens split, so code that happens to contain
    ``<|fim_middle|>`` cannot rewrite the prompt; only the client markers described in the
    module docstring become tokens. Nothing is trimmed: a prompt over the context length is
    the client's to shorten (``context_length_exceeded``), not ours to cut silently.
    """
    context, prefix = split_repo_context(fmt, prompt)
    if suffix == EMPTY_SUFFIX_SPELLING:
        suffix = ""
    ids: list[int] = []
    for is_marker, text in context:
        ids += encode_trusted(tokenizer, text) if is_marker else encode_untrusted(tokenizer, text)
    return (
        ids
        + encode_trusted(tokenizer, fmt.prefix)
        + encode_untrusted(tokenizer, prefix)
        + encode_trusted(tokenizer, fmt.suffix)
        + encode_untrusted(tokenizer, suffix)
        + encode_trusted(tokenizer, fmt.middle)
    )


def split_repo_context(fmt: FimFormat, prompt: str) -> tuple[list[tuple[bool, str]], str]:
    """The repo-level context at the start of ``prompt`` as (is_marker, text) pieces, and the
    prefix that follows it (without a leading prefix marker)."""
    markers = fmt.context_markers
    if not markers or not prompt.startswith(markers):
        return [], prompt.removeprefix(fmt.prefix)
    at_prefix = prompt.find(fmt.prefix)
    if at_prefix >= 0:
        context, prefix = prompt[:at_prefix], prompt[at_prefix + len(fmt.prefix) :]
    else:
        # No prefix marker: the context ends with the line of its last marker (the path of
        # the file being completed); what follows is that file's text before the cursor.
        last = max(prompt.rfind(marker) for marker in markers)
        line_end = prompt.find("\n", last)
        cut = len(prompt) if line_end < 0 else line_end + 1
        context, prefix = prompt[:cut], prompt[cut:]
    pattern = "(" + "|".join(re.escape(marker) for marker in markers) + ")"
    pieces = [(piece in markers, piece) for piece in re.split(pattern, context) if piece]
    return pieces, prefix
