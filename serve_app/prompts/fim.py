"""Fill-in-the-middle prompts, by model family, from the tokenizer's own special tokens.

Like llama.cpp's ``format_prompt_infill``, this is only a prompt builder: the result is an
ordinary prompt that the engine completes. Two layouts (``FimLayout``, a per-model setting):

- ``psm``: ``<PRE>prefix<SUF>suffix<MID>``, the order most FIM docs show;
- ``spm``: ``<PRE><SUF>suffix<MID>prefix``, the FIM paper's suffix-first variant, which these
  models were also trained on. The text nearest the cursor is last, so a keystroke (the
  prefix grows, the suffix stays) changes only the prompt's last tokens and the prefix cache
  reuses everything before them; in ``psm`` every keystroke re-reads the whole suffix.
  ``bench/fim_quality.py`` measures both on the same cases (docs/fim.md).

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

from serve_app.config import FimLayout
from serve_app.errors import ContextLengthExceededError, InvalidRequestError
from serve_app.prompts.chat_encoding import encode_trusted, encode_untrusted

# Continue sends this literal suffix when there is nothing after the cursor.
EMPTY_SUFFIX_SPELLING = "<|endoftext|>"


FIM_LAYOUTS: tuple[FimLayout, ...] = ("psm", "spm")


@dataclass(frozen=True)
class FimFormat:
    name: str
    prefix: str
    suffix: str
    middle: str
    # Repo-level context markers; None when the format (or this tokenizer) has none.
    repo_name: str | None = None
    file_sep: str | None = None

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


def build_fim_prompt(
    fmt: FimFormat,
    tokenizer: Any,
    prompt: str,
    suffix: str,
    layout: FimLayout = "psm",
    max_tokens: int | None = None,
    context_length: int | None = None,
) -> list[int]:
    """Token ids of the FIM prompt for a client's ``prompt`` and ``suffix``, in ``layout``.

    The user's text is encoded with special tokens split, so code that happens to contain
    ``<|fim_middle|>`` cannot rewrite the prompt; only the client markers described in the
    module docstring become tokens. Repo-level context always comes first (it changes least).

    ``max_tokens``: the prompt's budget (the context less the answer's room). Text over it is
    ``ContextLengthExceededError`` (``param: prompt``; its message names ``context_length``,
    the model's, default ``max_tokens``), as the contract says, never cut: a
    client that wants a window sends one (Continue and Zed do), and a cut prompt would be read
    for minutes on a CPU for an answer the client did not ask for. Only text near the cursor
    is ever tokenised (as much as the budget holds), so a huge file is refused in the time
    the budget's worth of text takes to tokenise, not its size's.
    """
    context, prefix = split_repo_context(fmt, prompt)
    suffix = "" if suffix == EMPTY_SUFFIX_SPELLING else suffix
    if prompt[: len(prompt) - len(prefix)].endswith(fmt.prefix):
        prefix, suffix = read_client_template(fmt, prefix, suffix)
    pre, suf, mid = (encode_trusted(tokenizer, m) for m in (fmt.prefix, fmt.suffix, fmt.middle))
    # At least one token: a budget the answer ate whole is the engine's context error.
    room = None if max_tokens is None else max(1, max_tokens - len(pre + suf + mid))
    context_ids: list[int] = []
    for is_marker, text in context:
        context_ids += (encode_trusted if is_marker else encode_untrusted)(tokenizer, text)
    prefix_ids = _encode_near_cursor(tokenizer, prefix, room, keep_end=True)
    suffix_ids = _encode_near_cursor(tokenizer, suffix, room, keep_end=False)
    if room is not None and len(context_ids) + len(prefix_ids) + len(suffix_ids) > room:
        limit = context_length if context_length is not None else max_tokens
        raise ContextLengthExceededError.for_limit(limit, param="prompt")
    if layout == "spm":
        return context_ids + pre + suf + suffix_ids + mid + prefix_ids
    return context_ids + pre + prefix_ids + suf + suffix_ids + mid


def _encode_near_cursor(tokenizer: Any, text: str, limit: int | None, keep_end: bool) -> list[int]:
    """``text``'s tokens, or, when ``limit`` tokens cannot hold it, more than ``limit`` tokens
    of it nearest the cursor (its end for a prefix, its start for a suffix): windows of text
    twice as wide each time are tokenised until one holds that many."""
    if limit is None:
        return encode_untrusted(tokenizer, text)
    width = 8 * limit
    while True:
        window = text[-width:] if keep_end else text[:width]
        ids = encode_untrusted(tokenizer, window)
        if len(window) == len(text):
            return ids
        if len(ids) > limit:
            return ids
        width *= 2


def read_client_template(fmt: FimFormat, prefix: str, suffix: str) -> tuple[str, str]:
    """``(prefix, suffix)`` of a prompt that opened with the prefix marker.

    A client that writes the whole template (``P<SUF>S<MID>``, or suffix first,
    ``<SUF>S<MID>P``: each marker once, the middle marker ending it or the suffix marker
    opening it) gets it read as what it means. A template together with a ``suffix`` field is
    a 400: guessing which suffix was meant would complete the wrong text. Marker spellings in
    any other arrangement are the user's code (this very module, say), and stay plain text.
    """
    head, _, rest = prefix.partition(fmt.suffix)
    between, marker, tail = rest.partition(fmt.middle)
    once = all(m not in part for part in (head, between, tail) for m in (fmt.suffix, fmt.middle))
    if not (fmt.suffix in prefix and marker and once and not (head and tail)):
        return prefix, suffix
    if suffix:
        raise InvalidRequestError(
            f"The prompt is a whole FIM template (it holds {fmt.suffix.strip()} and "
            f"{fmt.middle.strip()}) and a suffix was sent too: send the text before the cursor "
            "as prompt and the text after it as suffix, without the model's markers.",
            param="suffix",
        )
    return head or tail, between


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
