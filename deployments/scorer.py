"""The decision scorer deployment: likelihood scoring with a shared-state prefix."""

from __future__ import annotations

from typing import Any

from deployments.common import replica_cpus
from serve_app import metrics
from serve_app.api.decisions import DecisionRequest, DecisionResponse
from serve_app.config import AppConfig
from serve_app.engine.scoring import LikelihoodScorer, WorkDone
from serve_app.serving.decisions import DecisionService
from serve_app.serving.generation import load_configured_model


class DecisionScorer:
    def __init__(self, config: AppConfig) -> None:
        model = config.model(config.roles.decisions)
        self.model_id = model.id
        loaded = load_configured_model(config, model, cpus=replica_cpus())
        self.decisions = DecisionService(
            LikelihoodScorer(loaded, context_length=model.context_length),
            on_abandoned=self._count_abandoned,
        )

    def _count_abandoned(self, work: WorkDone) -> None:
        """The router saw a timeout and recorded no tokens: count what the scorer ran."""
        tags = {"endpoint": "decisions", "model": self.model_id}
        for direction, count in (("input", work.input_tokens), ("output", work.output_tokens)):
            if count:  # Ray counters refuse a zero increment
                metrics.tokens().inc(count, tags={**tags, "direction": direction})

    async def decide(self, body: DecisionRequest) -> DecisionResponse:
        return await self.decisions.decide(body)

    @staticmethod
    def get_deployment_options(config: AppConfig) -> dict[str, Any]:
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
