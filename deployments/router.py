"""The ingress: HTTP in, typed errors out; everything else goes through handles."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from deployments.options import deployment_options
from serve_app.config import AppConfig
from serve_app.http.app import Backends, build_router_app


class Router:
    """The ingress deployment (deployed as ``Router``): serves the FastAPI app whose routes
    run ``serve_app.http.app.RouteHandlers`` on handles to the other deployments."""

    def __init__(self, config: AppConfig, auth: Any, scorer: Any, edit: Any, fim: Any) -> None:
        backends = Backends(auth=auth, scorer=scorer, edit=edit, fim=fim)
        # Serve's proxy sets and returns x-request-id itself.
        self.http_app = build_router_app(config, backends, add_request_id=False)

    def __serve_build_asgi_app__(self) -> FastAPI:
        return self.http_app

    @staticmethod
    def get_deployment_options(config: AppConfig) -> dict[str, Any]:
        return deployment_options("Router", ongoing=256, max_replicas=4, target=64, cpus=0.25)
