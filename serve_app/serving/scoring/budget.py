"""Bounded work per decision request, and cooperative cancellation.

A decision request may carry 64 questions of 255 labels each on a state of any size the body
limit allows. Two limits keep one request from holding the scorer for minutes:

- ``max_input_bytes``: the UTF-8 size of the state plus every question's text, checked
  before any tokenisation (tokenising megabytes costs seconds by itself);
- ``max_scored_tokens``: tokens the request would run through the model (the shared prompt,
  every question's own tokens and every option-trie node), counted before any forward pass,
  whatever the prefix cache holds, so the answer does not depend on what ran before.

Beyond either, the scorer answers 422 naming the limit and its value. Cancellation is the
engine's: a cancelled caller aborts its scoring request, which stops within one decoder
layer's work (``LLMEngine.score``).
"""

from __future__ import annotations

from dataclasses import dataclass

from serve_app.errors import UnprocessableRequestError

DEFAULT_MAX_SCORED_TOKENS = 65_536


@dataclass(frozen=True)
class DecisionBudget:
    """Per-request limits. ``max_input_bytes`` ``None``: 8 bytes per context token, at least
    64 KiB (a text that long is past the context on any tokenizer but a pathological one)."""

    max_scored_tokens: int = DEFAULT_MAX_SCORED_TOKENS
    max_input_bytes: int | None = None

    def input_bytes_limit(self, context_length: int) -> int:
        return self.max_input_bytes or max(8 * context_length, 64 * 1024)

    def check_input_bytes(self, size: int, context_length: int) -> None:
        limit = self.input_bytes_limit(context_length)
        if size > limit:
            raise UnprocessableRequestError(
                f"The state and questions are {size} bytes of text; the limit "
                f"(max_input_bytes) is {limit} bytes per decision request.",
                param="state",
            )

    def check_scored_tokens(self, tokens: int) -> None:
        if tokens > self.max_scored_tokens:
            raise UnprocessableRequestError(
                f"This request would score {tokens} tokens (state, questions and options); "
                f"the limit (max_scored_tokens) is {self.max_scored_tokens} per decision "
                "request. Send fewer questions or labels per request.",
                param="questions",
            )


@dataclass
class WorkDone:
    """Tokens run and answer tokens read so far (what a cancelled request is billed)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
