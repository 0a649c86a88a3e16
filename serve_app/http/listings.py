"""The model listings: ``/v1/models`` and ``/v1/{endpoint}/completions/models``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import Depends, FastAPI, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from serve_app.api.common import ErrorResponse
from serve_app.api.models import EndpointModelList, ModelList

if TYPE_CHECKING:
    from serve_app.http.app import RouteHandlers

LISTING_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (401, 500)
}
# The endpoints with a listing of their own (``/v1/{endpoint}/completions/models``).
LISTED_ENDPOINTS = ("chat", "fim", "edit", "apply")


def register_listings(app: FastAPI, handlers: RouteHandlers, bearer: HTTPBearer) -> None:
    """Add the overall listing and one listing per endpoint to ``app``."""
    app.get("/v1/models", response_model=ModelList, responses=LISTING_ERRORS, name="list_models")(
        listing_route(handlers, bearer, None)
    )
    for endpoint in LISTED_ENDPOINTS:
        app.get(
            f"/v1/{endpoint}/completions/models",
            response_model=EndpointModelList,
            responses=LISTING_ERRORS,
            name=f"list_{endpoint}_models",
        )(listing_route(handlers, bearer, f"{endpoint}.completions"))


def listing_route(handlers: RouteHandlers, bearer: HTTPBearer, endpoint: str | None) -> Any:
    """The route of one model listing: every model (``None``, no ``supported_endpoints``)
    or the models of one endpoint (with them), less those the account may not use."""
    config = handlers.config

    async def list_models(
        request: Request,
        response: Response,
        credentials: HTTPAuthorizationCredentials | None = Depends(bearer),
    ) -> ModelList | EndpointModelList:
        grant = await handlers.authorize(request, credentials, None, "models")
        handlers.apply_headers(response, grant)
        # The grant carries the account's allow-list: no second hop to the auth service.
        visible = [m for m in config.models if grant.models is None or m.id in grant.models]
        if endpoint is None:
            return ModelList(data=[config.card(model.id) for model in visible])
        cards = [
            config.card(model.id, endpoint)
            for model in visible
            if endpoint in config.endpoints_of(model.id)
        ]
        return EndpointModelList(data=cards)

    return list_models
