"""Decisions: questions about a state answered from the model's own likelihoods.

The scorer (``serve_app.engine.scoring``) gives a probability distribution per question; this
module turns it into the contract's answers. ``confidence`` is the probability of the answer
given (the largest probability): the simplest honest definition.
"""

from __future__ import annotations

import asyncio
import threading

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
)
from serve_app.serving.billing import BilledCall


class DecisionService:
    def __init__(self, scorer: LikelihoodScorer) -> None:
        self.scorer = scorer

    async def decide(self, body: DecisionRequest, call: BilledCall) -> DecisionResponse:
        """Score in a worker thread: torch releases the GIL, the replica keeps serving.

        A thread cannot be killed, so cancellation is cooperative: when this task is cancelled
        (Serve cancels it when the caller times out or disconnects) the scorer is told to stop
        at its next decoder layer, which releases it for the next request within a second; the
        work it ran until then is metered on ``call``, so the ledger bills it
        (serve_app.serving.billing).
        """
        questions = [_to_engine(name, question) for name, question in body.questions.items()]
        meter = call.meter
        cancel = threading.Event()
        scoring = asyncio.ensure_future(
            asyncio.to_thread(
                self.scorer.score, body.state, questions, cancel, cache_salt=call.cache_salt
            )
        )
        try:
            result = await asyncio.shield(scoring)
        except asyncio.CancelledError:
            cancel.set()
            (finished,) = await asyncio.gather(scoring, return_exceptions=True)
            if isinstance(finished, ScoringCancelled):
                meter.update(finished.work.input_tokens, finished.work.output_tokens)
            elif not isinstance(finished, BaseException):  # done before it saw the flag
                meter.update(finished.input_tokens, finished.output_tokens)
            raise
        meter.update(result.input_tokens, result.output_tokens)
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
