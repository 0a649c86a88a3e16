"""The FIM model deployment: one engine, JSON or streamed completions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from deployments.common import EngineDeployment, usage_recorder
from serve_app.api.fim import FimCompletion, FimCompletionChunk, FimCompletionRequest
from serve_app.config import AppConfig
from serve_app.serving.billing import RequestContext
from serve_app.serving.fim import FimService


class FimModel(EngineDeployment):
    deployment_name = "FimModel"
    engine_role = "fim"

    def __init__(self, config: AppConfig, auth: Any = None) -> None:
        self.fim = FimService(self.start_engine_client(config))
        self.usage = usage_recorder(auth, config.limits.request_timeout_s, config)

    async def complete(self, body: FimCompletionRequest, context: RequestContext) -> FimCompletion:
        return await self.usage.run(context, partial(self.fim.complete, body))

    async def stream(
        self, body: FimCompletionRequest, context: RequestContext
    ) -> AsyncIterator[FimCompletionChunk]:
        async for chunk in self.usage.stream(context, partial(self.fim.stream, body)):
            yield chunk
