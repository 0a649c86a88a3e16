"""The instruct model's deployment (``EditModel``): next-edit, apply and chat on one engine.

Chat and apply live here rather than in deployments of their own because all three are
chat-template generation on the same instruct model: one copy of the weights serves them, and
they share one engine batch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from typing import Any

from deployments.common import EngineDeployment, usage_recorder
from deployments.replica_metrics import count_edit_rejection
from serve_app.api.apply import ApplyCompletionRequest
from serve_app.api.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionRequest
from serve_app.api.edit import EditCompletion, EditCompletionRequest
from serve_app.config import AppConfig
from serve_app.serving.apply import ApplyService
from serve_app.serving.billing import RequestContext
from serve_app.serving.chat import ChatService
from serve_app.serving.next_edit import NextEditService


class EditModel(EngineDeployment):
    """The instruct model's deployment (named for its first role, as the product fixes it):
    it serves next-edit, apply and chat, each through its own service on one engine."""

    deployment_name = "EditModel"
    engine_role = "edit"

    def __init__(self, config: AppConfig, auth: Any = None) -> None:
        client = self.start_engine_client(config)
        self.editor = NextEditService(client, on_rejected=count_edit_rejection)
        self.chatter = ChatService(client)
        self.applier = ApplyService(client)
        self.usage = usage_recorder(auth, config.limits.request_timeout_s, config)

    async def edit(self, body: EditCompletionRequest, context: RequestContext) -> EditCompletion:
        return await self.usage.run(context, partial(self.editor.complete, body))

    async def chat(self, body: ChatCompletionRequest, context: RequestContext) -> ChatCompletion:
        return await self.usage.run(context, partial(self.chatter.complete, body))

    async def chat_stream(
        self, body: ChatCompletionRequest, context: RequestContext
    ) -> AsyncIterator[ChatCompletionChunk]:
        async for chunk in self.usage.stream(context, partial(self.chatter.stream, body)):
            yield chunk

    async def apply(self, body: ApplyCompletionRequest, context: RequestContext) -> ChatCompletion:
        return await self.usage.run(context, partial(self.applier.complete, body))

    async def apply_stream(
        self, body: ApplyCompletionRequest, context: RequestContext
    ) -> AsyncIterator[ChatCompletionChunk]:
        async for chunk in self.usage.stream(context, partial(self.applier.stream, body)):
            yield chunk
