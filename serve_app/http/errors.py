"""The one place where exceptions become HTTP answers in the contract's shape.

Every handler is registered by ``install_error_handlers``; nothing else in the project builds
an error body. Server failures answer a fixed message: no traceback, no internals.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from serve_app.api.common import ErrorInfo, ErrorResponse
from serve_app.errors import (
    InvalidRequestError,
    NotFoundError,
    ServerError,
    ServiceError,
    UpstreamBadResponseError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)

logger = logging.getLogger(__name__)

# Paths whose validation failures answer FastAPI's 422 HTTPValidationError (api-spec.md 7.1);
# every other endpoint answers 400 invalid_request_error naming the parameter (api-notes.md).
VALIDATION_422_PATHS = frozenset({"/v1/decisions"})
# What a 422 may echo of the input: a few errors, each input a short preview.
MAX_ERRORS_SHOWN = 10
MAX_ECHO_CHARS = 256
MAX_ECHO_ITEMS = 32


def error_body(exc: ServiceError) -> ErrorResponse:
    # A ServerError's own message is for the log (it may quote an exception); clients get
    # the fixed one.
    message = exc.default_message if isinstance(exc, ServerError) else exc.message
    return ErrorResponse(
        error=ErrorInfo(message=message, type=exc.error_type, param=exc.param, code=exc.code)
    )


def error_response(exc: ServiceError) -> JSONResponse:
    return JSONResponse(
        error_body(exc).model_dump(), status_code=exc.status_code, headers=exc.headers or None
    )


def as_service_error(exc: BaseException) -> ServiceError:
    """Classify any exception, including Ray's, into a typed service error."""
    from ray import exceptions as ray_errors
    from ray.serve import exceptions as serve_errors

    if isinstance(exc, ray_errors.RayTaskError) and isinstance(exc.cause, BaseException):
        exc = exc.cause
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return UpstreamTimeoutError()
    if isinstance(exc, serve_errors.BackPressureError | serve_errors.DeploymentUnavailableError):
        return UpstreamUnavailableError()
    if isinstance(exc, ray_errors.RayActorError | serve_errors.ReplicaUnavailableError):
        return UpstreamUnavailableError("The model replica serving this request stopped. Retry.")
    if isinstance(exc, ray_errors.RayError):
        return UpstreamBadResponseError()
    return ServerError()


def replica_lost(error: BaseException) -> bool:
    """Whether ``error`` says the replica serving a call is gone (its process or its node
    died), so it wrote no ledger row. Ray raises these itself; an error the replica raised
    reaches the caller as a ``RayTaskError`` (and may subclass its cause): the replica lived
    to bill it."""
    from ray import exceptions as ray_errors
    from ray.serve import exceptions as serve_errors

    if isinstance(error, ray_errors.RayTaskError):
        return False
    return isinstance(error, ray_errors.RayActorError | serve_errors.ReplicaUnavailableError)


def _preview(value: Any) -> Any:
    """``value`` when small; else a string of its beginning (an 8 MiB body was echoed whole)."""
    if isinstance(value, str):
        return value if len(value) <= MAX_ECHO_CHARS else value[:MAX_ECHO_CHARS] + "..."
    if isinstance(value, dict | list) and len(value) > MAX_ECHO_ITEMS:
        return f"<{type(value).__name__} of {len(value)} items>"
    if isinstance(value, dict | list):
        text = repr(value)
        return value if len(text) <= MAX_ECHO_CHARS else text[:MAX_ECHO_CHARS] + "..."
    return value


def validation_param(errors: list[dict]) -> str | None:
    """The top-level request field a validation failure is about (``param`` of the wire)."""
    for error in errors:
        loc = [part for part in error.get("loc", ()) if part != "body"]
        if loc and isinstance(loc[0], str):  # not the character offset of a JSON syntax error
            return loc[0]
    return None


def validation_message(errors: list[dict]) -> str:
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        reason = (first.get("ctx") or {}).get("error")
        return f"The request body is not valid JSON: {reason}." if reason else first["msg"]
    loc = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
    message = str(first.get("msg", "Invalid request."))
    message = message.removeprefix("Value error, ")
    return f"{loc}: {message}" if loc else message


async def _on_service_error(request: Request, exc: ServiceError) -> JSONResponse:
    if exc.status_code >= 500:
        logger.warning("request failed: %s %s", type(exc).__name__, exc.message)
    return error_response(exc)


async def _on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    errors = list(exc.errors())
    content_type = request.headers.get("content-type", "")
    if "json" not in content_type and any(tuple(e.get("loc", ())) == ("body",) for e in errors):
        # FastAPI reads a body as JSON only when it says so (a guard against cross-site
        # requests); otherwise its error ("a valid dictionary") does not say what to change.
        said = f"Content-Type {content_type!r}" if content_type else "no Content-Type"
        errors = [
            {
                "type": "content_type",
                "loc": ("body",),
                "msg": f"Send the body as JSON with Content-Type: application/json ({said}).",
                "input": {},
            }
        ]
    if request.url.path in VALIDATION_422_PATHS:
        # Never echo a large input back: the first errors, each input cut to a preview.
        errors = [{**e, "input": _preview(e.get("input"))} for e in errors[:MAX_ERRORS_SHOWN]]
        try:
            return JSONResponse({"detail": jsonable_encoder(errors)}, status_code=422)
        except ValueError:
            # An echoed input JSON cannot carry (1e309 parses to inf): answer without the
            # echoes rather than fail rendering the answer (was a 500).
            bare = [{k: v for k, v in e.items() if k not in ("input", "ctx")} for e in errors]
            return JSONResponse({"detail": jsonable_encoder(bare)}, status_code=422)
    invalid = InvalidRequestError(validation_message(errors), param=validation_param(errors))
    return error_response(invalid)


async def _on_http_exception(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if exc.status_code == 404:
        return error_response(NotFoundError(f"Unknown path: {request.url.path}"))
    if exc.status_code == 405:
        return error_response(
            InvalidRequestError(f"Method {request.method} is not allowed on {request.url.path}.")
        )
    if exc.status_code == 400:
        # FastAPI's answer to a body it could not read at all (not UTF-8, nested past the
        # parser's recursion limit, a broken form): the same contract error as invalid JSON,
        # so /v1/decisions keeps to its status list (422, api-spec.md 7.1).
        unreadable = {
            "type": "json_invalid",
            "loc": ("body",),
            "msg": "The request body could not be read as JSON.",
            "input": {},
        }
        return await _on_validation_error(request, RequestValidationError([unreadable]))
    error = ServiceError(str(exc.detail))
    error.status_code = exc.status_code
    client_error = exc.status_code < 500
    error.error_type = "invalid_request_error" if client_error else "server_error"
    error.code = "invalid_value" if client_error else "server_error"
    return error_response(error)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    classified = as_service_error(exc)
    if isinstance(classified, ServerError):
        logger.exception("unexpected error on %s", request.url.path, exc_info=exc)
    return error_response(classified)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ServiceError, _on_service_error)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_exception)
    app.add_exception_handler(Exception, _on_unexpected)
