"""The edit model deployment: next-edit rewriting, and chat on the same instruct model.

Chat lives here rather than in a deployment of its own because both are chat-template
generation on the same instruct model: one copy of the weights serves both, and both share
one engine batch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from deployments.common import replica_cpus
from deployments.fim_model import model_deployment_options
from serve_app.api.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionRequest
from serve_app.api.edit import EditCompletion, EditCompletionRequest
from serve_app.config import AppConfig
from serve_app.serving.chat import ChatService
from serve_app.serving.edit import EditService
from serve_app.serving.generation import Generator, start_engine


class EditModel:
    def __init__(self, config: AppConfig) -> None:
        model = config.model(config.roles.edit)
        self.engine = start_engine(config, model, cpus=replica_cpus())
        generator = Generator(self.engine, model)
        self.editor = EditService(generator)
        self.chatter = ChatService(generator)

    async def edit(self, body: EditCompletionRequest) -> EditCompletion:
        return await self.editor.complete(body)

    async def chat(self, body: ChatCompletionRequest) -> ChatCompletion:
        return await self.chatter.complete(body)

    async def chat_stream(self, body: ChatCompletionRequest) -> AsyncIterator[ChatCompletionChunk]:
        async for chunk in self.chatter.stream(body):
            yield chunk

    def check_health(self) -> None:
        self.engine.check_health()

    def __del__(self) -> None:
        if hasattr(self, "engine"):
            self.engine.shutdown()

    @staticmethod
    def get_deployment_options(config: AppConfig) -> dict[str, Any]:
        return model_deployment_options("EditModel", config)
