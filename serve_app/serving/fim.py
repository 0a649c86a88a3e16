"""FIM completions: prompt from the model's FIM tokens, then plain generation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from serve_app.api.fim import (
    FimChoice,
    FimChunkChoice,
    FimCompletion,
    FimCompletionChunk,
    FimCompletionRequest,
)
from serve_app.engine.protocol import GenerationChunk, GenerationRequest
from serve_app.grammar.token_bytes import TokenTexts
from serve_app.prompts.fim import FimFormat, FimLayout, build_fim_prompt, fim_format_for
from serve_app.prompts.healing import heal_cursor
from serve_app.serving.billing import BilledCall
from serve_app.serving.engine_client import EngineClient
from serve_app.serving.envelope import chunk_maker, completion, usage_of


class FimService:
    def __init__(self, client: EngineClient) -> None:
        self.client = client
        loaded = client.loaded
        self.format = fim_format_for(loaded.tokenizer, loaded.model_type)

    async def _request(self, body: FimCompletionRequest, call: BilledCall) -> GenerationRequest:
        """Tokenise off the event loop (text over the context is refused unread:
        ``build_fim_prompt``); a cursor inside a word is healed (spm only)."""
        model = self.client.model
        self.client.check_input_size(len(body.prompt) + len(body.suffix or ""), "prompt")
        params = body.to_sampling_params(model.default_temperature)
        prompt_ids, answer_prefix = await self.client.off_loop(
            service_fim_prompt,
            self.format,
            self.client.tokenizer,
            body.prompt,
            body.suffix or "",
            model.fim_layout,
            model.context_length - params.max_tokens,
            model.fim_token_healing,
            model.context_length,
        )
        return self.client.request(
            call, prompt_ids, params, "prompt", route="fim", answer_prefix=answer_prefix
        )

    async def complete(self, body: FimCompletionRequest, call: BilledCall) -> FimCompletion:
        text, last = await self.client.complete(call, await self._request(body, call))
        choice = FimChoice(index=0, text=text, finish_reason=last.finish_reason or "stop")
        return completion(FimCompletion, "cmpl", body.model, choice, usage_of(last))

    async def stream(
        self, body: FimCompletionRequest, call: BilledCall
    ) -> AsyncIterator[FimCompletionChunk]:
        """Content chunks, then always one usage chunk (the router drops it unless asked)."""
        request = await self._request(body, call)
        chunk = chunk_maker(FimCompletionChunk, "cmpl", body.model)
        async with aclosing(
            self.client.stream_chunks(call, request, chunk, _text_choice)
        ) as pieces:
            async for piece in pieces:
                yield piece


def service_fim_prompt(
    fmt: FimFormat,
    tokenizer: Any,
    prompt: str,
    suffix: str,
    layout: FimLayout,
    max_tokens: int | None,
    token_healing: bool,
    context_length: int | None = None,
) -> tuple[list[int], str]:
    """What the FIM service asks the engine: ``(prompt_ids, answer_prefix)``, the prompt of
    ``build_fim_prompt`` healed at the cursor where the layout allows it (``spm``)."""
    ids = build_fim_prompt(fmt, tokenizer, prompt, suffix, layout, max_tokens, context_length)
    if layout != "spm" or not token_healing:
        return ids, ""
    return heal_cursor(TokenTexts.for_tokenizer(tokenizer), ids, prompt)


def _text_choice(piece: GenerationChunk) -> FimChunkChoice:
    return FimChunkChoice(index=0, text=piece.text, finish_reason=piece.finish_reason)
