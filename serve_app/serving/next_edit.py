"""Next-edit completions: parse the tagged prompt, generate, answer the rewritten region fenced."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from serve_app.api.common import CompletionUsage
from serve_app.api.edit import AssistantMessage, EditChoice, EditCompletion, EditCompletionRequest
from serve_app.engine.protocol import GenerationRequest
from serve_app.engine.startup import EDIT_ADAPTER
from serve_app.prompts.next_edit import (
    EditPromptStyle,
    EditRejection,
    answer_budget,
    answer_prefix,
    answer_stops,
    fence_region,
    fit_to_context,
    parse_edit_prompt,
    read_answer,
    shown_chars,
)
from serve_app.serving.billing import BilledCall
from serve_app.serving.engine_client import EngineClient
from serve_app.serving.envelope import completion, usage_of
from serve_app.serving.predictions import Prediction, Predictions

logger = logging.getLogger(__name__)


class NextEditService:
    """``style``: the prompt style (default: the model's ``edit_prompt``); ``on_rejected`` is
    told why an answer was replaced by "no change" (the deployment counts it in metrics);
    ``adapter``: the engine's LoRA adapter to answer with (default: the model's next-edit
    adapter where it has one).

    A request whose region has part of the account's last prediction for that file typed
    (``Predictions.followed``) gets that prediction again without the model: the user is
    typing it, so it is still the answer, and it comes at once instead of seconds later."""

    def __init__(
        self,
        client: EngineClient,
        style: EditPromptStyle | None = None,
        on_rejected: Callable[[EditRejection], None] | None = None,
        adapter: str | None = None,
    ) -> None:
        self.client = client
        self.style: EditPromptStyle = style or client.model.edit_prompt
        self.on_rejected = on_rejected or (lambda reason: None)
        self.predictions = Predictions()
        # The engine's adapter this service's requests run with: by default the model's
        # next-edit adapter, which the edit role's engine loaded (``role_adapters``).
        if adapter is None:
            adapter = EDIT_ADAPTER if client.model.edit_adapter else ""
        self.adapter = adapter

    async def complete(self, body: EditCompletionRequest, call: BilledCall) -> EditCompletion:
        # The prompt is parsed, then what the model would be shown (the file only as a window
        # around the region) is refused untokenised if it cannot fit the context; the rest is
        # tokenised (several times, while fitting). Both off the event loop: a prompt near the
        # body limit would otherwise stall every stream of this replica.
        prompt = await self.client.off_loop(parse_edit_prompt, body.content)
        self.client.check_input_size(shown_chars(prompt), "messages")
        params = body.to_sampling_params()
        context_length = self.client.model.context_length
        messages, prompt_ids = await self.client.off_loop(
            fit_to_context,
            prompt,
            self.client.tokenizer,
            max_prompt_tokens=context_length - params.max_tokens,
            context_length=context_length,
            style=self.style,
        )
        budget = await self.client.off_loop(answer_budget, prompt, self.client.tokenizer)
        params = dataclasses.replace(
            params,
            stop=answer_stops(prompt, messages, self.style),
            max_tokens=min(params.max_tokens, budget),
        )
        request: GenerationRequest = self.client.request(
            call, prompt_ids, params, "messages", route="edit", adapter=self.adapter
        )
        account = _account_key(call)
        followed = self.predictions.followed(account, prompt)
        if followed is not None and followed.completion_tokens <= params.max_tokens:
            return self._answer_followed(body, call, len(prompt_ids), followed)
        raw, last = await self.client.complete(call, request)
        # Off the event loop: the damage check parses the whole file (``prompts.next_edit.damage``).
        region, rejected = await self.client.off_loop(
            read_answer, answer_prefix(messages) + raw, prompt, last.finish_reason, self.style
        )
        if rejected is not None:
            logger.info("edit answer not an edit (%s); answering the region unchanged", rejected)
            self.on_rejected(rejected)
        self.predictions.remember(account, prompt, region, last.completion_tokens)
        choice = EditChoice(
            index=0,
            finish_reason=last.finish_reason or "stop",
            message=AssistantMessage(content=fence_region(region)),
        )
        # Zed sends the id back as feedback and checks that it starts with "cmpl-".
        return completion(EditCompletion, "cmpl", body.model, choice, usage_of(last))

    def _answer_followed(
        self, body: EditCompletionRequest, call: BilledCall, prompt_tokens: int, kept: Prediction
    ) -> EditCompletion:
        """``kept`` again, billed as a replayed answer is: the whole prompt as cached (nothing
        was read) and the prediction's tokens as its output."""
        call.meter.update(prompt_tokens, kept.completion_tokens)
        usage = CompletionUsage.from_counts(prompt_tokens, kept.completion_tokens, prompt_tokens)
        choice = EditChoice(
            index=0,
            finish_reason="stop",
            message=AssistantMessage(content=fence_region(kept.predicted)),
        )
        return completion(EditCompletion, "cmpl", body.model, choice, usage)


def _account_key(call: BilledCall) -> str:
    """Whose predictions a request may follow: its prefix-cache partition and its account
    (the partition alone is one for all accounts where the operator shares the cache)."""
    account = getattr(call.context.grant, "account_id", None)
    return f"{call.cache_salt}/{account}"
