"""Apply completions: the deterministic merge where every chunk lands in one place, else the
model (drafting from the original, role ``apply``); either answer is checked before it is sent
(``serve_app.apply``, docs/apply.md)."""

from __future__ import annotations

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
from serve_app.api.common import CompletionUsage
from serve_app.apply.check import check_merge
from serve_app.apply.placement import Plan, plan_update
from serve_app.errors import MergeFailedError
from serve_app.prompts.apply import clean_model_output, parse_apply_request, wrap_updated
from serve_app.prompts.chat_encoding import encode_chat
from serve_app.serving.billing import BilledCall
from serve_app.serving.engine_client import EngineClient
from serve_app.serving.envelope import chunk_maker, completion, usage_of

# The model answers in the ``` block it was prefilled with; its end is the end of the code.
MODEL_STOPS = ("\n```",)
ANSWER_SLACK_TOKENS = 64
# The model rewrites the whole file: past this it takes minutes on a CPU replica, past the
# request timeout (bench/apply.py's large files, docs/apply.md), so the chunk is refused.
MODEL_MAX_PROMPT_TOKENS = 3072


class ApplyService:
    def __init__(self, client: EngineClient) -> None:
        self.client = client

    async def merge(
        self, body: ApplyCompletionRequest, call: BilledCall
    ) -> tuple[str, CompletionUsage]:
        """The answer's content and its usage; a merge that is sent is always whole, so its
        finish reason is "stop". Text that cannot fit is refused unread; parsing, placing,
        tokenising and the check run off the event loop, as chat's and edit's do."""
        self.client.check_input_size(len(body.content), "messages")
        applied = await self.client.off_loop(parse_apply_request, body.content)
        plan = await self.client.off_loop(plan_update, applied.original, applied.snippet)
        prompt_ids = await self.client.off_loop(
            encode_chat, self.client.tokenizer, applied.messages(), continue_final_message=True
        )
        if plan.is_certain:
            merged = await self.client.off_loop(_checked, plan, plan.merged())
            return wrap_updated(merged), await self._deterministic_usage(call, prompt_ids, merged)
        if len(prompt_ids) > MODEL_MAX_PROMPT_TOKENS:
            raise MergeFailedError(
                f"{plan.problem()} The file is too long for the model to place it "
                f"({len(prompt_ids)} tokens; at most {MODEL_MAX_PROMPT_TOKENS}).",
                param="messages",
            )
        # The merge is about as long as the original and the update, which the prompt holds: a
        # model that loops stops there (and fails the check) instead of at the context's end.
        cap = min(DEFAULT_APPLY_MAX_TOKENS, len(prompt_ids) + ANSWER_SLACK_TOKENS)
        max_tokens = self.client.default_max_tokens(prompt_ids, cap)
        params = body.to_sampling_params(max_tokens, MODEL_STOPS)
        request = self.client.request(
            call, prompt_ids, params, prompt_param="messages", route="apply"
        )
        text, last = await self.client.complete(call, request)
        if last.finish_reason != "stop":
            raise MergeFailedError(
                f"{plan.problem()} The model's merge was cut off at max_tokens.", param="messages"
            )
        merged = await self.client.off_loop(_checked, plan, clean_model_output(text), True)
        return wrap_updated(merged), usage_of(last)

    async def _deterministic_usage(
        self, call: BilledCall, prompt_ids: list[int], merged: str
    ) -> CompletionUsage:
        """A merge without the model is billed as the model's would be: the prompt it would
        have read and the tokens of the answer (the price does not depend on the path)."""
        answer = await self.client.off_loop(self.client.tokenizer.encode, merged)
        call.meter.update(len(prompt_ids), len(answer))
        return CompletionUsage.from_counts(len(prompt_ids), len(answer), 0)

    async def complete(self, body: ApplyCompletionRequest, call: BilledCall) -> ChatCompletion:
        content, usage = await self.merge(body, call)
        choice = ChatChoice(
            index=0, message=ChatResponseMessage(content=content), finish_reason="stop"
        )
        return completion(ChatCompletion, "chatcmpl", body.model, choice, usage)

    async def stream(
        self, body: ApplyCompletionRequest, call: BilledCall
    ) -> AsyncIterator[ChatCompletionChunk]:
        """The chat stream's shape. The merge is checked as a whole before anything is sent,
        so the content arrives after generation, line by line."""
        chunk = chunk_maker(ChatCompletionChunk, "chatcmpl", body.model)
        content, usage = await self.merge(body, call)
        # Every chunk carries the whole usage: the work was done before the first was sent.
        yield chunk(
            [ChatChunkChoice(index=0, delta=ChatDelta(role="assistant", content=""))], usage
        )
        for line in content.splitlines(keepends=True):
            yield chunk([ChatChunkChoice(index=0, delta=ChatDelta(content=line))], usage)
        yield chunk([ChatChunkChoice(index=0, delta=ChatDelta(), finish_reason="stop")], usage)
        yield chunk([], usage)


def _checked(plan: Plan, merged: str, by_model: bool = False) -> str:
    """``merged`` once it passes the check; a failure of the model's merge also says why the
    model was asked (the chunk the anchors could not place)."""
    try:
        check_merge(plan, merged)
    except MergeFailedError as failed:
        if not by_model:
            raise
        raise MergeFailedError(
            f"{plan.problem()} The model's merge failed the check: {failed.message}",
            param="messages",
        ) from failed
    return merged
