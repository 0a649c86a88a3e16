"""FIM completions: prompt from the model's FIM tokens, then plain generation."""

from __future__ import annotations

from collections.abc import AsyncIterator

from serve_app.api.common import CompletionUsage, new_id, now
from serve_app.api.fim import (
    FimChoice,
    FimChunkChoice,
    FimCompletion,
    FimCompletionChunk,
    FimCompletionRequest,
)
from serve_app.engine.prompts.fim import build_fim_prompt, fim_format_for
from serve_app.engine.protocol import GenerationRequest
from serve_app.serving.generation import Generator, usage_of


class FimService:
    def __init__(self, generator: Generator) -> None:
        self.generator = generator
        loaded = generator.loaded
        self.format = fim_format_for(loaded.tokenizer, loaded.model_type)

    async def _request(self, body: FimCompletionRequest) -> GenerationRequest:
        """Bound, then tokenise off the event loop."""
        suffix = body.suffix or ""
        self.generator.check_input_size(len(body.prompt) + len(suffix), "prompt")
        prompt_ids = await self.generator.off_loop(
            build_fim_prompt, self.format, self.generator.tokenizer, body.prompt, suffix
        )
        params = body.to_sampling_params(self.generator.model.default_temperature)
        return self.generator.request(prompt_ids, params, prompt_param="prompt", role="fim")

    async def complete(self, body: FimCompletionRequest) -> FimCompletion:
        text, last = await self.generator.complete(await self._request(body))
        return FimCompletion(
            id=new_id("cmpl"),
            created=now(),
            model=body.model,
            choices=[FimChoice(index=0, text=text, finish_reason=last.finish_reason or "stop")],
            usage=usage_of(last),
        )

    async def stream(self, body: FimCompletionRequest) -> AsyncIterator[FimCompletionChunk]:
        """Content chunks, then always one usage chunk (the router drops it unless asked)."""
        request = await self._request(body)
        completion_id, created = new_id("cmpl"), now()

        def chunk(choices: list[FimChunkChoice], usage=None) -> FimCompletionChunk:
            return FimCompletionChunk(
                id=completion_id, created=created, model=body.model, choices=choices, usage=usage
            )

        async for piece in self.generator.stream_then_usage(request):
            if isinstance(piece, CompletionUsage):
                yield chunk([], piece)
            else:
                choice = FimChunkChoice(index=0, text=piece.text, finish_reason=piece.finish_reason)
                yield chunk([choice])
