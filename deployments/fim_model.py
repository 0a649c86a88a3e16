"""The FIM model deployment: one engine, JSON or streamed completions."""

from __future__ import annotations

from collections.abc import AsyncIterator

from deployments.common import EngineDeployment
from serve_app.api.fim import FimCompletion, FimCompletionChunk, FimCompletionRequest
from serve_app.config import AppConfig
from serve_app.serving.fim import FimService


class FimModel(EngineDeployment):
    deployment_name = "FimModel"

    def __init__(self, config: AppConfig) -> None:
        self.fim = FimService(self.start_generator(config, config.model(config.roles.fim)))

    async def complete(self, body: FimCompletionRequest) -> FimCompletion:
        return await self.fim.complete(body)

    async def stream(self, body: FimCompletionRequest) -> AsyncIterator[FimCompletionChunk]:
        async for chunk in self.fim.stream(body):
            yield chunk
