"""The auth/quota deployment: keys, accounts, limits and the usage ledger."""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from deployments.options import deployment_options
from serve_app.auth.authorizer import AuthConfig, Authorizer, Grant
from serve_app.auth.local_key import bootstrap_key_file
from serve_app.auth.records import Usage
from serve_app.auth.store import open_store
from serve_app.config import AppConfig
from serve_app.errors import ServiceError, UpstreamUnavailableError

logger = logging.getLogger(__name__)


class AuthService:
    """The auth deployment (deployed as ``AuthService``): one ``Authorizer`` per replica, its
    store calls run off the event loop."""

    def __init__(self, config: AppConfig) -> None:
        store = open_store(config.auth_db)
        self.authorizer = Authorizer(
            store,
            AuthConfig(
                model_ids=frozenset(model.id for model in config.models),
                cache_ttl=config.auth.cache_ttl_s,
                max_concurrent=config.auth.max_concurrent_requests,
                # Held past the longest deadline, so only a dead router's reservation expires.
                reservation_ttl=2
                * max(config.limits.request_timeout_s, config.limits.decision_timeout_s),
            ),
        )
        if config.auth.bootstrap_local_key:
            key, path = bootstrap_key_file(
                store, config.auth_db, os.environ.get("SERVE_APP_API_KEY")
            )
            if key is not None:  # the key itself would land in Ray's log files
                logger.warning("created account 'local'; its API key is in %s (mode 0600)", path)

    async def authenticate(self, api_key: str | None) -> None:
        await self._in_thread(self.authorizer.authenticate, api_key)

    async def authorize(
        self, api_key: str | None, model: str | None, endpoint: str, estimated_tokens: int = 0
    ) -> Grant:
        return await self._in_thread(
            self.authorizer.authorize, api_key, model, endpoint, estimated_tokens
        )

    async def release(self, grant: Grant) -> None:
        await self._in_thread(self.authorizer.release, grant)

    async def record_usage(self, grant: Grant, usage: Usage) -> None:
        await self._in_thread(self.authorizer.record_usage, grant, usage)

    @staticmethod
    async def _in_thread(function, *args):
        """Store calls are short but may wait on a lock another replica holds: off the loop.
        A store that stays locked or unreachable is a 503 for the client, not a 500."""
        try:
            return await asyncio.to_thread(function, *args)
        except ServiceError:
            raise
        except Exception as exc:
            logger.error("auth store failed: %s", type(exc).__name__)
            raise UpstreamUnavailableError("The account service is unavailable. Retry.") from None

    @staticmethod
    def get_deployment_options(config: AppConfig) -> dict[str, Any]:
        return deployment_options("AuthService", ongoing=512, max_replicas=4, target=128, cpus=0.1)
