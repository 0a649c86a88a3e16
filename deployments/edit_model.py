"""The edit model deployment: next-edit rewriting, apply, and chat on the same instruct model.

Chat and apply live here rather than in deployments of their own because all three are
chat-template generation on the same instruct model: one copy of the weights serves them, and
they share one engine batch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from deployments.common import EngineDeployment
from serve_app.api.apply import ApplyCompletionRequest
from serve_app.api.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionRequest
from serve_app.api.edit import EditCompletion, EditCompletionRequest
from serve_app.config import AppConfig
from serve_app.serving.apply import ApplyService
from serve_app.serving.chat import ChatService
from serve_app.serving.edit import EditService


class EditModel(EngineDeployment):
    deployment_name = "EditModel"

    def __init__(self, config: AppConfig) -> None:
        generator = self.start_generator(config, config.model(config.roles.edit))
        self.editor = EditService(generator)
        self.chatter = ChatService(generator)
        self.applier = ApplyService(generator)

    async def edit(self, body: EditCompletionRequest) -> EditCompletion:
        return await self.editor.complete(body)

    async def chat(self, body: ChatCompletionRequest) -> ChatCompletion:
        return await self.chatter.complete(body)

    async def chat_stream(self, body: ChatCompletionRequest) -> AsyncIterator[ChatCompletionChunk]:
        async for chunk in self.chatter.stream(body):
            yield chunk

    async def apply(self, body: ApplyCompletionRequest) -> ChatCompletion:
        return await self.applier.complete(body)

    async def apply_stream(
        self, body: ApplyCompletionRequest
    ) -> AsyncIterator[ChatCompletionChunk]:
        async for chunk in self.applier.stream(body):
            yield chunk
