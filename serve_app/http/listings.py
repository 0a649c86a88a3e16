"""The model listings: ``/v1/models`` and one per endpoint (``LISTINGS``)."""

from __future__ import annotations

from typing import Any, Protocol

from fastapi import Depends, FastAPI, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from serve_app.api.common import ErrorResponse
from serve_app.api.models import EndpointModelList, ModelList
from serve_app.config import AppConfig, Endpoint
from serve_app.http.model_cards import served_card


class ListingHandlers(Protocol):
    """What a listing needs of the router's handlers (``http.app.RouteHandlers``): the config,
    the key check with admission, and the grant's rate headers."""

    config: AppConfig

    async def authorize(
        self,
        request: Request,
        credentials: HTTPAuthorizationCredentials | None,
        model: str | None,
        endpoint: str,
        estimate: int = 0,
    ) -> Any: ...

    def apply_headers(self, response: Response, grant: Any) -> None: ...


LISTING_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (401, 500)
}
# The endpoints with a listing of their own: the contract's and api-notes.md's, then apply's and
# decisions' (so a client can find the model each serves), in the same shape.
LISTINGS: dict[str, Endpoint] = {
    "/v1/chat/completions/models": "chat.completions",
    "/v1/fim/completions/models": "fim.completions",
    "/v1/edit/completions/models": "edit.completions",
    "/v1/apply/completions/models": "apply.completions",
    "/v1/decisions/models": "decisions",
}


def register_listings(app: FastAPI, handlers: ListingHandlers, bearer: HTTPBearer) -> None:
    """Add the overall listing and one listing per endpoint to ``app``."""
    app.get("/v1/models", response_model=ModelList, responses=LISTING_ERRORS, name="list_models")(
        listing_route(handlers, bearer, None)
    )
    for path, endpoint in LISTINGS.items():
        app.get(
            path,
            response_model=EndpointModelList,
            responses=LISTING_ERRORS,
            name=f"list_{endpoint.split('.')[0]}_models",
        )(listing_route(handlers, bearer, endpoint))


def listing_route(handlers: ListingHandlers, bearer: HTTPBearer, endpoint: Endpoint | None) -> Any:
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
            return ModelList(data=[served_card(config, model.id) for model in visible])
        cards = [
            served_card(config, model.id, endpoint)
            for model in visible
            if endpoint in config.endpoints_of(model.id)
        ]
        return EndpointModelList(data=cards)

    return list_models
