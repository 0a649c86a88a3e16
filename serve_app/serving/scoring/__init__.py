"""Decision scoring: option likelihoods on a shared state prefix (see ``scorer``)."""

from serve_app.serving.scoring.budget import DecisionBudget, WorkDone
from serve_app.serving.scoring.questions import (
    DecisionQuestion,
    QuestionKind,
    QuestionOutcome,
    ScoringResult,
)
from serve_app.serving.scoring.scorer import (
    MAX_CHOICE_LABELS,
    MAX_SCORE_LEVELS,
    LikelihoodScorer,
    calibrated,
)
from serve_app.serving.scoring.trie import OptionTrie, build_trie

__all__ = [
    "MAX_CHOICE_LABELS",
    "MAX_SCORE_LEVELS",
    "DecisionBudget",
    "DecisionQuestion",
    "LikelihoodScorer",
    "OptionTrie",
    "QuestionKind",
    "QuestionOutcome",
    "ScoringResult",
    "WorkDone",
    "build_trie",
    "calibrated",
]
