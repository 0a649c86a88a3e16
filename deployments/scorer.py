"""The decision scorer deployment: likelihood scoring with a shared-state prefix."""

from __future__ import annotations

from functools import partial
from typing import Any

from deployments.common import EngineDeployment, replica_cpus, usage_recorder
from serve_app.api.decisions import DecisionRequest, DecisionResponse
from serve_app.config import AppConfig
from serve_app.serving.billing import RequestContext
from serve_app.serving.decisions import DecisionService
from serve_app.serving.generation import load_configured_model
from serve_app.serving.scoring import LikelihoodScorer
from serve_app.serving.scoring.budget import DecisionBudget


class DecisionScorer(EngineDeployment):
    """Decisions on the scoring engine of the decisions role's model: an engine deployment
    like the others (health check, engine metrics, shutdown), whose engine only scores."""

    deployment_name = "DecisionScorer"
    engine_role = "decisions"

    def __init__(self, config: AppConfig, auth: Any = None) -> None:
        model = config.model(config.roles.decisions)
        loaded = load_configured_model(config, model, "decisions", cpus=replica_cpus())
        budget = DecisionBudget(
            max_scored_tokens=config.limits.decision_max_scored_tokens,
            max_input_bytes=config.limits.decision_max_input_bytes,
        )
        # Scoring reads prompts through the same engine code as generation, with the
        # decisions role's engine settings.
        scorer = LikelihoodScorer.for_model(
            loaded, config.engine_for("decisions"), model.context_length, budget=budget
        )
        self.host_engine(scorer.engine)
        self.decisions = DecisionService(scorer, config.limits.max_questions)
        self.usage = usage_recorder(auth, config.limits.decision_timeout_s, config)

    async def decide(self, body: DecisionRequest, context: RequestContext) -> DecisionResponse:
        return await self.usage.run(context, partial(self.decisions.decide, body))

    @classmethod
    def get_deployment_options(cls, config: AppConfig) -> dict[str, Any]:
        """A decision holds its slot for all its passes: fewer at once than a generating
        deployment admits (a full batch of them would queue behind one another anyway)."""
        return {
            "name": "DecisionScorer",
            "max_ongoing_requests": 8,
            "max_queued_requests": 32,
            "autoscaling_config": {
                "min_replicas": 1,
                "max_replicas": 2,
                "target_ongoing_requests": 4,
            },
            "ray_actor_options": {"num_cpus": 1},
            "health_check_period_s": 10,
        }
