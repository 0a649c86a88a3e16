"""The HTTP face of the service: a FastAPI app built from deployment handles.

Routes stay thin: validate (pydantic), authorize through the auth deployment, dispatch to the
model deployment, and record usage. The app is a plain object built from ``Backends``, so the
router deployment wraps it and fast tests drive it with the same handles.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, NoReturn, Protocol

from fastapi import Depends, FastAPI, Request, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from serve_app import __version__, metrics
from serve_app.api.apply import ApplyCompletionRequest
from serve_app.api.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionRequest
from serve_app.api.common import CompletionUsage, ErrorResponse, HTTPValidationError
from serve_app.api.decisions import DecisionRequest, DecisionResponse, DecisionUsage
from serve_app.api.edit import EditCompletion, EditCompletionRequest
from serve_app.api.fim import FimCompletion, FimCompletionChunk, FimCompletionRequest
from serve_app.auth.keys import hash_key
from serve_app.config import AppConfig, EngineRole
from serve_app.errors import (
    ModelNotFoundError,
    ServiceError,
    UpstreamBadResponseError,
    UpstreamUnavailableError,
)
from serve_app.http.errors import as_service_error, install_error_handlers, replica_lost
from serve_app.http.listings import register_listings
from serve_app.http.middleware import Authenticate, BoundedBody, RequestId, RequestMetrics
from serve_app.http.openapi import openapi_without_implicit_422
from serve_app.http.playground import register_playground
from serve_app.http.sse import open_event_stream, sse_event, within
from serve_app.serving.admission import Refunds, decision_tokens, generation_tokens
from serve_app.serving.billing import (
    Ledger,
    RequestContext,
    bill_if_replica_lost,
    bill_lost_answer,
    cache_salt_for,
    ledger_write,
)
from serve_app.serving.spool import LedgerSpool

logger = logging.getLogger(__name__)

bearer = HTTPBearer(auto_error=False, description="Authorization: Bearer <API_KEY>")

COMMON_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 402, 404, 413, 429, 500, 503, 504)
}
DECISION_ERRORS: dict[int | str, dict[str, Any]] = {
    **{code: {"model": ErrorResponse} for code in (401, 402, 404, 413, 429, 500, 502, 503, 504)},
    422: {"model": HTTPValidationError | ErrorResponse},
}
MAX_RECENT_KEYS = 10_000
# The router's timeout backstop: past the model deployment's own deadline, which answers first.
BACKSTOP_GRACE_S = 5.0
# What the backstop answers: the deadline of a replica that has the request answers 504 first,
# so reaching it means no replica took the request (none running: a lost node, replicas still
# starting) or the one that did stopped answering. Retryable: 503 with Retry-After.
NO_ANSWER = "No model replica answered in time. Please retry."
SSE_RESPONSE = {"description": "text/event-stream of chunks, ending with `data: [DONE]`."}


class RemoteMethod(Protocol):
    """A deployment's method as its handle exposes it: ``.remote(body, context)``."""

    def remote(self, body: Any, context: RequestContext) -> Any: ...


@dataclass
class Backends:
    """Handles to the other deployments of the graph (Ray DeploymentHandles in production)."""

    auth: Any
    scorer: Any
    edit: Any
    fim: Any


@dataclass(frozen=True)
class ModelRoute:
    """One model route: its ``name`` (``<name>.completions`` is its endpoint for billing and
    metrics, unless ``billed_as`` names another), path and wire models, the role whose model
    it serves, the deployment method it calls (``unary``) and the one it streams from
    (``streaming``; None: no stream), each read off the ``Backends``, and whether the config
    enables it."""

    name: str
    path: str
    body: type
    answer: type
    role: EngineRole
    unary: Callable[[Backends], RemoteMethod]
    streaming: Callable[[Backends], RemoteMethod] | None = None
    enabled: Callable[[AppConfig], bool] = lambda config: True
    description: str | None = None
    extra_errors: tuple[int, ...] = ()  # statuses beyond ``COMMON_ERRORS`` it may answer
    billed_as: str | None = None
    errors: dict[int | str, dict[str, Any]] | None = None  # None: COMMON_ERRORS + extra_errors
    estimate: Callable[[AppConfig, Any, int], int] = generation_tokens  # its reservation

    @property
    def endpoint(self) -> str:
        return self.billed_as or f"{self.name}.completions"

    @property
    def responses(self) -> dict[int | str, dict[str, Any]]:
        """The statuses the OpenAPI document lists for the route."""
        responses = dict(self.errors or COMMON_ERRORS)
        responses.update({code: {"model": ErrorResponse} for code in self.extra_errors})
        if self.streaming is not None:
            responses[200] = {"content": {"text/event-stream": SSE_RESPONSE}}
        return responses


FIM_ROUTE = ModelRoute(
    "fim",
    "/v1/fim/completions",
    FimCompletionRequest,
    FimCompletion,
    "fim",
    lambda backends: backends.fim.complete,
    lambda backends: backends.fim.options(stream=True).stream,
)
MODEL_ROUTES = (
    # Decisions answer 422 where the others answer 400 (api-spec.md 7.1).
    ModelRoute(
        "decisions", "/v1/decisions", DecisionRequest, DecisionResponse, "decisions",
        lambda backends: backends.scorer.decide,
        billed_as="decisions", errors=DECISION_ERRORS, estimate=decision_tokens,
    ),
    ModelRoute(
        "edit", "/v1/edit/completions", EditCompletionRequest, EditCompletion, "edit",
        lambda backends: backends.edit.edit,
    ),
    FIM_ROUTE,
    # The OpenAI legacy path is the same FIM service: clients post FIM there.
    replace(FIM_ROUTE, path="/v1/completions"),
    ModelRoute(
        "chat", "/v1/chat/completions", ChatCompletionRequest, ChatCompletion, "edit",
        lambda backends: backends.edit.chat,
        lambda backends: backends.edit.options(stream=True).chat_stream,
        enabled=lambda config: bool(config.roles.chat),
    ),
    ModelRoute(
        "apply", "/v1/apply/completions", ApplyCompletionRequest, ChatCompletion, "edit",
        lambda backends: backends.edit.apply,
        lambda backends: backends.edit.options(stream=True).apply_stream,
        description="Merge an update snippet into code; served by the edit model's deployment.",
        extra_errors=(422,),  # merge_failed: no merge keeps the original code
    ),
)  # fmt: skip


def build_router_app(
    config: AppConfig, backends: Backends, *, add_request_id: bool = True
) -> FastAPI:
    """The router's FastAPI app. Behind Ray Serve's proxy, which already answers with
    ``x-request-id`` (and logs it), pass ``add_request_id=False`` so it is not sent twice."""
    docs_off = config.auth.docs == "off"
    app = FastAPI(
        title="Language-Model Decision, Code-Edit and Fill-in-the-Middle API",
        version="1.0.0",
        summary=f"serve-app {__version__}",
        docs_url=None if docs_off else "/docs",
        redoc_url=None if docs_off else "/redoc",
        openapi_url=None if docs_off else "/openapi.json",
    )
    handlers = RouteHandlers(config, backends)
    handlers.register(app)
    open_paths = {"/health"}
    if config.auth.playground:
        open_paths |= register_playground(app)
    app.openapi = lambda: openapi_without_implicit_422(app)
    install_error_handlers(app)
    paths = frozenset(route.path for route in app.routes)
    guarded = paths - open_paths
    if config.auth.docs == "open":
        guarded -= {"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}
    # Outermost last: request id -> metrics -> key check -> bounded body -> routes.
    app.add_middleware(
        BoundedBody,
        max_bytes=config.limits.max_body_bytes,
        timeout_s=config.limits.body_timeout_s,
    )
    app.add_middleware(Authenticate, authenticate=handlers.authenticate, paths=guarded)
    app.add_middleware(RequestMetrics, paths=paths)
    if add_request_id:
        app.add_middleware(RequestId)
    return app


class RouteHandlers:
    """What the HTTP routes run: the key check, admission, the one dispatch path of a model
    route, streaming and billing hooks. (``Router`` is the ingress deployment serving them.)"""

    def __init__(self, config: AppConfig, backends: Backends) -> None:
        self.config = config
        self.backends = backends
        self.model_ids = frozenset(model.id for model in config.models)
        self.recent_keys: dict[str, float] = {}  # key digest -> trusted until (monotonic)
        self.refunds = Refunds(backends.auth.release)
        # The rows only the router can write: streams whose replica died (billing.py).
        self.ledger = Ledger(ledger_write(backends.auth), LedgerSpool(config.ledger_spool))

    def register(self, app: FastAPI) -> None:
        for route in MODEL_ROUTES:
            app.post(
                route.path,
                response_model=route.answer,
                responses=route.responses,
                name=route.name,
                description=route.description,
            )(self.model_endpoint(route))
        register_listings(app, self, bearer)
        app.get("/health", include_in_schema=False)(self.health)

    def model_endpoint(self, route: ModelRoute) -> Callable[..., Awaitable[Any]]:
        """The FastAPI endpoint of ``route``: its body validates as ``route.body``."""

        async def endpoint(
            request: Request,
            body: Any,
            response: Response,
            credentials: HTTPAuthorizationCredentials | None = Depends(bearer),
        ) -> Any:
            return await self.dispatch(request, response, credentials, body, route)

        endpoint.__annotations__["body"] = route.body  # what FastAPI validates and documents
        return endpoint

    # --- auth and usage -------------------------------------------------------------------

    async def authenticate(self, key: str | None) -> None:
        """The key check the middleware runs before the body is read (401/402). A key that
        passed is trusted for ``cache_ttl_s`` (as the auth replicas' own cache), so a busy
        client costs no extra hop; the route's ``authorize`` checks everything again."""
        digest = hash_key(key) if key else None
        now = time.monotonic()
        if digest is not None and self.recent_keys.get(digest, 0.0) > now:
            return
        await self.backends.auth.authenticate.remote(key)
        if digest is not None:
            if len(self.recent_keys) >= MAX_RECENT_KEYS:
                self.recent_keys.clear()
            self.recent_keys[digest] = now + self.config.auth.cache_ttl_s

    async def authorize(
        self,
        request: Request,
        credentials: HTTPAuthorizationCredentials | None,
        model: str | None,
        endpoint: str,
        estimate: int = 0,
    ) -> Any:
        """Check the key and admit the request, reserving ``estimate`` tokens."""
        # A metric label: only ids we serve, so arbitrary client strings never become labels.
        request.state.model = model if model in self.model_ids else "other"
        key = credentials.credentials if credentials else None
        try:
            return await self.backends.auth.authorize.remote(key, model, endpoint, estimate)
        except Exception as exc:
            error = as_service_error(exc)
            metrics.auth_rejections().inc(tags={"reason": error.code or "unknown"})
            raise error from None

    def context(self, grant: Any, model: str, endpoint: str) -> RequestContext:
        """What the model deployment needs to bill the request and pick its cache partition."""
        salt = cache_salt_for(grant.account_id, self.config.engine.shared_prefix_cache)
        deadline = time.time() + self.timeout_s(endpoint)
        return RequestContext(
            grant=grant, model=model, endpoint=endpoint, cache_salt=salt, deadline=deadline
        )

    def release(self, grant: Any) -> None:
        """Refund a reservation no ledger row may have settled (the model deployment bills
        what it processed)."""
        self.refunds.refund(grant)

    async def call(
        self,
        grant: Any,
        model: str,
        endpoint: str,
        method: RemoteMethod,
        body: Any,
        answer: type,
    ) -> Any:
        """One model call, its answer checked to be an ``answer``. The model deployment
        enforces the request timeout and writes the ledger row (serve_app.serving.billing);
        the router's own timeout is a backstop just past it that cancels the call, so the
        engine slot is freed either way."""
        context = self.context(grant, model, endpoint)
        response = method.remote(body, context)
        answered = False
        try:
            result = await within(_await(response), self.backstop_s(endpoint))
            answered = True
        except asyncio.CancelledError:  # the client went away: stop the model's work
            response.cancel()
            raise
        except TimeoutError:
            response.cancel()
            raise UpstreamUnavailableError(NO_ANSWER) from None
        except Exception as exc:
            if replica_lost(exc):
                await bill_lost_answer(self.ledger, context)
            raise as_service_error(exc) from None
        finally:
            if not answered:
                self.release(grant)
        result = _checked(result, answer)
        _count_tokens(model, endpoint, result.usage)
        return result

    def timeout_s(self, endpoint: str) -> float:
        """The request deadline of ``endpoint``; the model deployment enforces it, counted
        from here (``RequestContext.deadline``)."""
        if endpoint == "decisions":
            return self.config.limits.decision_timeout_s
        return self.config.limits.request_timeout_s

    def backstop_s(self, endpoint: str) -> float:
        """How long the router waits for a model deployment's answer, or a stream's first
        chunk: just past the deployment's own deadline (see ``NO_ANSWER``)."""
        return self.timeout_s(endpoint) + BACKSTOP_GRACE_S

    def require_role(self, grant: Any, model: str, role: EngineRole) -> None:
        """The request's model must be the one ``role`` serves. A model served on other
        endpoints is named as such, with the model served here, where the account may see
        it (the listings show the same)."""
        served_here = self.config.roles.model_for(role)
        if model == served_here:
            return
        known = any(m.id == model for m in self.config.models)
        elsewhere = self.config.endpoints_of(model) if known else []
        if not elsewhere:
            self.refuse(grant, ModelNotFoundError(model))
        visible = grant.models is None or served_here in grant.models
        here = f"; this endpoint serves '{served_here}'" if visible else ""
        message = (
            f"The model '{model}' is not served on this endpoint (it serves "
            f"{', '.join(elsewhere)}){here}. Each endpoint's listing (GET "
            "/v1/fim/completions/models, /v1/decisions/models, ...) names its models."
        )
        self.refuse(grant, ModelNotFoundError(model, message=message))

    def refuse(self, grant: Any, error: ServiceError) -> NoReturn:
        """Refuse an admitted request before any model work: its reservation is refunded."""
        self.release(grant)
        raise error

    # --- endpoints --------------------------------------------------------------------------

    async def dispatch(
        self,
        request: Request,
        response: Response,
        credentials: HTTPAuthorizationCredentials | None,
        body: Any,
        route: ModelRoute,
    ) -> Any:
        """The one path of a model route: authorize (reserving the estimate), rate headers,
        the role check (a disabled endpoint is an unknown model), then stream or call, and
        check the answer's shape. An alias is resolved first: the answer names the model's id."""
        body.model = self.config.resolve_model_id(body.model)
        estimate = route.estimate(self.config, body, len(await request.body()))
        grant = await self.authorize(request, credentials, body.model, route.endpoint, estimate)
        _apply_headers(response, grant)
        if not route.enabled(self.config):
            self.refuse(grant, ModelNotFoundError(body.model))
        self.require_role(grant, body.model, route.role)
        if route.streaming is not None and body.stream:
            context = self.context(grant, body.model, route.endpoint)
            chunks = route.streaming(self.backends).remote(body, context)
            billed = bill_if_replica_lost(
                _cancel_on_close(chunks), self.ledger, context, replica_lost
            )
            return await self.stream(grant, body.model, route.endpoint, billed, body.include_usage)
        method = route.unary(self.backends)
        return await self.call(grant, body.model, route.endpoint, method, body, route.answer)

    async def stream(
        self, grant: Any, model: str, endpoint: str, chunks: Any, include_usage: bool
    ) -> Response:
        """SSE answer; the model deployment always ends with a usage chunk (no choices) and
        bills the stream itself, however it ends, unless its replica dies mid-stream: then
        ``chunks`` (``bill_if_replica_lost``) bills what was delivered and ends with a usage
        chunk of it before the error (serve_app.serving.billing)."""

        def render(chunk: FimCompletionChunk | ChatCompletionChunk) -> str | None:
            is_usage_chunk = not chunk.choices
            if is_usage_chunk and not include_usage:
                return None
            return sse_event(chunk.model_dump(exclude=None if is_usage_chunk else {"usage"}))

        async def on_finish(last: Any) -> None:
            # Content chunks carry running usage too; only the usage chunk ends a whole answer.
            usage = last.usage if last is not None and not last.choices else None
            if usage is None:  # ended early: the model side billed what it processed
                self.release(grant)
            _count_tokens(model, endpoint, usage)

        try:
            return await open_event_stream(
                chunks,
                render,
                on_finish,
                headers=_rate_headers(grant),
                first_within_s=self.backstop_s(endpoint),
            )
        except BaseException as exc:
            self.release(grant)
            if not isinstance(exc, Exception):
                raise
            if isinstance(exc, TimeoutError):  # the first chunk never came: cancelled
                raise UpstreamUnavailableError(NO_ANSWER) from None
            raise as_service_error(exc) from None

    @staticmethod
    def apply_headers(response: Response, grant: Any) -> None:
        """The grant's rate-limit headers on a plain (non-streaming) answer."""
        _apply_headers(response, grant)

    async def health(self, request: Request) -> dict[str, str]:
        return {"status": "ok"}


async def _await(response: Any) -> Any:
    return await response


def _count_tokens(model: str, endpoint: str, usage: CompletionUsage | DecisionUsage | None) -> None:
    if usage is None:
        return
    input_tokens, output_tokens = usage.token_counts
    if input_tokens or output_tokens:
        tags = {"endpoint": endpoint, "model": model}
        metrics.tokens().inc(input_tokens, tags={**tags, "direction": "input"})
        metrics.tokens().inc(output_tokens, tags={**tags, "direction": "output"})


def _checked(result: Any, expected: type) -> Any:
    """A model deployment that answers the wrong shape is a 502, not a 500 or a bad 200."""
    if not isinstance(result, expected):
        logger.error("upstream returned %s, expected %s", type(result).__name__, expected.__name__)
        raise UpstreamBadResponseError()
    return result


def _rate_headers(grant: Any) -> dict[str, str]:
    return dict(getattr(grant, "headers", None) or {})


def _apply_headers(response: Response, grant: Any) -> None:
    response.headers.update(_rate_headers(grant))


async def _cancel_on_close(chunks: Any) -> AsyncIterator[Any]:
    """Iterate a streaming handle; when the client goes away, cancel the upstream request so
    the engine frees the slot at its next step."""
    finished = False
    try:
        async for chunk in chunks:
            yield chunk
        finished = True
    finally:
        if not finished and hasattr(chunks, "cancel"):
            chunks.cancel()
