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
from serve_app.serving.generation import Generator, usage_of

logger = logging.getLogger(__name__)


class EditService:
    def __init__(self, generator: Generator) -> None:
        self.generator = generator

    async def complete(self, body: EditCompletionRequest) -> EditCompletion:
        # Parsed and tokenised (several times, while fitting) off the event loop: a prompt near
        # the body limit would otherwise stall every stream of this replica.
        prompt = await self.generator.off_loop(parse_edit_prompt, body.content)
        params = body.to_sampling_params()
        context_length = self.generator.model.context_length
        _, prompt_ids = await self.generator.off_loop(
            fit_to_context,
            prompt,
            self.generator.tokenizer,
            max_prompt_tokens=context_length - params.max_tokens,
            context_length=context_length,
        )
        request: GenerationRequest = self.generator.request(
            prompt_ids, params, "messages", role="edit"
        )
        raw, last = await self.generator.complete(request)
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
