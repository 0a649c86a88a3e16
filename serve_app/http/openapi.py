"""The OpenAPI document's one tweak over FastAPI's: no implicit 422 where the route answers 400."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from serve_app.http.errors import VALIDATION_422_PATHS


def openapi_without_implicit_422(app: FastAPI) -> dict[str, Any]:
    """FastAPI documents a 422 validation error on every route with a body; only
    /v1/decisions answers validation failures with 422 (the others with 400), so the document
    says exactly that."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        document = get_openapi(
            title=app.title, version=app.version, routes=app.routes, summary=app.summary
        )
        for path, operations in document["paths"].items():
            if path not in VALIDATION_422_PATHS:
                for operation in operations.values():
                    responses = operation.get("responses", {})
                    if "HTTPValidationError" in str(responses.get("422")):
                        del responses["422"]  # implicit; a route's own 422 (apply's) stays
        app.openapi_schema = document
    return app.openapi_schema
