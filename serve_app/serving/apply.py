"""Apply completions: the model merges the snippet; the merge is checked before it is sent."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from serve_app.api.apply import DEFAULT_APPLY_MAX_TOKENS, ApplyCompletionRequest
from serve_app.api.chat import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChatResponseMessage,
)
from serve_app.api.common import CompletionUsage, new_id, now
from serve_app.engine.prompts.apply import (
    ApplyInput,
    clean_model_output,
    keeps_untouched,
    merge_snippet,
    parse_apply_request,
    wrap_updated,
)
from serve_app.engine.prompts.chat_encoding import encode_chat
from serve_app.errors import MergeFailedError
from serve_app.serving.billing import BilledCall
from serve_app.serving.generation import EngineClient, chunk_maker, usage_of

logger = logging.getLogger(__name__)

# The model answers in the ``` block it was prefilled with; its end is the end of the code.
MODEL_STOPS = ("\n```",)


class ApplyService:
    def __init__(self, client: EngineClient) -> None:
        self.client = client

    async def merge(
        self, body: ApplyCompletionRequest, call: BilledCall
    ) -> tuple[str, CompletionUsage]:
        """The answer's content and the usage of the model call; a merge that is sent is
        always whole, so its finish reason is "stop". Text that cannot fit is refused unread;
        parsing, tokenising and the merge check (line diffs, quadratic in the worst case) run
        off the event loop, as chat's and edit's do."""
        self.client.check_input_size(len(body.content), "messages")
        applied = await self.client.off_loop(parse_apply_request, body.content)
        prompt_ids = await self.client.off_loop(
            encode_chat, self.client.tokenizer, applied.messages(), continue_final_message=True
        )
        max_tokens = self.client.default_max_tokens(prompt_ids, DEFAULT_APPLY_MAX_TOKENS)
        params = body.to_sampling_params(max_tokens, MODEL_STOPS)
        request = self.client.request(call, prompt_ids, params, prompt_param="messages")
        text, last = await self.client.complete(call, request)
        merged = await self.client.off_loop(_checked_merge, applied, text, last.finish_reason)
        return wrap_updated(merged), usage_of(last)

    async def complete(self, body: ApplyCompletionRequest, call: BilledCall) -> ChatCompletion:
        content, usage = await self.merge(body, call)
        choice = ChatChoice(
            index=0, message=ChatResponseMessage(content=content), finish_reason="stop"
        )
        return ChatCompletion(
            id=new_id("chatcmpl"), created=now(), model=body.model, choices=[choice], usage=usage
        )

    async def stream(
        self, body: ApplyCompletionRequest, call: BilledCall
    ) -> AsyncIterator[ChatCompletionChunk]:
        """The chat stream's shape. The merge is checked as a whole before anything is sent,
        so the content arrives after generation, line by line."""
        chunk = chunk_maker(ChatCompletionChunk, "chatcmpl", body.model)
        content, usage = await self.merge(body, call)
        yield chunk([ChatChunkChoice(index=0, delta=ChatDelta(role="assistant", content=""))])
        for line in content.splitlines(keepends=True):
            yield chunk([ChatChunkChoice(index=0, delta=ChatDelta(content=line))])
        yield chunk([ChatChunkChoice(index=0, delta=ChatDelta(), finish_reason="stop")])
        yield chunk([], usage)


def _checked_merge(applied: ApplyInput, text: str, finish_reason: str | None) -> str:
    """The model's merge if it keeps the original code, else the anchored merge. A cut-off or
    lossy merge is never sent: clients write the answer over the whole file."""
    merged = clean_model_output(text)
    if finish_reason == "stop" and keeps_untouched(applied.original, applied.snippet, merged):
        return merged
    anchored = merge_snippet(applied.original, applied.snippet)
    if anchored is None:
        raise MergeFailedError(param="messages")
    logger.info("apply: the model's merge lost code; answering the anchored merge")
    return anchored
