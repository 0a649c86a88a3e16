"""The decode step's speculation: which tokens each row drafts, and what is kept of them.

A row whose route speculates (``SpeculationConfig``) feeds drafts after its last token, checked
in the step's one forward (``runner/speculation.py``: why the text equals plain decoding's).
Drafts come from, in order: the suggestion this account was just offered (``draft_corpus``,
up to ``SUGGESTION_DRAFT_TOKENS``: a user typing it makes long drafts likely right); prompt
lookup over the request's prompt and output (an edit's answer mostly copies its region, an
apply's its file); the draft model, for routes that use it, where lookup found nothing. No
drafts when more than ``max_batch`` rows decode: a wider step is bound by compute, and drafts
then cost more than they save.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from serve_app.engine.output import OutputProcessor
from serve_app.engine.requests import RequestState
from serve_app.engine.stats import EngineCounters
from serve_app.engine_config import SpeculationConfig
from serve_app.runner.speculation import propose_draft

if TYPE_CHECKING:
    from serve_app.runner.draft import DraftModel

logger = logging.getLogger(__name__)

# Draft length when the draft comes from the suggestion this account was just offered: checking
# 16 tokens costs a few decode steps, against 16 steps to decode them.
SUGGESTION_DRAFT_TOKENS = 16


class Speculator:
    """Drafts for a decode step's rows, and the verification of the step's logits."""

    def __init__(
        self,
        config: SpeculationConfig,
        backend_checks_drafts: bool,
        drafter: DraftModel | None,
        context_length: int,
        counters: EngineCounters,
    ) -> None:
        self.config = config
        self.backend_checks_drafts = backend_checks_drafts
        self.drafter = drafter
        self.context_length = context_length
        self.counters = counters

    def draft_tokens(self, state: RequestState) -> int:
        """How many tokens a step may draft for this request (0: its route does not speculate)."""
        if not self.backend_checks_drafts:
            return 0
        return self.config.draft_tokens(state.request.route)

    def drafts(self, rows: list[RequestState]) -> list[list[int]]:
        """Each row's draft for this step (empty: it feeds its last token only)."""
        if len(rows) > self.config.max_batch:
            return [[] for _ in rows]
        drafts = [self._lookup(state) for state in rows]
        if self.drafter is not None:
            self._from_model(rows, drafts)
        return drafts

    def verify(
        self,
        rows: list[RequestState],
        drafts: list[list[int]],
        logits: torch.Tensor,
        output: OutputProcessor,
    ) -> None:
        """Each row's tokens from the step's logits, to ``output``; a row that fails fails alone."""
        sizes = [1 + len(draft) for draft in drafts]
        picks = _greedy_picks(rows, logits, sizes)
        per_row = zip(rows, drafts, logits.split(sizes), picks, strict=True)
        for state, draft, row_logits, row_picks in per_row:
            try:
                self._verify_row(state, draft, row_logits, row_picks, output)
            except Exception as e:
                logger.exception("sampling failed for request %s", state.request_id)
                output.fail(state, e)

    def release(self) -> None:
        """Forget every row's draft-model state (the backend was reset)."""
        if self.drafter is not None:
            self.drafter.release()

    def _room(self, state: RequestState) -> int:
        """A draft's most tokens: within max_tokens (the last position adds one) and context."""
        params = state.request.params
        return min(
            params.max_tokens - state.num_output_tokens - 1,
            self.context_length - state.num_computed - 1,
        )

    def _lookup(self, state: RequestState) -> list[int]:
        """A prompt-lookup draft when the request's route speculates."""
        state.drafted_by_model = False
        k = self.draft_tokens(state)
        if not k:
            return []
        limit = self._room(state)
        k = min(k, limit)
        if k <= 0:
            return []
        history = state.history
        tokens = history.prompt_ids + history.output_ids
        if state.draft_corpus:
            draft = propose_draft(tokens, min(limit, SUGGESTION_DRAFT_TOKENS), state.draft_corpus)
            state.drafted_from_corpus = bool(draft)
            if draft:
                return draft
        return propose_draft(tokens, k)

    def _from_model(self, rows: list[RequestState], drafts: list[list[int]]) -> None:
        """The draft model's tokens for the rows whose route uses it and whose prompt lookup
        found nothing (free drafts first), at most the drafter's row count."""
        assert self.drafter is not None
        routes = self.config.draft_model_routes
        requests: list[tuple[int, str, list[int], int]] = []
        chosen: list[tuple[int, RequestState]] = []
        for index, state in enumerate(rows):
            room = self._room(state)
            if drafts[index] or state.request.route not in routes or room <= 0:
                continue
            tokens = state.history.prompt_ids + state.history.output_ids
            if self.drafter.reads(tokens) and len(chosen) < self.drafter.max_rows:
                requests.append((id(state), state.request.cache_partition, tokens, room))
                chosen.append((index, state))
        if not chosen:
            return
        try:
            proposed = self.drafter.propose(requests, {id(state) for state in rows})
        except Exception:  # a draft only saves time: decode without one
            logger.exception("draft model failed; this step decodes without its drafts")
            self.drafter.release()
            return
        for (index, state), draft in zip(chosen, proposed, strict=True):
            drafts[index] = draft
            state.drafted_by_model = bool(draft)

    def _verify_row(
        self,
        state: RequestState,
        draft: list[int],
        logits: torch.Tensor,
        picks: list[int] | None,
        output: OutputProcessor,
    ) -> None:
        """Sample position by position, as plain decoding would; stop at the first token that
        differs from the draft (it is the step's last token) or when the request ends.
        ``picks``: each position's argmax, read already, for a plain greedy request."""
        start = state.num_computed
        accepted = 0
        for position, row in enumerate(logits):
            token = picks[position] if picks is not None else state.sampler(row, state.history)
            state.num_computed = start + position + 1
            output.on_token(state, token)
            if position == len(draft) or state.is_done or token != draft[position]:
                break
            accepted += 1
        self.counters.count_drafts(len(draft), accepted, state.drafted_by_model)
        if state.drafted_by_model and self.drafter is not None:
            self.drafter.verified(id(state), len(draft), accepted)
        if draft and position == 0 and state.drafted_from_corpus:
            state.draft_corpus = []  # the answer left the old suggestion: stop paying for it


def _greedy_picks(
    rows: list[RequestState], logits: torch.Tensor, sizes: list[int]
) -> list[list[int] | None]:
    """Per row whose sampler is plain greedy (no penalty or constraint), each position's argmax,
    else None: one argmax and read back per step, not per row, as on a GPU each read waits for
    the device (per row, a large share of a wide step's time)."""
    if not any(state.sampler.plain_greedy for state in rows):
        return [None] * len(rows)
    flat = logits.argmax(dim=-1).tolist()
    picks: list[list[int] | None] = []
    offset = 0
    for state, size in zip(rows, sizes, strict=True):
        picks.append(flat[offset : offset + size] if state.sampler.plain_greedy else None)
        offset += size
    return picks
