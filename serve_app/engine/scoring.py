"""Answer decision questions with probabilities read from the model's own token likelihoods.

No text is generated. Each question becomes a chat whose answer is one of a fixed set of
*options* (``true``/``false``, the choice labels, the score digits); the scorer reads how
likely the model is to start its answer with each option and renormalises over the options.

How a request runs (one forward pass of the state, however many questions):

1. Every question's prompt starts the same way: a fixed system turn, then the state. The
   longest common token prefix of all prompts is run once (or taken from a small LRU of
   recent prefixes, keyed by its token ids) to get its KV cache.
2. The question remainders run as one right-padded batch on top of that cache (expanded along
   the batch). With causal attention no real token sees the padding after it, so each row's
   answer distribution is read at its last real index; positions are passed explicitly.
3. Options are scored from the next-token distribution at that index when their first tokens
   are pairwise distinct (one pass suffices). Otherwise each option's full continuation
   (option tokens, then the end-of-turn token, so that a label that is a prefix of another
   does not take its mass) is scored as a sum of log-probabilities, batched on top of the
   question's own KV cache.

Only hidden states at the positions read go through the LM head: full-vocabulary logits for
every position would cost ``batch x length x 150k`` floats. This assumes the usual decoder
layout (``model.base_model`` then ``get_output_embeddings()``, no logit soft-capping), which
holds for Qwen2 and Llama-style models.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from serve_app.engine.batch import cache_from_kv, kv_from_cache
from serve_app.engine.loader import LoadedModel
from serve_app.engine.prefix_cache import PrefixCache
from serve_app.engine.prompts import decisions as prompts
from serve_app.errors import ContextLengthExceededError, UnprocessableRequestError

QuestionKind = Literal["noul", "choice", "score"]
MAX_CHOICE_LABELS = 255
MAX_SCORE_LEVELS = 10

# Per side, every casing/spacing of the answer words; only single-token ones are used.
_NOUL_CASES = (str.lower, str.capitalize, str.upper)
_NOUL_SPACES = ("", " ")

KV = list[tuple[Any, Any]]  # per layer: (keys, values), each [batch, kv_heads, length, head_dim]


@dataclass
class DecisionQuestion:
    """One named question about the request's state."""

    name: str
    kind: QuestionKind
    instructions: Any = None
    criteria: Any = None


@dataclass
class QuestionOutcome:
    """Probabilities over one question's options.

    noul: ``{"true": p, "false": 1 - p}``; choice: label -> p; score: ``"0".."n-1"`` -> p.
    """

    name: str
    kind: str
    probabilities: dict[str, float]

    @property
    def best(self) -> str:
        """The most probable option (first one on ties, i.e. request order)."""
        return max(self.probabilities, key=self.probabilities.__getitem__)

    @property
    def confidence(self) -> float:
        """The probability of the chosen option: the simplest honest definition."""
        return max(self.probabilities.values())

    @property
    def expected_level(self) -> float:
        """Score questions: sum(k * p_k) on the 0..n-1 scale."""
        return sum(int(key) * p for key, p in self.probabilities.items())


@dataclass
class ScoringResult:
    """Outcomes by question name, plus usage.

    ``input_tokens``: prompt tokens the request runs through the model: the shared prefix once
    (billed in full even on a prefix-cache hit, so a cached state is never a free ride), plus
    every question remainder and continuation row.
    ``output_tokens``: answer tokens whose likelihood was read (1 per first-token question;
    every option token plus its end-of-turn token on the continuation path).
    ``cached_tokens``: prefix tokens served from the prefix cache instead of being run.
    """

    outcomes: dict[str, QuestionOutcome]
    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0


@dataclass
class _Plan:
    """A question turned into prompt tokens and option token sequences."""

    question: DecisionQuestion
    ids: list[int]
    options: list[str]
    answers: list[list[list[int]]]  # per option, alternative token sequences (no end token)
    first_token_path: bool = False

    @property
    def answer_length(self) -> int:
        """Tokens scored after the prompt on the longest path (for the context check)."""
        if self.first_token_path:
            return 1
        return max(len(seq) + 1 for alts in self.answers for seq in alts)


@dataclass
class _Usage:
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0


class LikelihoodScorer:
    """Scores decision questions on one loaded model. Synchronous; one request at a time."""

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        context_length: int,
        prefix_cache_bytes: int = 1 << 30,
        batch_kv_bytes: int = 256 << 20,
        max_batch_rows: int = 64,
    ) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.device = loaded.device
        self.context_length = context_length
        self.batch_kv_bytes = batch_kv_bytes
        self.max_batch_rows = max_batch_rows
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self._lock = threading.Lock()
        self._base = self.model.base_model
        self._head = self.model.get_output_embeddings()
        self._pad_id = _pad_id(self.tokenizer, loaded.eos_token_ids)
        self.end_id = _end_of_turn_id(self.tokenizer, loaded.eos_token_ids)
        self._noul_answers = self._noul_variants()

    # ------------------------------------------------------------------ public

    def score(
        self, state: Any, questions: Sequence[DecisionQuestion], cache_salt: str | None = None
    ) -> ScoringResult:
        """Probabilities for every question about ``state`` (see the module docstring).
        ``cache_salt``: the prefix-cache partition (the account; see ``prefix_cache``)."""
        import torch

        if not questions:
            raise UnprocessableRequestError("At least one question is required.", param="questions")
        with self._lock, torch.inference_mode():
            plans, anchor = self._plan_all(state, questions)
            prefix_len = _prefix_length(anchor, plans)
            self._check_context(plans)
            usage = _Usage()
            prefix_kv = self._prefix_kv(plans[0].ids[:prefix_len], usage, cache_salt)
            outcomes: dict[str, QuestionOutcome] = {}
            for rows in self._chunks(plans, prefix_len, [len(p.ids) - prefix_len for p in plans]):
                self._score_rows([plans[i] for i in rows], prefix_kv, prefix_len, usage, outcomes)
        return ScoringResult(
            outcomes={q.name: outcomes[q.name] for q in questions},
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cached_tokens=usage.cached_tokens,
        )

    # ---------------------------------------------------------------- planning

    def _plan_all(
        self, state: Any, questions: Sequence[DecisionQuestion]
    ) -> tuple[list[_Plan], list[int]]:
        """Tokenize all prompts, tokenizing the (possibly long) state part only once.

        Also returns the tokens of the chat up to the end of the state: the shared prefix.
        """
        marker = "\x00QUESTION\x00"
        chat = self._chat_text(prompts.question_messages(state, marker))
        anchor_text = chat[: chat.rindex(marker)]
        anchor_ids = self._encode(anchor_text)
        plans: list[_Plan] = []
        split = True
        for question in questions:
            options, answers, user = self._question_parts(question)
            text = self._chat_text(prompts.question_messages(state, user))
            ids = None
            if split and text.startswith(anchor_text):
                ids = anchor_ids + self._encode(text[len(anchor_text) :])
                # Exact when no token spans the anchor's end (true for Qwen's pre-tokenizer:
                # the state block ends in a newline run); checked once per request.
                if not plans and ids != self._encode(text):
                    split, ids = False, None
            plan = _Plan(question, ids or self._encode(text), options, answers)
            plan.first_token_path = _first_tokens_disjoint(answers)
            plans.append(plan)
        return plans, anchor_ids

    def _question_parts(self, q: DecisionQuestion) -> tuple[list[str], list[list[list[int]]], str]:
        """Options, their token sequences, and the user message for one question."""
        if q.kind == "noul":
            criteria = q.criteria
            if criteria is not None and not isinstance(criteria, dict):
                raise _invalid(q, "noul criteria must be an object with 'true'/'false' keys")
            user = prompts.noul_message(q.name, q.instructions, criteria)
            return ["true", "false"], list(self._noul_answers), user
        if q.kind == "choice":
            labels = q.criteria
            if not isinstance(labels, dict) or not 1 <= len(labels) <= MAX_CHOICE_LABELS:
                raise _invalid(q, f"choice criteria must map 1 to {MAX_CHOICE_LABELS} labels")
            options = [str(label) for label in labels]
            user = prompts.choice_message(q.name, q.instructions, labels)
            return options, [[self._encode(label)] for label in options], user
        if q.kind == "score":
            levels = q.criteria
            if not isinstance(levels, list) or not 1 <= len(levels) <= MAX_SCORE_LEVELS:
                raise _invalid(q, f"score criteria must be a list of 1 to {MAX_SCORE_LEVELS} items")
            if any(level is None for level in levels):
                raise _invalid(q, "score criteria items must not be null")
            options = [str(k) for k in range(len(levels))]
            user = prompts.score_message(q.name, q.instructions, levels)
            return options, [[self._encode(key)] for key in options], user
        raise _invalid(q, f"unknown question type {q.kind!r}")

    def _noul_variants(self) -> list[list[list[int]]]:
        """Per side, every single-token spelling of its words ("true", " True", "yes", ...).

        A side with no single-token spelling falls back to its plain word's token sequence.
        """
        sides = []
        for words in (prompts.NOUL_TRUE_WORDS, prompts.NOUL_FALSE_WORDS):
            seen: set[int] = set()
            for word in words:
                for case in _NOUL_CASES:
                    for space in _NOUL_SPACES:
                        ids = self._encode(space + case(word))
                        if len(ids) == 1:
                            seen.add(ids[0])
            sides.append([[t] for t in sorted(seen)] or [self._encode(words[0])])
        return sides

    def _check_context(self, plans: list[_Plan]) -> None:
        longest = max(len(p.ids) + p.answer_length for p in plans)
        if longest > self.context_length:
            raise ContextLengthExceededError.for_limit(self.context_length, param="state")

    # ------------------------------------------------------------------ running

    def _prefix_kv(self, prefix: list[int], usage: _Usage, salt: str | None) -> KV | None:
        """KV cache of the shared prefix (batch 1): the longest part the engine's prefix cache
        already holds (the fixed system turn at least, the whole state when it repeats), and
        the rest run once on top of it."""
        import torch

        if not prefix:
            return None
        # A sentinel last token lets the lookup return the whole prefix (it keeps one back).
        cached_len, cached = self.prefix_cache.lookup([*prefix, -1], salt)
        usage.cached_tokens += cached_len
        usage.input_tokens += len(prefix)  # billed whether run now or taken from the cache
        if cached_len == len(prefix):
            return list(cached)
        ids = torch.tensor([prefix[cached_len:]], device=self.device)
        past = cache_from_kv(cached) if cached_len else None
        out = self._base(input_ids=ids, past_key_values=past, use_cache=True)
        kv = kv_from_cache(out.past_key_values)
        self.prefix_cache.insert(prefix, kv, salt)
        return list(kv)

    def _score_rows(
        self,
        plans: list[_Plan],
        prefix_kv: KV | None,
        prefix_len: int,
        usage: _Usage,
        outcomes: dict[str, QuestionOutcome],
    ) -> None:
        """One batch of question remainders; then each question's options."""
        import torch

        rows = [p.ids[prefix_len:] for p in plans]
        hidden, cache = self._forward(rows, prefix_kv, prefix_len)
        usage.input_tokens += sum(len(r) for r in rows)
        last = torch.tensor([len(r) - 1 for r in rows], device=hidden.device)
        # Moved once to the CPU: options index single entries, often hundreds of them.
        logprobs = self._log_softmax(
            hidden[torch.arange(len(rows), device=hidden.device), last]
        ).cpu()
        for b, plan in enumerate(plans):
            if plan.first_token_path:
                scores = _first_token_scores(logprobs[b], plan.answers)
                usage.output_tokens += 1
            else:
                row_kv = [
                    (k[b : b + 1, :, : len(plan.ids)], v[b : b + 1, :, : len(plan.ids)])
                    for k, v in cache
                ]
                scores = self._continuation_scores(plan, row_kv, logprobs[b], usage)
            name = plan.question.name
            outcomes[name] = QuestionOutcome(name, plan.question.kind, _normalise(plan, scores))

    def _continuation_scores(self, plan: _Plan, kv: KV, first: Any, usage: _Usage) -> list[float]:
        """log P(option tokens + end-of-turn | prompt) per option, batched over the options."""
        import torch

        seqs = [seq + [self.end_id] for alts in plan.answers for seq in alts]
        totals = [float(first[seq[0]]) for seq in seqs]
        usage.output_tokens += sum(len(seq) for seq in seqs)
        todo = [i for i, seq in enumerate(seqs) if len(seq) > 1]  # the last token is only read
        base = len(plan.ids)
        for chunk in self._chunks(todo, base, [len(seqs[i]) - 1 for i in todo]):
            rows = [seqs[todo[i]][:-1] for i in chunk]
            hidden, _ = self._forward(rows, kv, base)
            usage.input_tokens += sum(len(r) for r in rows)
            where = [(b, j) for b, row in enumerate(rows) for j in range(len(row))]
            targets = [seqs[todo[chunk[b]]][j + 1] for b, j in where]
            picked = hidden[[b for b, _ in where], [j for _, j in where]]
            token_lp = self._target_logprobs(picked, torch.tensor(targets, device=hidden.device))
            for (b, _), lp in zip(where, token_lp.tolist(), strict=True):
                totals[todo[chunk[b]]] += lp
        return _per_option(plan.answers, totals)

    def _forward(self, rows: list[list[int]], kv: KV | None, offset: int) -> tuple[Any, KV]:
        """Run right-padded rows on top of a batch-1 KV cache; hidden states and the new KV."""
        import torch
        from transformers import DynamicCache

        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), offset + width), dtype=torch.long)
        mask[:, :offset] = 1
        for b, row in enumerate(rows):
            ids[b, : len(row)] = torch.tensor(row)
            mask[b, offset : offset + len(row)] = 1
        positions = (torch.arange(width) + offset).expand(len(rows), -1)
        cache = DynamicCache(config=self.model.config)
        if kv is not None:
            expanded = [
                (k.expand(len(rows), -1, -1, -1), v.expand(len(rows), -1, -1, -1)) for k, v in kv
            ]
            cache = DynamicCache(ddp_cache_data=expanded, config=self.model.config)
        out = self._base(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            past_key_values=cache,
            use_cache=True,
        )
        new_kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        return out.last_hidden_state, new_kv

    def _log_softmax(self, hidden: Any) -> Any:
        """Full-vocabulary log-probabilities for a few positions ([n, hidden] -> [n, vocab])."""
        return self._head(hidden).float().log_softmax(dim=-1)

    def _target_logprobs(self, hidden: Any, targets: Any, chunk: int = 256) -> Any:
        """log P(target) at each position, a few hundred positions at a time (bounded memory)."""
        import torch

        parts = []
        for start in range(0, hidden.shape[0], chunk):
            logits = self._head(hidden[start : start + chunk]).float()
            picked = logits.gather(1, targets[start : start + chunk, None]).squeeze(1)
            parts.append(picked - logits.logsumexp(dim=-1))
        return torch.cat(parts)

    def _chunks(self, items: Sequence[Any], offset: int, lengths: list[int]) -> Iterator[list[int]]:
        """Split row indices into batches whose expanded KV cache stays within budget."""
        if not items:
            return
        per_token = self._kv_bytes_per_token()
        rows = self.batch_kv_bytes // max(1, per_token * (offset + max(lengths)))
        rows = max(1, min(self.max_batch_rows, rows))
        for start in range(0, len(items), rows):
            yield list(range(start, min(start + rows, len(items))))

    def _kv_bytes_per_token(self) -> int:
        config = self.model.config.get_text_config(decoder=True)
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = (
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        )
        size = next(self.model.parameters()).element_size()
        return 2 * config.num_hidden_layers * heads * head_dim * size

    # ------------------------------------------------------------------ helpers

    def _chat_text(self, messages: list[dict[str, str]]) -> str:
        """The whole prompt, up to and including the assistant turn's opening."""
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True
        )

    def _encode(self, text: str) -> list[int]:
        # The chat template already wrote any BOS; the tokenizer must not add another.
        return self.tokenizer.encode(text, add_special_tokens=False)


def _invalid(question: DecisionQuestion, message: str) -> UnprocessableRequestError:
    return UnprocessableRequestError(f"Question '{question.name}': {message}.", param="questions")


def _prefix_length(anchor: list[int], plans: list[_Plan]) -> int:
    """Longest common token prefix of the prompts.

    At most the chat up to the end of the state (so the LRU key depends on the state only),
    and leaving every question at least one token of its own (its last position is read).
    """
    length = min(len(anchor), *(len(p.ids) - 1 for p in plans))
    for plan in plans:
        length = _common_prefix(anchor, plan.ids, length)
    return length


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    n = 0
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def _first_tokens_disjoint(answers: list[list[list[int]]]) -> bool:
    """True when one next-token distribution tells the options apart: every option has a
    first token, and no first token belongs to two options."""
    seen: set[int] = set()
    for alts in answers:
        firsts = {seq[0] for seq in alts if seq}
        if not firsts or len(firsts) < len(alts) or firsts & seen:
            return False
        seen |= firsts
    return True


def _first_token_scores(logprobs: Any, answers: list[list[list[int]]]) -> list[float]:
    """Per option, log of the summed probability of its first tokens."""
    return [float(logprobs[[seq[0] for seq in alts]].double().logsumexp(0)) for alts in answers]


def _per_option(answers: list[list[list[int]]], totals: list[float]) -> list[float]:
    """Fold per-sequence log-probabilities back into one log-probability per option."""
    scores, i = [], 0
    for alts in answers:
        scores.append(_logsumexp(totals[i : i + len(alts)]))
        i += len(alts)
    return scores


def _logsumexp(values: list[float]) -> float:
    top = max(values)
    if top == -math.inf:
        return top
    return top + math.log(sum(math.exp(v - top) for v in values))


def _normalise(plan: _Plan, scores: list[float]) -> dict[str, float]:
    """Softmax over the options in float64, so the probabilities sum to 1 within 1e-12."""
    top = max(scores)
    if top == -math.inf:  # nothing has any mass (cannot happen with finite logits): uniform
        return {option: 1.0 / len(plan.options) for option in plan.options}
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights)
    return {option: w / total for option, w in zip(plan.options, weights, strict=True)}


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
