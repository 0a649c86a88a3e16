"""The decision scorer deployment: likelihood scoring with a shared-state prefix."""

from __future__ import annotations

from functools import partial
from typing import Any

from deployments.common import EngineDeployment, usage_recorder
from serve_app.api.decisions import DecisionRequest, DecisionResponse
from serve_app.config import AppConfig
from serve_app.serving.billing import RequestContext
from serve_app.serving.decisions import DecisionService
from serve_app.serving.scoring import LikelihoodScorer
from serve_app.serving.scoring.budget import DecisionBudget


class DecisionScorer(EngineDeployment):
    """Decisions on the decisions role's engine, which only scores: an engine deployment like
    the others (``AppConfig.engine_for`` makes the role's engine a scoring one)."""

    deployment_name = "DecisionScorer"
    engine_role = "decisions"
    # A decision holds its slot for all its passes, and its engine has one
    # (``SCORING_SLOTS``): the rest wait in the engine's queue, a few per replica.
    max_ongoing = 8

    def __init__(self, config: AppConfig, auth: Any = None) -> None:
        budget = DecisionBudget(
            max_scored_tokens=config.limits.decision_max_scored_tokens,
            max_input_bytes=config.limits.decision_max_input_bytes,
        )
        scorer = LikelihoodScorer(self.start_role_engine(config), budget=budget)
        self.decisions = DecisionService(scorer, config.limits.max_questions)
        self.usage = usage_recorder(auth, config.limits.decision_timeout_s, config)

    async def decide(self, body: DecisionRequest, context: RequestContext) -> DecisionResponse:
        return await self.usage.run(context, partial(self.decisions.decide, body))
