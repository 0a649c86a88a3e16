"""The router app wired to the real deployments through Ray Serve's local testing mode.

Local testing mode runs each deployment class in this process behind real DeploymentHandle
objects (same ``.remote`` / ``.options(stream=True)`` calls, same error propagation), with no
cluster to start. Used by the fast tests; production always goes through ``build_app``.
"""

from __future__ import annotations

from fastapi import FastAPI
from ray import serve

from deployments.auth import AuthService
from deployments.edit_model import EditModel
from deployments.fim_model import FimModel
from deployments.scorer import DecisionScorer
from serve_app.app import deploy
from serve_app.config import AppConfig
from serve_app.http.app import Backends, build_router_app


def local_handle(cls: type, config: AppConfig, *args):
    deployment = deploy(cls, config)
    return serve.run(
        deployment.bind(config, *args),
        name=f"local-{deployment.name}",
        route_prefix=None,
        _local_testing_mode=True,
    )


def local_router_app(config: AppConfig) -> FastAPI:
    # Model deployments bill through an auth deployment of their own: in local testing mode
    # a handle passed as an argument cannot be used, a bound deployment can (same store).
    billing = deploy(AuthService, config).bind(config)
    backends = Backends(
        auth=local_handle(AuthService, config),
        scorer=local_handle(DecisionScorer, config, billing),
        edit=local_handle(EditModel, config, billing),
        fim=local_handle(FimModel, config, billing),
    )
    return build_router_app(config, backends)
