"""What a request may cost, reserved before any work, and the refund of what it did not use.

The router admits a request through the auth service with ``estimate_tokens`` as the
reservation; the model deployment's ledger row (``billing``) settles it to what the request
processed. A request refused or dropped before a row could be written has its reservation
given back by ``Refunds``, in a detached task, so a cancelled request still sends it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from serve_app.api.apply import ApplyCompletionRequest
from serve_app.api.chat import DEFAULT_CHAT_MAX_TOKENS, ChatCompletionRequest
from serve_app.api.decisions import DecisionRequest
from serve_app.config import AppConfig, ModelConfig
from serve_app.prompts.decisions import fixed_prefix_token_bound
from serve_app.serving.billing import detached

logger = logging.getLogger(__name__)

# Tokens a prompt template may add beyond the request's own text (per question for decisions).
TEMPLATE_TOKENS = 64


def estimate_tokens(config: AppConfig, body: Any, body_bytes: int) -> int:
    """An upper bound on what the request may cost: each prompt token is at least one byte
    of the body (byte-level BPE), plus the tokens templates add, plus the most output it may
    ask for. Settled to the actual count by the ledger row."""
    model_id = getattr(body, "model", None)
    served = {model.id for model in config.models}
    model = config.model(model_id) if model_id in served else None
    questions = len(getattr(body, "questions", None) or ())
    prompt = body_bytes + TEMPLATE_TOKENS * (1 + questions)
    if isinstance(body, DecisionRequest):
        # Decisions are not bounded by the context but by their scoring budget, and the
        # fixed system turn and examples count in full in their usage.
        prompt += fixed_prefix_token_bound()
        return min(prompt, config.limits.decision_max_scored_tokens)
    if model is not None:
        prompt = min(prompt, model.context_length)
    return prompt + max_output_tokens(body, model)


def max_output_tokens(body: Any, model: ModelConfig | None) -> int:
    """The most output tokens a request may produce: its max_tokens, else the default the
    model deployment applies (chat, apply), else none (decisions score, they do not generate)."""
    asked = getattr(body, "max_completion_tokens", None) or getattr(body, "max_tokens", None)
    if asked:
        return int(asked)
    if isinstance(body, ChatCompletionRequest) and model is not None:
        return min(DEFAULT_CHAT_MAX_TOKENS, model.max_output_length)
    if isinstance(body, ApplyCompletionRequest) and model is not None:
        return min(model.max_output_length, model.context_length)  # apply's default: all left
    return 0


class Refunds:
    """Gives back reservations no ledger row may have settled. ``release``: the auth
    service's release call (a handle method); each runs detached (``billing.detached``), so
    a cancelled request still sends it, and a failed one is logged."""

    def __init__(self, release: Any) -> None:
        self._release = release
        self._detached: set[asyncio.Future] = set()

    def refund(self, grant: Any) -> None:
        if getattr(grant, "reservation_id", None) is None:
            return
        task = detached(self._send(grant))
        self._detached.add(task)
        task.add_done_callback(self._done)

    async def _send(self, grant: Any) -> Any:
        # called inside the task: outside the request's context (``detached``), so Serve
        # does not cancel it with the request
        return await self._release.remote(grant)

    def _done(self, task: asyncio.Future) -> None:
        self._detached.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.warning("could not release a reservation: %r", task.exception())
