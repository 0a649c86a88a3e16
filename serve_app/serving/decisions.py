"""Decisions: questions about a state answered from the model's own likelihoods.

The scorer (``serve_app.engine.scoring``) gives a probability distribution per question; this
module turns it into the contract's answers. ``confidence`` is the probability of the answer
given (the largest probability): the simplest honest definition.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from serve_app.api.decisions import (
    ChoiceAnswer,
    DecisionRequest,
    DecisionResponse,
    DecisionUsage,
    NoulAnswer,
    NoulCriteria,
    Question,
    ScoreAnswer,
)
from serve_app.engine.scoring import (
    DecisionQuestion,
    LikelihoodScorer,
    QuestionOutcome,
    ScoringCancelled,
    WorkDone,
)

logger = logging.getLogger(__name__)


class DecisionService:
    """``on_abandoned`` receives the work of a request whose caller went away (timeout,
    disconnect): it ran, so it is billed, although no answer carries its usage."""

    def __init__(
        self, scorer: LikelihoodScorer, on_abandoned: Callable[[WorkDone], None] | None = None
    ) -> None:
        self.scorer = scorer
        self.on_abandoned = on_abandoned or _log_abandoned

    async def decide(self, body: DecisionRequest) -> DecisionResponse:
        """Score in a worker thread: torch releases the GIL, the replica keeps serving.

        A thread cannot be killed, so cancellation is cooperative: when this task is cancelled
        (Serve cancels it when the caller times out or disconnects) the scorer is told to stop
        at its next decoder layer, which releases it for the next request within a second.
        """
        questions = [_to_engine(name, question) for name, question in body.questions.items()]
        cancel = threading.Event()
        scoring = asyncio.ensure_future(
            asyncio.to_thread(self.scorer.score, body.state, questions, cancel)
        )
        try:
            result = await asyncio.shield(scoring)
        except asyncio.CancelledError:
            cancel.set()
            scoring.add_done_callback(self._bill_abandoned)
            raise
        answers = {
            name: _to_answer(question, result.outcomes[name])
            for name, question in body.questions.items()
        }
        return DecisionResponse(
            model=body.model,
            answers=answers,
            usage=DecisionUsage(
                input_tokens=result.input_tokens, output_tokens=result.output_tokens
            ),
        )

    def _bill_abandoned(self, scoring: asyncio.Future) -> None:
        if scoring.cancelled():
            return
        error = scoring.exception()
        if isinstance(error, ScoringCancelled):
            self.on_abandoned(error.work)
        elif error is None:  # finished before it saw the flag
            result = scoring.result()
            self.on_abandoned(WorkDone(result.input_tokens, result.output_tokens))


def _log_abandoned(work: WorkDone) -> None:
    logger.info(
        "abandoned decision request ran %d input and %d output tokens",
        work.input_tokens,
        work.output_tokens,
    )


def _to_engine(name: str, question: Question) -> DecisionQuestion:
    criteria = question.criteria
    if isinstance(criteria, NoulCriteria):
        criteria = criteria.model_dump()
    return DecisionQuestion(
        name=name, kind=question.type, instructions=question.instructions, criteria=criteria
    )


def _to_answer(question: Question, outcome: QuestionOutcome):
    probabilities = {key: min(max(p, 0.0), 1.0) for key, p in outcome.probabilities.items()}
    best = max(probabilities, key=probabilities.__getitem__)
    if question.type == "noul":
        return NoulAnswer(noul=probabilities["true"])
    if question.type == "choice":
        return ChoiceAnswer(
            choice=best, probabilities=probabilities, confidence=probabilities[best]
        )
    legend = {str(level): item for level, item in enumerate(question.criteria)}
    score = sum(int(key) * p for key, p in probabilities.items())
    return ScoreAnswer(
        score=max(score, 0.0),
        legend=legend,
        probabilities=probabilities,
        confidence=probabilities[best],
    )
