"""What a request may cost, reserved before any work, and the refund of what it did not use.

The router admits a request through the auth service with its route's estimate
(``generation_tokens``, ``decision_tokens``) as the reservation; the model deployment's ledger
row (``billing``) settles it to what the request processed. A request refused or dropped
before a row could be written has its reservation given back by ``Refunds``, in a detached
task, so a cancelled request still sends it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from serve_app.config import AppConfig, ModelConfig
from serve_app.prompts.decisions import fixed_prefix_token_bound
from serve_app.serving.billing import detached

logger = logging.getLogger(__name__)

# Tokens a prompt template may add beyond the request's own text (per question for decisions).
TEMPLATE_TOKENS = 64


def generation_tokens(config: AppConfig, body: Any, body_bytes: int) -> int:
    """An upper bound on what a generating request may cost: each prompt token is at least one
    byte of the body (byte-level BPE), plus the tokens its template adds, within the model's
    context, plus the most output it may ask for (its wire model's ``output_token_bound``).
    Settled to the actual count by the ledger row."""
    model = _served(config, body.model)
    if model is None:  # refused for its model before any reservation matters
        return body_bytes + TEMPLATE_TOKENS + body.output_token_bound(0, 0)
    prompt = min(body_bytes + TEMPLATE_TOKENS, model.context_length)
    return prompt + body.output_token_bound(model.max_output_length, model.context_length)


def decision_tokens(config: AppConfig, body: Any, body_bytes: int) -> int:
    """A decision's bound: bounded not by the context but by the scoring budget, with the
    fixed system turn and examples counted in full, as its usage counts them."""
    prompt = body_bytes + TEMPLATE_TOKENS * (1 + len(body.questions)) + fixed_prefix_token_bound()
    return min(prompt, config.limits.decision_max_scored_tokens)


def _served(config: AppConfig, model_id: str) -> ModelConfig | None:
    served = {model.id for model in config.models}
    return config.model(model_id) if model_id in served else None


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
