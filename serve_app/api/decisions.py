"""POST /v1/decisions: named questions about a shared state (api-spec.md 2.1-2.2)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from serve_app.api.common import (
    MAX_NESTING,
    JsonText,
    RequestModel,
    ResponseModel,
    json_depth,
)
from serve_app.config import MAX_QUESTIONS


class NoulCriteria(RequestModel):
    true: JsonText | None = None
    false: JsonText | None = None


class NoulQuestion(RequestModel):
    type: Literal["noul"]
    instructions: JsonText | None = None
    criteria: NoulCriteria | None = None


class ChoiceQuestion(RequestModel):
    type: Literal["choice"]
    instructions: JsonText | None = None
    criteria: dict[str, JsonText | None] = Field(min_length=1, max_length=255)


class ScoreQuestion(RequestModel):
    type: Literal["score"]
    instructions: JsonText | None = None
    criteria: list[JsonText] = Field(min_length=1, max_length=10)


Question = Annotated[NoulQuestion | ChoiceQuestion | ScoreQuestion, Field(discriminator="type")]


class DecisionRequest(RequestModel):
    model: str = Field(min_length=1)
    state: JsonText
    questions: dict[str, Question] = Field(min_length=1, max_length=MAX_QUESTIONS)

    @model_validator(mode="after")
    def _limit_nesting(self) -> DecisionRequest:
        """Deeply nested JSON is a denial-of-service vector for rendering: cap it."""
        parts: list[Any] = [self.state]
        for question in self.questions.values():
            parts.append(question.instructions)
            criteria = question.criteria
            parts.append(criteria.model_dump() if isinstance(criteria, NoulCriteria) else criteria)
        if any(json_depth(part) > MAX_NESTING for part in parts):
            raise ValueError(
                f"state, instructions and criteria may nest at most {MAX_NESTING} levels"
            )
        return self


Probability = Annotated[float, Field(ge=0.0, le=1.0)]


class NoulAnswer(ResponseModel):
    type: Literal["noul"] = "noul"
    noul: Probability


class ChoiceAnswer(ResponseModel):
    type: Literal["choice"] = "choice"
    choice: str
    probabilities: dict[str, Probability]
    confidence: Probability


class ScoreAnswer(ResponseModel):
    type: Literal["score"] = "score"
    score: float = Field(ge=0.0)
    legend: dict[str, JsonText]
    probabilities: dict[str, Probability]
    confidence: Probability


Answer = Annotated[NoulAnswer | ChoiceAnswer | ScoreAnswer, Field(discriminator="type")]


class DecisionUsage(ResponseModel):
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)

    @property
    def token_counts(self) -> tuple[int, int]:
        """(input, output) tokens, as ``CompletionUsage.token_counts``."""
        return self.input_tokens, self.output_tokens


class DecisionResponse(ResponseModel):
    model: str = Field(min_length=1)
    answers: dict[str, Answer] = Field(min_length=1)
    usage: DecisionUsage
