"""The application builder: one typed config in, one Ray Serve deployment graph out.

    Router (ingress) ──► AuthService
          ├────────────► DecisionScorer
          ├────────────► EditModel (the instruct model: next-edit, apply, chat)
          └────────────► FimModel

Used from YAML as ``import_path: serve_app.app:build_app`` with ``args:`` (an ``AppConfig``);
per-deployment options in the Serve config (``deployments:`` by name) override the defaults
each deployment class gives in ``get_deployment_options``.
"""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve import Application

from deployments.auth import AuthService
from deployments.edit_model import EditModel
from deployments.fim_model import FimModel
from deployments.router import Router
from deployments.scorer import DecisionScorer
from serve_app.config import AppConfig


def deploy(cls: type, config: AppConfig, **overrides: Any):
    return serve.deployment(cls, **{**cls.get_deployment_options(config), **overrides})


def build_app(args: dict[str, Any] | AppConfig | None = None) -> Application:
    config = args if isinstance(args, AppConfig) else AppConfig.model_validate(args or {})
    auth = deploy(AuthService, config).bind(config)
    # The model deployments write their own ledger rows (serve_app.serving.billing).
    scorer = deploy(DecisionScorer, config).bind(config, auth)
    edit = deploy(EditModel, config).bind(config, auth)
    fim = deploy(FimModel, config).bind(config, auth)
    ingress = serve.ingress()(Router)
    return deploy(ingress, config).bind(config, auth, scorer, edit, fim)
