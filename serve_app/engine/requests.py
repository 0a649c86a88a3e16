"""Per-request state the engine's step loop keeps while a request is in flight: built on the
caller's event loop (``LLMEngine.generate``), then owned by the loop thread. Another thread only
ever sets ``abort_requested`` (a plain bool, by ``abort``: a GIL-atomic store); the output queue
is filled only through the ``Outbox``."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Any

from serve_app.engine.constraints import (
    AnswerPrefixConstraint,
    TokenTexts,
    attach_constraint,
    constraint_for_response_format,
)
from serve_app.engine.outbox import Outbox
from serve_app.engine.protocol import (
    GenerationChunk,
    GenerationRequest,
    SamplingParams,
    ScoringChunk,
    ScoringRequest,
)
from serve_app.engine.sampling import Sampler, TokenHistory
from serve_app.engine.text import IncrementalDetokenizer, StopMatcher
from serve_app.engine.tool_call_grammar import ToolCallConstraint, tool_call_tokens
from serve_app.errors import ContextLengthExceededError, InvalidRequestError
from serve_app.grammar.matcher import GrammarTokenizer


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued, holds no slot
    PREFILLING = "prefilling"  # holds a slot; its prompt is being read chunk by chunk
    DECODING = "decoding"  # a row of the decode batch
    FINISHED = "finished"  # ended by eos, stop sequence, max_tokens or an error
    ABORTED = "aborted"  # ended by its caller (disconnect, cancellation, ``abort``)


class StreamEnd:
    """What a request's queue receives when it was aborted: the stream ends without a chunk."""


STREAM_END = StreamEnd()


@dataclass(eq=False, kw_only=True)
class InFlight:
    """What every request in the loop has (``request`` is the subclass's): a ``status``; its
    KV (``kv``: a slot or a cache, per backend) holding ``num_computed`` tokens, i.e. the
    position of the next token fed (``cached_tokens`` of them from the prefix cache); and the
    way out: the caller's asyncio ``queue`` on the caller's event ``loop``."""

    queue: asyncio.Queue[Any]
    loop: asyncio.AbstractEventLoop
    outbox: Outbox  # the engine's: what ``push`` hands over goes out once per step phase
    status: RequestStatus = RequestStatus.WAITING
    kv: Any = None
    num_computed: int = 0
    cached_tokens: int = 0
    abort_requested: bool = False

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def is_done(self) -> bool:
        return self.status in (RequestStatus.FINISHED, RequestStatus.ABORTED)

    @property
    def prompt_ids(self) -> list[int]:
        return self.request.prompt_token_ids

    @property
    def adapter(self) -> str:
        """The LoRA adapter the backend runs this request with ("": none)."""
        return self.request.adapter

    @property
    def lookup_ids(self) -> list[int]:
        """Prefix-cache query: the prompt (a hit keeps the last token back, for its logits)."""
        return self.request.prompt_token_ids

    @property
    def prompt_computed(self) -> int:
        """How many prompt tokens the KV holds (output tokens come after them)."""
        return min(self.num_computed, len(self.request.prompt_token_ids))

    @property
    def following_ids(self) -> list[int]:
        """What came after the prompt (a generation's output); kept as ids, not KV."""
        return []

    def push(self, item: GenerationChunk | ScoringChunk | BaseException | StreamEnd) -> None:
        """Hand an item to the caller's event loop at the next ``Outbox.flush``."""
        self.outbox.put(self, item)


@dataclass(eq=False, kw_only=True)
class RequestState(InFlight):
    """A generation in flight: sampler, detokenizer, stop matcher, tokens so far (``history``)."""

    request: GenerationRequest
    history: TokenHistory
    sampler: Sampler
    detokenizer: IncrementalDetokenizer
    stop_matcher: StopMatcher
    finish_reason: str | None = None
    tokens_sent: int = 0  # output tokens already handed out in a chunk's ``token_ids``
    # What followed this prompt's longest prefix-cache match (its account's earlier prompt
    # and completion): drafts for speculation, e.g. the rest of the suggestion a user types.
    draft_corpus: list[int] = field(default_factory=list)
    drafted_from_corpus: bool = False  # the last draft came from it (dropped on a miss)
    drafted_by_model: bool = False  # the last draft came from the draft model

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.request.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.history.output_ids)

    @property
    def following_ids(self) -> list[int]:
        return self.history.output_ids

    @property
    def prefill_done(self) -> bool:
        return self.num_computed >= self.num_prompt_tokens

    @property
    def last_token_id(self) -> int:
        """The token to feed at the next decode step (sampled, not yet in the KV cache)."""
        return self.history.output_ids[-1]

    def chunk(self, text: str, finish_reason: str | None = None) -> GenerationChunk:
        """A chunk with this request's running usage counts and its tokens not yet sent."""
        output = self.history.output_ids
        new_tokens = tuple(output[self.tokens_sent :])
        self.tokens_sent = len(output)
        return GenerationChunk(
            text=text,
            finish_reason=finish_reason,  # type: ignore[arg-type]
            prompt_tokens=self.num_prompt_tokens,
            completion_tokens=self.num_output_tokens,
            cached_tokens=self.cached_tokens,
            token_ids=new_tokens,
        )


class RequestAborted(Exception):
    """Raised between a forward's decoder layers once its requests are aborted (``backend``)."""


@dataclass(eq=False, kw_only=True)
class ScoringState(InFlight):
    """A scoring request: its prefix is read like a prompt, then one pass a step (``next_pass``)."""

    request: ScoringRequest
    next_pass: int = 0
    pass_tokens: int = 0  # tokens of the passes run so far

    @property
    def lookup_ids(self) -> list[int]:
        """The prefix and a sentinel: a hit may cover all of it (nothing is sampled from it)."""
        return [*self.request.prompt_token_ids, -1]

    def chunk(self, log_probs: list[float]) -> ScoringChunk:
        """The chunk of the pass just run (``next_pass`` already moved past it)."""
        return ScoringChunk(
            pass_index=self.next_pass - 1,
            log_probs=log_probs,
            prompt_tokens=len(self.prompt_ids) + self.pass_tokens,
            cached_tokens=self.cached_tokens,
            done=self.next_pass == len(self.request.passes),
        )


# Whatever the step loop holds: a generation or a scoring request.
State = RequestState | ScoringState


def new_request_state(
    request: GenerationRequest,
    context_param: str,
    loop: asyncio.AbstractEventLoop,
    outbox: Outbox,
    *,
    context_length: int,
    tokenizer: Any,
    token_texts: TokenTexts,
    eos_token_ids: frozenset[int],
    default_seed: int | None = None,
) -> RequestState:
    """Validate a request and build its state (on the caller's thread, so errors are 4xx):
    ``context_param`` is the field blamed when prompt + max_tokens exceeds the context."""
    prompt = list(request.prompt_token_ids)
    params = request.params
    if not prompt:
        raise InvalidRequestError(
            "The prompt must contain at least one token.", param=context_param
        )
    if params.max_tokens < 1:
        raise InvalidRequestError("max_tokens must be at least 1.", param="max_tokens")
    if len(prompt) + params.max_tokens > context_length:
        raise ContextLengthExceededError.for_limit(context_length, context_param)
    try:
        sampler = Sampler(params, default_seed)
        if params.response_format is not None or params.tool_calls is not None:
            grammar_tokenizer = GrammarTokenizer.for_tokenizer(tokenizer, sorted(eos_token_ids))
            attach_constraint(
                sampler,
                constraint_for_response_format(
                    params.response_format, grammar_tokenizer, eos_token_ids
                ),
            )
            if params.tool_calls is not None:
                attach_constraint(
                    sampler, tool_constraint(params, tokenizer, grammar_tokenizer, eos_token_ids)
                )
    except InvalidRequestError:
        raise
    except ValueError as e:
        raise InvalidRequestError(str(e)) from e
    if request.answer_prefix:  # token healing: the output spells the prefix first
        attach_constraint(sampler, AnswerPrefixConstraint(request.answer_prefix, token_texts))
    return RequestState(
        request=request,
        history=TokenHistory(prompt_ids=prompt, output_ids=[]),
        sampler=sampler,
        detokenizer=IncrementalDetokenizer(
            tokenizer,
            prompt_ids=prompt,
            skip_special_tokens=True,  # the text a client reads: no eos, no FIM markers
            hidden=len(request.answer_prefix),
        ),
        stop_matcher=StopMatcher(params.stop),
        queue=asyncio.Queue(),
        loop=loop,
        outbox=outbox,
    )


def tool_constraint(
    params: SamplingParams,
    tokenizer: Any,
    grammar_tokenizer: GrammarTokenizer,
    eos_token_ids: frozenset[int],
) -> ToolCallConstraint:
    """The decoding constraint of a request's tool calls; 4xx for a model without tool-call
    markers (a function whose parameters this service does not decode under: ``SchemaError``)."""
    markers = tool_call_tokens(tokenizer)
    if markers is None:
        raise InvalidRequestError(
            "This model's chat template has no tool calls; send the request without tools.",
            param="tools",
        )
    assert params.tool_calls is not None
    return ToolCallConstraint(params.tool_calls, markers, grammar_tokenizer, eos_token_ids)
