"""Next-edit completions: parse the tagged prompt, generate, answer the rewritten region fenced."""

from __future__ import annotations

import logging

from serve_app.api.common import new_id, now
from serve_app.api.edit import AssistantMessage, EditChoice, EditCompletion, EditCompletionRequest
from serve_app.engine.prompts.edit import (
    extract_edited_region,
    fence_region,
    fit_to_context,
    parse_edit_prompt,
)
from serve_app.engine.protocol import GenerationRequest
from serve_app.serving.billing import BilledCall
from serve_app.serving.generation import EngineClient, usage_of

logger = logging.getLogger(__name__)


class EditService:
    def __init__(self, client: EngineClient) -> None:
        self.client = client

    async def complete(self, body: EditCompletionRequest, call: BilledCall) -> EditCompletion:
        # Text that cannot fit the context is refused unread; the rest is parsed and tokenised
        # (several times, while fitting) off the event loop: a prompt near the body limit
        # would otherwise stall every stream of this replica.
        self.client.check_input_size(len(body.content), "messages")
        prompt = await self.client.off_loop(parse_edit_prompt, body.content)
        params = body.to_sampling_params()
        context_length = self.client.model.context_length
        _, prompt_ids = await self.client.off_loop(
            fit_to_context,
            prompt,
            self.client.tokenizer,
            max_prompt_tokens=context_length - params.max_tokens,
            context_length=context_length,
        )
        request: GenerationRequest = self.client.request(
            call, prompt_ids, params, "messages", role="edit"
        )
        raw, last = await self.client.complete(call, request)
        region, usable = extract_edited_region(raw, prompt)
        if not usable:
            logger.info("edit model returned nothing usable; answering the region unchanged")
        return EditCompletion(
            # Zed sends the id back as feedback and checks that it starts with "cmpl-".
            id=new_id("cmpl"),
            created=now(),
            model=body.model,
            choices=[
                EditChoice(
                    index=0,
                    finish_reason=last.finish_reason or "stop",
                    message=AssistantMessage(content=fence_region(region)),
                )
            ],
            usage=usage_of(last),
        )
