"""Chat completions through the model's chat template (OpenAI shapes)."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import AsyncIterator
from contextlib import aclosing

from serve_app.api.chat import (
    DEFAULT_CHAT_MAX_TOKENS,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatDelta,
    ChatResponseMessage,
)
from serve_app.engine.constraints import RESPONSE_FORMAT_SCHEMA, compile_schema, validate_output
from serve_app.engine.protocol import GenerationChunk, GenerationRequest, ToolCallFormat
from serve_app.engine.tool_call_grammar import NO_PARAMETERS, call_grammar
from serve_app.errors import UpstreamBadResponseError
from serve_app.grammar.matcher import GrammarTokenizer
from serve_app.grammar.schema import ANY_OBJECT_SCHEMA
from serve_app.prompts.chat_encoding import encode_chat
from serve_app.serving.billing import BilledCall
from serve_app.serving.engine_client import EngineClient
from serve_app.serving.envelope import chunk_maker, completion, usage_of
from serve_app.serving.tool_calls import CallStream, split_calls, template_tools, tool_format

logger = logging.getLogger(__name__)


class ChatService:
    def __init__(self, client: EngineClient) -> None:
        self.client = client

    async def _request(self, body: ChatCompletionRequest, call: BilledCall) -> GenerationRequest:
        """Bound, then tokenise (and compile the schema) off the event loop."""
        calls = tool_format(body, self.client.tokenizer)
        tools = template_tools(body)
        messages = [message.to_template() for message in body.messages]
        if body.json_mode is not None:
            messages = [{"role": "system", "content": json_instruction(body)}, *messages]
        # First: a schema over a cap is named, whatever the prompt's size; then the engine's
        # compile of the same grammars is a lookup, and the request's matcher a copy.
        await self.client.off_loop(self._prepare_grammars, body, calls)
        chars = sum(len(message["content"]) for message in messages)
        chars += len(json.dumps(tools)) if tools else 0
        self.client.check_input_size(chars, "messages")
        # Message contents are encoded as plain text (a user cannot write turn markers), on a
        # worker thread: a long conversation must not stall the replica's other streams.
        prompt_ids = await self.client.off_loop(
            functools.partial(encode_chat, tools=tools), self.client.tokenizer, messages
        )
        max_tokens = self.client.default_max_tokens(prompt_ids, DEFAULT_CHAT_MAX_TOKENS)
        params = body.to_sampling_params(default_max_tokens=max_tokens, tool_calls=calls)
        return self.client.request(call, prompt_ids, params, prompt_param="messages", route="chat")

    def _prepare_grammars(self, body: ChatCompletionRequest, calls: ToolCallFormat | None) -> None:
        """Check what the answer decodes under (``SchemaError`` names the schema's field) and
        build its matchers' templates, off the event loop."""
        grammars = []
        if body.json_mode is not None:
            schema = requested_schema(body) or ANY_OBJECT_SCHEMA
            grammars.append(compile_schema(schema, RESPONSE_FORMAT_SCHEMA))
        if calls is not None and body.tools:
            for index, tool in enumerate(body.tools):
                parameters = tool.function.parameters or NO_PARAMETERS
                compile_schema(parameters, f"tools[{index}].function.parameters")
            grammars.append(call_grammar(calls.functions))
        if grammars:
            engine = self.client.engine
            tokenizer = GrammarTokenizer.for_tokenizer(engine.tokenizer, engine.eos_token_ids)
            for grammar in grammars:
                tokenizer.new_matcher(grammar)

    async def complete(self, body: ChatCompletionRequest, call: BilledCall) -> ChatCompletion:
        text, last = await self.client.complete(call, await self._request(body, call))
        if body.json_mode is not None and last.finish_reason == "stop":
            await self.client.off_loop(check_json_output, text, body)
        finish = last.finish_reason or "stop"
        content, calls = split_calls(text) if body.calls_tools else (text, [])
        choice = ChatChoice(
            index=0,
            message=ChatResponseMessage(content=content, tool_calls=calls or None),
            finish_reason="tool_calls" if calls and finish == "stop" else finish,
        )
        return completion(ChatCompletion, "chatcmpl", body.model, choice, usage_of(last))

    async def stream(
        self, body: ChatCompletionRequest, call: BilledCall
    ) -> AsyncIterator[ChatCompletionChunk]:
        """Role delta, content deltas, the finish chunk, then always a usage chunk."""
        request = await self._request(body, call)
        chunk = chunk_maker(ChatCompletionChunk, "chatcmpl", body.model)
        yield chunk([ChatChunkChoice(index=0, delta=ChatDelta(role="assistant", content=""))])
        choice_of = _CallDeltas() if body.calls_tools else _delta_choice
        async with aclosing(self.client.stream_chunks(call, request, chunk, choice_of)) as pieces:
            async for piece in pieces:
                yield piece


def _delta_choice(piece: GenerationChunk) -> ChatChunkChoice:
    delta = ChatDelta(content=piece.text) if piece.text else ChatDelta()
    return ChatChunkChoice(index=0, delta=delta, finish_reason=piece.finish_reason)


class _CallDeltas:
    """A stream's choices where the answer may call tools: content, then each call's deltas
    (``CallStream``); the finish is ``tool_calls`` when calls were made."""

    def __init__(self) -> None:
        self.reader = CallStream()

    def __call__(self, piece: GenerationChunk) -> ChatChunkChoice:
        content, calls = self.reader.feed(piece.text)
        finish = piece.finish_reason
        if finish is not None:
            content += self.reader.finish()
        delta = ChatDelta(content=content or None, tool_calls=calls or None)
        if finish == "stop" and self.reader.calls:
            finish = "tool_calls"
        return ChatChunkChoice(index=0, delta=delta, finish_reason=finish)


def json_instruction(body: ChatCompletionRequest) -> str:
    """Decoding guarantees the JSON; the instruction makes its *content* sensible."""
    schema = body.response_format.json_schema if body.response_format else None
    if schema is None:
        return "Respond only with a JSON object."
    return "Respond only with a JSON object that follows this JSON schema:\n" + json.dumps(
        schema.schema_, ensure_ascii=False
    )


def requested_schema(body: ChatCompletionRequest) -> dict | None:
    fmt = body.response_format
    if fmt is None or fmt.type != "json_schema" or fmt.json_schema is None:
        return None
    return fmt.json_schema.schema_


def check_json_output(text: str, body: ChatCompletionRequest) -> None:
    """A belt-and-braces check: schema keywords the decoder cannot enforce (``pattern``,
    ``minimum``, ...) are validated after the fact; failing them is the model's fault (502)."""
    problem = validate_output(text, requested_schema(body))
    if problem is not None:
        logger.warning("constrained output failed validation: %s", problem)
        raise UpstreamBadResponseError(
            "The model's output did not validate against the requested JSON schema."
        )
