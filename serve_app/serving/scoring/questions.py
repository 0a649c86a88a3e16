"""The scorer's inputs and outputs: questions, their outcomes, and a request's result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

QuestionKind = Literal["noul", "choice", "score"]


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

    ``input_tokens``: tokens actually run through the model: the shared prompt (less what the
    prefix cache served), every question's own tokens, and every option-trie node.
    ``output_tokens``: answer tokens whose likelihood was read: one per question answered from
    a single next-token distribution, else one per distinct (prefix, token) of the options.
    ``cached_tokens``: prompt tokens served from the prefix cache instead of being run.
    """

    outcomes: dict[str, QuestionOutcome]
    input_tokens: int
    output_tokens: int
    cached_tokens: int = 0
