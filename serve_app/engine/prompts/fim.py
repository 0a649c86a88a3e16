"""Fill-in-the-middle prompts, by model family, from the tokenizer's own special tokens.

Like llama.cpp's ``format_prompt_infill``, this is only a prompt builder: the result is an
ordinary prompt that the engine completes. PSM order (prefix, suffix, middle) throughout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from serve_app.errors import InvalidRequestError


@dataclass(frozen=True)
class FimFormat:
    name: str
    prefix: str
    suffix: str
    middle: str

    def render(self, prefix: str, suffix: str) -> str:
        return f"{self.prefix}{prefix}{self.suffix}{suffix}{self.middle}"


FIM_FORMATS = {
    "qwen": FimFormat("qwen", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
    "starcoder": FimFormat("starcoder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
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
            return fmt
    raise InvalidRequestError(
        f"This model (type {model_type or 'unknown'}) has no fill-in-the-middle tokens; "
        "use a code model with FIM support.",
        param="model",
    )


def build_fim_prompt(fmt: FimFormat, tokenizer: Any, prefix: str, suffix: str) -> list[int]:
    """Token ids of the FIM prompt.

    The user's text is encoded with special tokens split, so code that happens to contain
    ``<|fim_middle|>`` cannot rewrite the prompt. Nothing is trimmed: a prompt over the context
    length is the client's to shorten (``context_length_exceeded``), not ours to cut silently.
    """

    def marker(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    def user_text(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)

    return (
        marker(fmt.prefix)
        + user_text(prefix)
        + marker(fmt.suffix)
        + user_text(suffix)
        + marker(fmt.middle)
    )
