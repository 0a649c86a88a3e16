"""Answer decision questions with probabilities read from the model's own token likelihoods.

No text is generated. Each question becomes a chat whose answer is one of a fixed set of
*options* (``true``/``false``, the choice labels, the score digits); the scorer reads how
likely the model is to give each option and renormalises over the options.

How a request runs:

1. Every prompt is ``head + state + question + tail`` (``prompts.chat_frame``): the fixed
   system turn and the state form a prefix shared by all questions, read once (or taken from
   the prefix cache, where a repeated state or at least the system turn is found).
2. Each question's own tokens, followed by its options' token trie (``trie.py``), form one
   row; rows are packed side by side into one sequence per forward pass (up to
   ``pack_tokens``) on top of the prefix KV, with a tree attention mask: no prefix copy per
   question, no padding. Options whose first tokens are pairwise distinct are told
   apart by one next-token distribution (no trie nodes to run); otherwise each option is its
   tokens plus the end-of-turn token (so that a label that is a prefix of another does not
   take its mass), and shared prefixes are run and read once.
3. Option log-likelihoods are renormalised over the request's options in float64.

The model work is the engine's: the prefix and the packed passes go to ``LLMEngine.score`` as
one scoring request (same scheduler, KV, prefix cache, cancellation and backends as
generation), which reads the log-probabilities at each row's reads. This module only plans the
questions (texts, tries, rows, budgets) and does the answer math.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Collection, Iterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from serve_app.engine.engine import LLMEngine
from serve_app.engine.protocol import ScoringRequest
from serve_app.engine.tree import Row, pack
from serve_app.engine_config import EngineConfig
from serve_app.errors import ContextLengthExceededError, UnprocessableRequestError
from serve_app.models.loader import LoadedModel
from serve_app.prompts import decisions as prompts
from serve_app.prompts.chat_encoding import encode_untrusted
from serve_app.serving.scoring.budget import DecisionBudget, WorkDone
from serve_app.serving.scoring.questions import DecisionQuestion, QuestionOutcome, ScoringResult
from serve_app.serving.scoring.trie import Answers, OptionTrie, build_trie, make_row

MAX_CHOICE_LABELS = 255
MAX_SCORE_LEVELS = 10

# Per side, every casing/spacing of the answer words; only single-token ones are used.
_NOUL_CASES = (str.lower, str.capitalize, str.upper)
_NOUL_SPACES = ("", " ")


@dataclass
class _Plan:
    """A question's text, then its tokens: options, the row it runs as, and the trie read."""

    question: DecisionQuestion
    options: list[str]
    user: str
    labels: list[str] | None  # texts to encode as options (None: the noul answer words)
    row: Row | None = None
    trie: OptionTrie | None = None
    single_read: bool = False


@dataclass
class _Group:
    """Questions scored on one prefix: the plans, packed into rows (``chunks``: the plan
    indices of each packed row), one scoring request to the engine."""

    prefix: list[int]
    plans: list[_Plan]
    chunks: list[list[int]] | None = None
    packed: list[Row] | None = None


class LikelihoodScorer:
    """Scores decision questions on one model's scoring engine; many requests at once.

    ``calibrate``: the question kinds answered with contextual calibration (``calibrated``).
    None by default: on the embedded model it barely moved the noul probe and left a held-out
    set where it was (``bench/noul_probe --calibration``; docs/api-notes.md), while each
    calibrated question runs and is billed twice.
    """

    def __init__(
        self,
        engine: LLMEngine,
        *,
        pack_tokens: int = 2048,
        calibrate: Collection[str] = (),
        budget: DecisionBudget | None = None,
    ) -> None:
        """``engine``: a scoring engine (``EngineConfig.for_scoring``; ``for_model`` builds
        one), whose passes have room for ``budget``'s scored tokens."""
        self.budget = budget or DecisionBudget()
        if (
            engine.config.task != "score"
            or engine.config.score_columns < self.budget.max_scored_tokens
        ):
            raise ValueError(
                "a LikelihoodScorer needs a scoring engine with room for its budget's scored "
                "tokens (EngineConfig.for_scoring)"
            )
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.context_length = engine.context_length
        self.pack_tokens = pack_tokens
        self.calibrate = frozenset(calibrate)
        self.end_id = _end_of_turn_id(self.tokenizer, engine.loaded.eos_token_ids)
        self.frame = prompts.chat_frame(self.tokenizer)
        self.noul_answers = self._noul_variants()

    @classmethod
    def for_model(
        cls,
        loaded: LoadedModel,
        config: EngineConfig,
        context_length: int,
        *,
        budget: DecisionBudget | None = None,
        **options: Any,
    ) -> LikelihoodScorer:
        """A scorer on its own scoring engine for ``loaded``: prompts read on the weights
        ``config`` gives the generating engines, and room past the context for the passes
        the scored-token budget allows."""
        budget = budget or DecisionBudget()
        engine = LLMEngine(loaded, config.for_scoring(budget.max_scored_tokens), context_length)
        return cls(engine, budget=budget, **options)

    # ------------------------------------------------------------------ public

    async def score(
        self,
        state: Any,
        questions: Sequence[DecisionQuestion],
        *,
        cache_salt: str,
        work: WorkDone | None = None,
    ) -> ScoringResult:
        """Probabilities for every question about ``state`` (see the module docstring).

        ``cache_salt``: the prefix-cache partition (the account's; see ``prefix_cache``).
        ``work`` (the caller's) is kept up to date while the request runs, so a cancelled one
        is billed what it ran. Planning (tokenising up to 255 labels a question) runs on a
        worker thread; the model work in the engine.
        """
        if not questions:
            raise UnprocessableRequestError("At least one question is required.", param="questions")
        work = work if work is not None else WorkDone()
        groups = await asyncio.to_thread(self._plan, state, questions)
        reads = [await self._run(group, cache_salt, work) for group in groups]
        outcomes = self._outcomes(groups[0], reads[0], work)
        if len(groups) > 1:  # the content-free state of calibrated questions
            for name, prior in self._outcomes(groups[1], reads[1], work).items():
                outcomes[name] = calibrated(outcomes[name], prior)
        return ScoringResult(
            outcomes={q.name: outcomes[q.name] for q in questions},
            input_tokens=work.input_tokens,
            output_tokens=work.output_tokens,
            cached_tokens=work.cached_tokens,
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of user text (state, questions, labels): special tokens stay plain text."""
        return encode_untrusted(self.tokenizer, text)

    # ---------------------------------------------------------------- planning

    def _question_text(self, q: DecisionQuestion) -> _Plan:
        """Options and the user message of one question (no tokenisation yet)."""
        if q.kind == "noul":
            criteria = q.criteria
            if criteria is not None and not isinstance(criteria, dict):
                raise _invalid(q, "noul criteria must be an object with 'true'/'false' keys")
            user = prompts.noul_message(q.name, q.instructions, criteria)
            return _Plan(q, ["true", "false"], user, None)
        if q.kind == "choice":
            labels = q.criteria
            if not isinstance(labels, dict) or not 1 <= len(labels) <= MAX_CHOICE_LABELS:
                raise _invalid(q, f"choice criteria must map 1 to {MAX_CHOICE_LABELS} labels")
            options = [str(label) for label in labels]
            return _Plan(
                q, options, prompts.choice_message(q.name, q.instructions, labels), options
            )
        if q.kind == "score":
            levels = q.criteria
            if not isinstance(levels, list) or not 1 <= len(levels) <= MAX_SCORE_LEVELS:
                raise _invalid(q, f"score criteria must be a list of 1 to {MAX_SCORE_LEVELS} items")
            if any(level is None for level in levels):
                raise _invalid(q, "score criteria items must not be null")
            options = [str(k) for k in range(len(levels))]
            return _Plan(q, options, prompts.score_message(q.name, q.instructions, levels), options)
        raise _invalid(q, f"unknown question type {q.kind!r}")

    def _tokenize(self, plan: _Plan) -> None:
        """The question's row: its own tokens, the chat tail, then its options' trie."""
        answers: Answers = (
            self.noul_answers
            if plan.labels is None
            else [[self.encode(label)] for label in plan.labels]
        )
        plan.single_read = _first_tokens_disjoint(answers)
        if plan.single_read:
            plan.trie = build_trie([[seq[:1] for seq in alts] for alts in answers], None)
        else:
            plan.trie = build_trie(answers, self.end_id)
        plan.row = make_row(self.encode(plan.user) + self.frame.tail, plan.trie)

    def _noul_variants(self) -> Answers:
        """Per side, every single-token spelling of its words ("true", " True", "yes", ...).

        A side with no single-token spelling falls back to its plain word's token sequence.
        """
        sides = []
        for words in (prompts.NOUL_TRUE_WORDS, prompts.NOUL_FALSE_WORDS):
            seen: set[int] = set()
            for word in words:
                for case in _NOUL_CASES:
                    for space in _NOUL_SPACES:
                        ids = self.encode(space + case(word))
                        if len(ids) == 1:
                            seen.add(ids[0])
            sides.append([[t] for t in sorted(seen)] or [self.encode(words[0])])
        return sides

    def _plan(self, state: Any, questions: Sequence[DecisionQuestion]) -> list[_Group]:
        """The request's groups: every question on the state; the kinds in ``calibrate``
        also on the content-free state (their answer is divided by that prior). Budgets are
        checked here, before any model work."""
        state_text = prompts.state_block(state)
        plans = [self._question_text(q) for q in questions]
        self.budget.check_input_bytes(_text_bytes(state_text, plans), self.context_length)
        for plan in plans:
            self._tokenize(plan)
        groups = [_Group(self.frame.head + self.encode(state_text), plans)]
        priors = [plan for plan in plans if plan.question.kind in self.calibrate]
        if priors:
            null_state = prompts.state_block(prompts.CONTENT_FREE_STATE)
            groups.append(_Group(self.frame.head + self.encode(null_state), priors))
        self._check_size(groups)
        for group in groups:
            rows = [plan.row for plan in group.plans]
            group.chunks = list(self._chunks([len(row) for row in rows]))
            group.packed = [pack([rows[i] for i in chunk]) for chunk in group.chunks]
        return groups

    def _check_size(self, groups: list[_Group]) -> None:
        """Context first (the contract's error for a long state), then the work budget over
        every group (the state's and the content-free one), before any of them runs."""
        for group in groups:
            deepest = max(max(plan.row.depths) for plan in group.plans)
            if len(group.prefix) + deepest + 2 > self.context_length:
                raise ContextLengthExceededError.for_limit(self.context_length, param="state")
        self.budget.check_scored_tokens(
            sum(len(group.prefix) + sum(len(plan.row) for plan in group.plans) for group in groups)
        )

    async def _run(self, group: _Group, salt: str, work: WorkDone) -> list[list[float]]:
        """The group's passes through the engine; each packed row's reads, in order. The
        prefix is billed whether read now or taken from the cache (as a prompt is)."""
        request = ScoringRequest(
            uuid.uuid4().hex, group.prefix, group.packed, salt, public_prefix=len(self.frame.head)
        )
        work.input_tokens += len(group.prefix)
        reads: list[list[float]] = []
        async with aclosing(self.engine.score(request)) as chunks:  # a cancel aborts it at once
            async for chunk in chunks:
                if chunk.pass_index == 0:
                    work.cached_tokens += chunk.cached_tokens
                work.input_tokens += len(group.packed[chunk.pass_index])
                reads.append(chunk.log_probs)
        return reads

    def _outcomes(
        self, group: _Group, reads: list[list[float]], work: WorkDone
    ) -> dict[str, QuestionOutcome]:
        """Each question's options' probabilities from its row's reads."""
        per_plan: dict[int, list[float]] = {}
        for chunk, values in zip(group.chunks, reads, strict=True):
            for i in chunk:
                count = len(group.plans[i].row.reads)
                per_plan[i], values = values[:count], values[count:]
        outcomes = {}
        for i, plan in enumerate(group.plans):
            work.output_tokens += 1 if plan.single_read else len(plan.trie.reads)
            scores = [
                _logsumexp([sum(per_plan[i][r] for r in path) for path in alts])
                for alts in plan.trie.paths
            ]
            name = plan.question.name
            outcomes[name] = QuestionOutcome(name, plan.question.kind, _normalise(plan, scores))
        return outcomes

    def _chunks(self, lengths: list[int]) -> Iterator[list[int]]:
        """Consecutive rows packed up to ``pack_tokens`` per forward pass (a longer row runs
        alone): bounded mask memory, and an abort check between passes."""
        chunk: list[int] = []
        total = 0
        for i, length in enumerate(lengths):
            if chunk and total + length > self.pack_tokens:
                yield chunk
                chunk, total = [], 0
            chunk.append(i)
            total += length
        if chunk:
            yield chunk


def _text_bytes(state_text: str, plans: list[_Plan]) -> int:
    size = len(state_text.encode())
    for plan in plans:
        size += len(plan.user.encode()) + sum(len(label.encode()) for label in plan.labels or [])
    return size


def _invalid(question: DecisionQuestion, message: str) -> UnprocessableRequestError:
    return UnprocessableRequestError(f"Question '{question.name}': {message}.", param="questions")


def _first_tokens_disjoint(answers: Answers) -> bool:
    """True when one next-token distribution tells the options apart: every option has a
    first token, and no first token belongs to two options."""
    seen: set[int] = set()
    for alts in answers:
        firsts = {seq[0] for seq in alts if seq}
        if not firsts or len(firsts) < len(alts) or firsts & seen:
            return False
        seen |= firsts
    return True


def _logsumexp(values: list[float]) -> float:
    top = max(values)
    if top == -math.inf:
        return top
    return top + math.log(sum(math.exp(v - top) for v in values))


def _normalise(plan: _Plan, scores: list[float]) -> dict[str, float]:
    return _softmax(plan.options, scores)


def _softmax(options: Sequence[str], scores: list[float]) -> dict[str, float]:
    """Softmax over the options in float64, so the probabilities sum to 1 within 1e-12."""
    top = max(scores)
    if top == -math.inf:  # nothing has any mass (cannot happen with finite logits): uniform
        return {option: 1.0 / len(options) for option in options}
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights)
    return {option: w / total for option, w in zip(options, weights, strict=True)}


def calibrated(outcome: QuestionOutcome, prior: QuestionOutcome) -> QuestionOutcome:
    """Contextual calibration (Zhao et al. 2021, "Calibrate Before Use"): each option's
    probability divided by its probability for the same question on a content-free state,
    renormalised. For ``noul`` that is ``sigmoid(logit(p) - logit(p_null))``: the model's
    leaning on this claim whatever the state (a prior the claim's wording alone brings) is
    removed, and only what the state adds is left. Probabilities are clipped to 1e-12 so
    that an option the model rules out stays finite."""
    scores = [
        math.log(max(p, 1e-12)) - math.log(max(prior.probabilities[option], 1e-12))
        for option, p in outcome.probabilities.items()
    ]
    return QuestionOutcome(
        outcome.name, outcome.kind, _softmax(list(outcome.probabilities), scores)
    )


def _end_of_turn_id(tokenizer: Any, eos_ids: list[int]) -> int:
    """The first token the chat template writes after an assistant answer (<|im_end|> on Qwen)."""
    marker = "ANSWER_MARKER"
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}],
            tokenize=False,
        )
        tail = text[text.rindex(marker) + len(marker) :]
        ids = tokenizer.encode(tail, add_special_tokens=False) if tail else []
        if ids:
            return int(ids[0])
    except (ValueError, TypeError, AttributeError):
        pass
    if tokenizer.eos_token_id is not None:
        return int(tokenizer.eos_token_id)
    return int(eos_ids[0])
