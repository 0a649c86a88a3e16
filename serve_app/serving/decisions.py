"""Decisions: questions about a state answered from the model's own likelihoods.

The scorer (``serve_app.serving.scoring``) gives a probability distribution per question; this
module turns it into the contract's answers. ``confidence`` is the probability of the answer
given (the largest probability): the simplest honest definition.
"""

from __future__ import annotations

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
from serve_app.errors import InvalidRequestError, UnprocessableRequestError
from serve_app.serving.billing import BilledCall
from serve_app.serving.scoring import (
    DecisionQuestion,
    LikelihoodScorer,
    QuestionOutcome,
    WorkDone,
)


class DecisionService:
    """``max_questions``: the operator's cap on questions per request (``limits``), under the
    request model's own."""

    def __init__(self, scorer: LikelihoodScorer, max_questions: int | None = None) -> None:
        self.scorer = scorer
        self.max_questions = max_questions

    async def decide(self, body: DecisionRequest, call: BilledCall) -> DecisionResponse:
        """Score on the scoring engine. When this task is cancelled (Serve cancels it when
        the caller times out or disconnects) the engine request is aborted and stops within
        one decoder layer's work; what ran until then is metered on ``call``, so the ledger
        bills it (serve_app.serving.billing). A request this service cannot answer is a 422
        (api-spec.md 7.1: the decision endpoint's status where the others answer 400)."""
        limit = self.max_questions
        if limit is not None and len(body.questions) > limit:
            message = f"At most {limit} questions per request."
            raise UnprocessableRequestError(message, param="questions")
        questions = [_to_engine(name, question) for name, question in body.questions.items()]
        work = WorkDone()
        try:
            result = await self.scorer.score(
                body.state, questions, cache_salt=call.cache_salt, work=work
            )
        except InvalidRequestError as exc:
            raise UnprocessableRequestError.from_invalid(exc) from None
        finally:
            call.meter.update(work.input_tokens, work.output_tokens)
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
