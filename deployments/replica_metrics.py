"""Replica-side metrics for the model deployments: latency observer and engine gauges."""

from __future__ import annotations

import asyncio
import logging

from serve_app import metrics
from serve_app.engine.engine import LLMEngine

logger = logging.getLogger(__name__)

POLL_INTERVAL_S = 1.0


class LatencyMetrics:
    """A ``GenerationObserver`` that records time to first token and inter-token gaps."""

    def first_token(self, seconds: float) -> None:
        metrics.time_to_first_token().observe(seconds * 1000)

    def token_gap(self, seconds: float) -> None:
        metrics.inter_token_latency().observe(seconds * 1000)


def count_edit_rejection(reason: str) -> None:
    """Told by the edit service why it answered "no change" instead of the model's answer."""
    metrics.edit_rejections().inc(tags={"reason": reason})


async def report_engine_stats(engine: LLMEngine) -> None:
    """Publish queue depth, running batch, prefix-cache hits and bytes, and speculation once a
    second.

    Ray Serve tags each series with the deployment and replica itself."""
    reported_hit_tokens = 0
    reported_drafts = dict.fromkeys(("drafted", "accepted", "model_drafted", "model_accepted"), 0)
    while True:
        try:
            stats = engine.stats()
            metrics.engine_gauge("waiting_requests").set(stats.num_waiting)
            metrics.engine_gauge("running_requests").set(stats.num_running)
            metrics.engine_gauge("decode_batch_size").set(stats.num_decoding)
            # what the prefix cache holds, so a soak can tell a cache that stays within its
            # budget from a replica that grows (bench/soak.py)
            metrics.engine_gauge("prefix_cache_bytes").set(stats.prefix_cache_bytes)
            new_hits = stats.prefix_cache_hit_tokens - reported_hit_tokens
            if new_hits > 0:
                metrics.prefix_cache_hits().inc(new_hits)
            reported_hit_tokens = stats.prefix_cache_hit_tokens
            drafts = {
                "drafted": stats.draft_tokens,
                "accepted": stats.accepted_draft_tokens,
                "model_drafted": stats.model_draft_tokens,
                "model_accepted": stats.accepted_model_draft_tokens,
            }
            for outcome, total in drafts.items():
                if total > reported_drafts[outcome]:
                    metrics.speculative_tokens().inc(
                        total - reported_drafts[outcome], tags={"outcome": outcome}
                    )
                reported_drafts[outcome] = total
        except Exception:
            logger.exception("could not report engine stats")
        await asyncio.sleep(POLL_INTERVAL_S)
