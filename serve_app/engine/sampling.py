"""Turning one row of logits into one token, per request.

Modelled on transformers' logits processors: each rule maps a 1-D float32 logits row and the
``TokenHistory`` to a new row; ``build_processors`` keeps those a request asks for, so neutral
parameters cost nothing. Processors never modify their input in place: the engine may keep the
raw row (e.g. for logprobs), and a shared batch tensor must not change under another request.
"""

from __future__ import annotations

import secrets
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from serve_app.engine.protocol import SamplingParams


@dataclass
class TokenHistory:
    """A request's prompt and output tokens; ``append`` keeps the penalties' counts in O(1)
    (penalties run every step: recounting the output would make a long generation quadratic)."""

    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    output_counts: Counter[int] = field(init=False, repr=False)
    seen_ids: set[int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.output_counts = Counter(self.output_ids)
        self.seen_ids = set(self.prompt_ids) | set(self.output_ids)

    def append(self, token_id: int) -> None:
        """Record one generated token."""
        self.output_ids.append(token_id)
        self.output_counts[token_id] += 1
        self.seen_ids.add(token_id)


class LogitsProcessor(Protocol):
    def __call__(self, logits: torch.Tensor, history: TokenHistory) -> torch.Tensor: ...


def _index(ids: Sequence[int] | set[int], logits: torch.Tensor) -> torch.Tensor:
    return torch.tensor(sorted(ids), dtype=torch.long, device=logits.device)


class RepetitionPenalty:
    """CTRL/HF rule over prompt and output tokens: divide positive logits, multiply negative
    ones, so both get less likely when ``penalty > 1`` (dividing would *raise* a negative)."""

    def __init__(self, penalty: float) -> None:
        if not penalty > 0:
            raise ValueError(f"repetition_penalty must be > 0, got {penalty}")
        self.penalty = float(penalty)

    def __call__(self, logits: torch.Tensor, history: TokenHistory) -> torch.Tensor:
        if not history.seen_ids:
            return logits
        ids = _index(history.seen_ids, logits)
        score = logits[ids]
        score = torch.where(score > 0, score / self.penalty, score * self.penalty)
        return logits.index_copy(0, ids, score)


class FrequencyPresencePenalty:
    """OpenAI rule over output tokens only: ``logit -= count * freq + (count > 0) * presence``."""

    def __init__(self, frequency_penalty: float, presence_penalty: float) -> None:
        for name, value in (("frequency", frequency_penalty), ("presence", presence_penalty)):
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name}_penalty must be in [-2, 2], got {value}")
        self.frequency_penalty = float(frequency_penalty)
        self.presence_penalty = float(presence_penalty)

    def __call__(self, logits: torch.Tensor, history: TokenHistory) -> torch.Tensor:
        counts = history.output_counts
        if not counts:
            return logits
        ids = torch.tensor(list(counts.keys()), dtype=torch.long, device=logits.device)
        n = torch.tensor(list(counts.values()), dtype=logits.dtype, device=logits.device)
        penalty = n * self.frequency_penalty + self.presence_penalty
        return logits.index_add(0, ids, -penalty)


class Temperature:
    """Divide logits by the temperature: < 1 sharpens the distribution, > 1 flattens it."""

    def __init__(self, temperature: float) -> None:
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0 when sampling, got {temperature}")
        self.temperature = float(temperature)

    def __call__(self, logits: torch.Tensor, history: TokenHistory) -> torch.Tensor:
        return logits / self.temperature


class TopK:
    """Keep exactly the ``k`` highest logits (ties broken by ``torch.topk``); -1 means off."""

    def __init__(self, top_k: int) -> None:
        if top_k != -1 and top_k < 1:
            raise ValueError(f"top_k must be -1 (off) or >= 1, got {top_k}")
        self.top_k = int(top_k)

    def __call__(self, logits: torch.Tensor, history: TokenHistory) -> torch.Tensor:
        if self.top_k == -1 or self.top_k >= logits.numel():
            return logits
        keep = torch.topk(logits, self.top_k).indices
        out = torch.full_like(logits, float("-inf"))
        return out.index_copy(0, keep, logits[keep])


class TopP:
    """Nucleus: keep the smallest set of most likely tokens whose probability sums to >= top_p.
    A token is kept while the mass *before* it (descending) is below ``top_p``; the most likely
    always is, so one token survives and ``top_p=0`` (allowed by the contract) keeps just it."""

    def __init__(self, top_p: float) -> None:
        if not 0 <= top_p <= 1:
            raise ValueError(f"top_p must be in [0, 1], got {top_p}")
        self.top_p = float(top_p)

    def __call__(self, logits: torch.Tensor, history: TokenHistory) -> torch.Tensor:
        if self.top_p >= 1.0:
            return logits
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= self.top_p
        drop_sorted[0] = False
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        return logits.masked_fill(drop, float("-inf"))


def build_processors(params: SamplingParams) -> list[LogitsProcessor]:
    """The processors a request needs, in transformers' order: penalties, then the warpers
    (temperature, top-k, top-p), which only shape a distribution to sample from, so greedy
    requests skip them as transformers does; neutral values are left out."""
    processors: list[LogitsProcessor] = []
    if params.repetition_penalty != 1.0:
        processors.append(RepetitionPenalty(params.repetition_penalty))
    if params.frequency_penalty != 0.0 or params.presence_penalty != 0.0:
        processors.append(
            FrequencyPresencePenalty(params.frequency_penalty, params.presence_penalty)
        )
    if params.temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {params.temperature}")
    if params.greedy:
        return processors
    if params.temperature != 1.0:
        processors.append(Temperature(params.temperature))
    if params.top_k != -1:
        processors.append(TopK(params.top_k))
    if params.top_p != 1.0:
        processors.append(TopP(params.top_p))
    return processors


class Sampler:
    """Picks one request's next token from its logits row. It owns its ``torch.Generator``:
    a seeded request reproduces whatever shares the batch, an unseeded one spares torch's RNG."""

    def __init__(self, params: SamplingParams, default_seed: int | None = None) -> None:
        """``default_seed``: the seed of a request that sends none (None: a fresh random one)."""
        self.params = params
        self.processors = build_processors(params)
        seed = params.seed if params.seed is not None else default_seed
        if seed is None:
            seed = secrets.randbits(63)
        # torch takes seeds in [-2**63, 2**64) and reads them modulo 2**64; any JSON integer
        # is a valid seed, so reduce it the same way instead of overflowing (was a 500).
        self.seed = seed % 2**64
        self._generator: torch.Generator | None = None

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing that changes the logits: the token is their argmax."""
        return self.params.greedy and not self.processors

    def process(self, logits: torch.Tensor, history: TokenHistory) -> torch.Tensor:
        """Apply every processor to a 1-D logits row (in float32, whatever the model's dtype)."""
        if logits.dim() != 1:
            raise ValueError(f"expected a 1-D logits row, got shape {tuple(logits.shape)}")
        logits = logits.float()
        for processor in self.processors:
            logits = processor(logits, history)
        return logits

    def __call__(self, logits: torch.Tensor, history: TokenHistory) -> int:
        logits = self.process(logits, history)
        if self.params.greedy:
            return int(torch.argmax(logits).item())
        probs = torch.softmax(_finite(logits), dim=-1)
        return int(torch.multinomial(probs, 1, generator=self._generator_for(probs)).item())

    def _generator_for(self, tensor: torch.Tensor) -> torch.Generator:
        # Created lazily so the generator lives on the device the logits come from.
        if self._generator is None or self._generator.device != tensor.device:
            self._generator = torch.Generator(device=tensor.device).manual_seed(self.seed)
        return self._generator


def _finite(logits: torch.Tensor) -> torch.Tensor:
    """Clamp infinities to the largest finite floats before softmax: a valid but extreme
    ``repetition_penalty`` (1e-300) makes positive logits ``+inf``, whose softmax is NaN
    (multinomial raises); clamped, they share the mass and ``-inf`` ones keep probability 0."""
    finfo = torch.finfo(logits.dtype)
    return torch.nan_to_num(logits, nan=finfo.min, posinf=finfo.max, neginf=finfo.min)
