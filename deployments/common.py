"""What the deployments share: CPU allotment, engine hosting, default options."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, ClassVar

from deployments.options import deployment_options
from deployments.replica_metrics import LatencyMetrics, report_engine_stats
from serve_app.config import AppConfig, EngineRole
from serve_app.engine.engine import LLMEngine
from serve_app.serving.billing import UsageRecorder, ledger_write
from serve_app.serving.engine_client import EngineClient
from serve_app.serving.spool import LedgerSpool

logger = logging.getLogger(__name__)


def replica_cpus() -> float | None:
    """CPUs Ray reserved for this replica, to size torch's thread pool (None outside Ray)."""
    try:
        import ray

        return ray.get_runtime_context().get_assigned_resources().get("CPU")
    except Exception:
        return None


def usage_recorder(auth: Any, timeout_s: float, config: AppConfig) -> UsageRecorder:
    """The model side's ledger writer: rows go to the auth deployment (``auth``: its handle;
    None where nothing bills, e.g. a deployment built on its own), through this machine's
    ledger spool while the store cannot take them."""
    recorder = UsageRecorder(ledger_write(auth), timeout_s, LedgerSpool(config.ledger_spool))
    # No event loop (built outside Serve): flushing starts with the first row spooled.
    with contextlib.suppress(RuntimeError):
        recorder.ledger.start_flushing()  # and adopts what a dead replica here left behind
    return recorder


class EngineDeployment:
    """Base of the model deployments (FimModel, EditModel, DecisionScorer): one engine per
    replica, its metrics, health check and shutdown."""

    deployment_name: ClassVar[str]
    engine_role: ClassVar[EngineRole]
    # Requests a replica takes at once; None: two of its engine's batches (one running, the
    # next waiting in the engine's queue).
    max_ongoing: ClassVar[int | None] = None

    def start_role_engine(self, config: AppConfig) -> LLMEngine:
        """This replica's engine, of its role (``engine_role``; ``LLMEngine.from_config``):
        its stats reported, its health checked, shut down with it."""
        self.engine = LLMEngine.from_config(config, self.engine_role, cpus=replica_cpus())
        self._stats_task = _start_background(report_engine_stats(self.engine))
        return self.engine

    def start_engine_client(self, config: AppConfig) -> EngineClient:
        """The role's engine (``start_role_engine``) behind a generating services' client."""
        engine = self.start_role_engine(config)
        return EngineClient(engine, config.role_model(self.engine_role), LatencyMetrics())

    def check_health(self) -> None:
        """Serve's health check: a replica whose engine loop died gets replaced."""
        self.engine.check_health()

    def __del__(self) -> None:
        if getattr(self, "engine", None) is not None:
            self.engine.shutdown()

    @classmethod
    def get_deployment_options(cls, config: AppConfig) -> dict[str, Any]:
        """Admit ``max_ongoing``, queue as many again, then answer 503 instead of queueing on;
        scale out at half of what a replica admits."""
        ongoing = cls.max_ongoing or 2 * config.engine_for(cls.engine_role).max_batch_size
        return deployment_options(
            cls.deployment_name,
            ongoing=ongoing,
            max_replicas=2,
            target=max(1, ongoing // 2),
            cpus=1,
            health_check_period_s=10,
        )


def _start_background(coroutine) -> asyncio.Task | None:
    """Run ``coroutine`` on the replica's event loop; constructors may run without one."""
    try:
        return asyncio.get_running_loop().create_task(coroutine)
    except RuntimeError:
        coroutine.close()
        logger.debug("no running event loop: engine stats are not reported")
        return None
