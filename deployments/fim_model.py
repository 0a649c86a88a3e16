"""The FIM model deployment: one engine, JSON or streamed completions."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from deployments.common import replica_cpus
from serve_app.api.fim import FimCompletion, FimCompletionChunk, FimCompletionRequest
from serve_app.config import AppConfig
from serve_app.serving.fim import FimService
from serve_app.serving.generation import Generator, start_engine


class FimModel:
    def __init__(self, config: AppConfig) -> None:
        model = config.model(config.roles.fim)
        self.engine = start_engine(config, model, cpus=replica_cpus())
        self.fim = FimService(Generator(self.engine, model))

    async def complete(self, body: FimCompletionRequest) -> FimCompletion:
        return await self.fim.complete(body)

    async def stream(self, body: FimCompletionRequest) -> AsyncIterator[FimCompletionChunk]:
        async for chunk in self.fim.stream(body):
            yield chunk

    def check_health(self) -> None:
        self.engine.check_health()

    def __del__(self) -> None:
        if hasattr(self, "engine"):
            self.engine.shutdown()

    @staticmethod
    def get_deployment_options(config: AppConfig) -> dict[str, Any]:
        return model_deployment_options("FimModel", config)


def model_deployment_options(name: str, config: AppConfig) -> dict[str, Any]:
    """Defaults for a generating deployment: admit a full batch, queue a little, then 503."""
    batch = config.engine.max_batch_size
    return {
        "name": name,
        "max_ongoing_requests": 2 * batch,
        "max_queued_requests": 4 * batch,
        "autoscaling_config": {
            "min_replicas": 1,
            "max_replicas": 2,
            "target_ongoing_requests": batch,
        },
        "ray_actor_options": {"num_cpus": 1},
        "health_check_period_s": 10,
    }
