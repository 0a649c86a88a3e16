"""Answer decision questions with probabilities read from the model's own token likelihoods.

No text is generated. Each question becomes a chat whose answer is one of a fixed set of
*options* (``true``/``false``, the choice labels, the score digits); the scorer reads how
likely the model is to give each option and renormalises over the options.

How a request runs:

1. Every prompt is ``head + state + question + tail`` (``prompts.chat_frame``): the fixed
   system turn and the state form a prefix shared by all questions, run once (or taken from
   the prefix cache, where a repeated state or at least the system turn is found).
2. Each question's own tokens, followed by its options' token trie (``trie.py``), form one
   row; rows are packed side by side into one sequence per forward pass (up to
   ``pack_tokens``) on top of the batch-1 prefix KV, with a tree attention mask: no prefix
   copy per question, no padding. Options whose first tokens are pairwise distinct are told
   apart by one next-token distribution (no trie nodes to run); otherwise each option is its
   tokens plus the end-of-turn token (so that a label that is a prefix of another does not
   take its mass), and shared prefixes are run and read once.
3. Option log-likelihoods are renormalised over the request's options in float64.

Only hidden states at the positions read go through the LM head: full-vocabulary logits for
every position would cost ``batch x length x 150k`` floats. This assumes the usual decoder
layout (``model.base_model`` then ``get_output_embeddings()``, no logit soft-capping), which
holds for Qwen2 and Llama-style models.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from serve_app.engine.loader import LoadedModel
from serve_app.engine.prefix_cache import PrefixCache
from serve_app.engine.prompts import decisions as prompts
from serve_app.engine.prompts.chat_encoding import encode_untrusted
from serve_app.engine.scoring.budget import CancelHooks, DecisionBudget, WorkDone
from serve_app.engine.scoring.passes import HFPass, RunnerPass
from serve_app.engine.scoring.questions import DecisionQuestion, QuestionOutcome, ScoringResult
from serve_app.engine.scoring.trie import (
    Answers,
    OptionTrie,
    Row,
    build_trie,
    make_row,
    pack,
)
from serve_app.errors import ContextLengthExceededError, UnprocessableRequestError

if TYPE_CHECKING:
    from serve_app.engine.runner.qwen2 import Qwen2Runner

MAX_CHOICE_LABELS = 255
MAX_SCORE_LEVELS = 10

# Per side, every casing/spacing of the answer words; only single-token ones are used.
_NOUL_CASES = (str.lower, str.capitalize, str.upper)
_NOUL_SPACES = ("", " ")

KV = list[tuple[Any, Any]]  # per layer: (keys, values), each [batch, kv_heads, length, head_dim]


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


class LikelihoodScorer:
    """Scores decision questions on one loaded model. Synchronous; one request at a time.

    ``calibrate``: the question kinds answered with contextual calibration (``calibrated``).
    None by default: on the embedded model it moved the noul probe by one claim of 60 and a
    held-out set by none (``bench/noul_probe --calibration``), while each calibrated
    question runs and is billed twice.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        context_length: int,
        prefix_cache_bytes: int = 1 << 30,
        pack_tokens: int = 2048,
        calibrate: Collection[str] = (),
        budget: DecisionBudget | None = None,
        runner: Qwen2Runner | None = None,
    ) -> None:
        """``runner``: the engine's runner for this model (``configured_runner``, dense
        weights), as the generating deployments use it; None: the HF model's forward."""
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.device = loaded.device
        self.context_length = context_length
        self.pack_tokens = pack_tokens
        self.budget = budget or DecisionBudget()
        self.calibrate = frozenset(calibrate)
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self._lock = threading.Lock()
        self._in_flight: WorkDone | None = None
        self._hooks = CancelHooks(self.model.base_model)  # the HF forward's layers
        self._pass: HFPass | RunnerPass = (
            HFPass(self.model, self.device, _pad_id(self.tokenizer, loaded.eos_token_ids))
            if runner is None
            else RunnerPass(
                runner,
                context_length + self.budget.max_scored_tokens,
                self._hooks.check,
            )
        )
        self._head = self._pass.head
        self.end_id = _end_of_turn_id(self.tokenizer, loaded.eos_token_ids)
        self.frame = prompts.chat_frame(self.tokenizer)
        self.noul_answers = self._noul_variants()

    @property
    def busy(self) -> bool:
        """Whether a request holds the scorer right now."""
        return self._lock.locked()

    @property
    def in_flight(self) -> WorkDone | None:
        """The work done so far by the request holding the scorer (None when idle)."""
        return self._in_flight

    # ------------------------------------------------------------------ public

    def score(
        self,
        state: Any,
        questions: Sequence[DecisionQuestion],
        cancel: threading.Event | None = None,
        *,
        cache_salt: str,
    ) -> ScoringResult:
        """Probabilities for every question about ``state`` (see the module docstring).

        Raises ``ScoringCancelled`` (with the work done so far) soon after ``cancel`` is set.
        ``cache_salt``: the prefix-cache partition (the account's; see ``prefix_cache``).
        """
        import torch

        if not questions:
            raise UnprocessableRequestError("At least one question is required.", param="questions")
        state_text = prompts.state_block(state)
        plans = [self._question_text(q) for q in questions]
        self.budget.check_input_bytes(_text_bytes(state_text, plans), self.context_length)
        work = WorkDone()
        with self._lock, torch.inference_mode():
            self._hooks.watch(cancel, work)
            self._in_flight = work
            try:
                outcomes = self._answer(state_text, plans, work, cache_salt)
            finally:
                self._hooks.watch(None, work)
                self._in_flight = None
                self._pass.release()
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

    def _check_size(self, passes: list[tuple[list[int], list[_Plan]]]) -> None:
        """Context first (the contract's error for a long state), then the work budget over
        every pass (the state's and the content-free one), before any of them runs."""
        for prefix, plans in passes:
            deepest = max(max(plan.row.depths) for plan in plans)
            if len(prefix) + deepest + 2 > self.context_length:
                raise ContextLengthExceededError.for_limit(self.context_length, param="state")
        self.budget.check_scored_tokens(
            sum(len(prefix) + sum(len(plan.row) for plan in plans) for prefix, plans in passes)
        )

    def _answer(
        self, state_text: str, plans: list[_Plan], work: WorkDone, salt: str
    ) -> dict[str, QuestionOutcome]:
        """Every question scored on the state; the kinds in ``calibrate`` also on the
        content-free state, and their answer divided by that prior (``calibrated``)."""
        prefix = self.frame.head + self.encode(state_text)
        for plan in plans:
            self._hooks.check()  # 255 labels take a while to tokenise under load
            self._tokenize(plan)
        passes = [(prefix, plans)]
        priors = [plan for plan in plans if plan.question.kind in self.calibrate]
        if priors:
            null_state = prompts.state_block(prompts.CONTENT_FREE_STATE)
            passes.append((self.frame.head + self.encode(null_state), priors))
        self._check_size(passes)
        outcomes = self._score_plans(prefix, plans, work, salt)
        if priors:
            for name, prior in self._score_plans(passes[1][0], priors, work, salt).items():
                outcomes[name] = calibrated(outcomes[name], prior)
        return outcomes

    # ------------------------------------------------------------------ running

    def _score_plans(
        self, prefix: list[int], plans: list[_Plan], work: WorkDone, salt: str
    ) -> dict[str, QuestionOutcome]:
        """Tokenised plans run on top of ``prefix``; their options' probabilities."""
        rows = [plan.row for plan in plans]
        prefix_kv = self._prefix_kv(prefix, work, salt)
        reads: dict[int, list[float]] = {}
        for chunk in self._chunks([len(row) for row in rows]):
            self._hooks.check()
            packed = pack([rows[i] for i in chunk])
            hidden = self._pass.forward([packed], prefix_kv, len(prefix))
            work.input_tokens += len(packed)
            values = self._read(hidden, [packed])[0]
            for i in chunk:
                reads[i], values = values[: len(rows[i].reads)], values[len(rows[i].reads) :]
        outcomes = {}
        for i, plan in enumerate(plans):
            work.output_tokens += 1 if plan.single_read else len(plan.trie.reads)
            scores = [
                _logsumexp([sum(reads[i][r] for r in path) for path in alts])
                for alts in plan.trie.paths
            ]
            name = plan.question.name
            outcomes[name] = QuestionOutcome(name, plan.question.kind, _normalise(plan, scores))
        return outcomes

    def _prefix_kv(self, prefix: list[int], work: WorkDone, salt: str) -> KV:
        """KV cache of the shared prefix (batch 1): the longest part the prefix cache already
        holds (the fixed system turn at least, the whole state when it repeats), and the rest
        run once on top of it. The one place this scorer touches the prefix cache."""
        # A sentinel last token lets the lookup return the whole prefix (it keeps one back).
        cached_len, cached = self.prefix_cache.lookup([*prefix, -1], salt)
        work.cached_tokens += cached_len
        work.input_tokens += len(prefix)  # billed whether run now or taken from the cache
        kv = self._pass.prefix(prefix, cached_len, cached)
        if cached_len < len(prefix):
            self.prefix_cache.insert(prefix, kv, salt)
        return list(kv)

    def _read(self, hidden: Any, rows: list[Row], chunk: int = 256) -> list[list[float]]:
        """log P(target | position) for every row's reads; the LM head runs once per position."""
        import torch

        where: dict[tuple[int, int], int] = {}
        picks, targets = [], []
        for b, row in enumerate(rows):
            for index, target in row.reads:
                picks.append(where.setdefault((b, index), len(where)))
                targets.append(target)
        states = hidden[[b for b, _ in where], [i for _, i in where]]
        pick, target = torch.tensor(picks), torch.tensor(targets)
        values = torch.empty(len(picks), dtype=torch.float64)
        for start in range(0, states.shape[0], chunk):
            logits = self._head(states[start : start + chunk]).float().cpu()
            lse = logits.logsumexp(dim=-1)
            mine = ((pick >= start) & (pick < start + chunk)).nonzero().squeeze(1)
            local = pick[mine] - start
            values[mine] = (logits[local, target[mine]] - lse[local]).double()
        out, at = [], 0
        for row in rows:
            out.append(values[at : at + len(row.reads)].tolist())
            at += len(row.reads)
        return out

    def _chunks(self, lengths: list[int]) -> Iterator[list[int]]:
        """Consecutive rows packed up to ``pack_tokens`` per forward pass (a longer row runs
        alone): bounded mask memory, and a cancel check between passes."""
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


def _pad_id(tokenizer: Any, eos_ids: list[int]) -> int:
    """Any valid id will do: padding sits after each row's real tokens and is never read."""
    for candidate in (tokenizer.pad_token_id, tokenizer.eos_token_id, *eos_ids):
        if candidate is not None:
            return int(candidate)
    return 0


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
