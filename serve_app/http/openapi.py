"""The OpenAPI document's one tweak over FastAPI's: no implicit 422 where the route answers 400."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from serve_app.http.errors import VALIDATION_422_PATHS


def openapi_without_implicit_422(app: FastAPI) -> dict[str, Any]:
    """FastAPI documents a 422 on every route with a body; only /v1/decisions answers 422
    (the others answer validation failures with 400), so the document says exactly that."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        document = get_openapi(
            title=app.title, version=app.version, routes=app.routes, summary=app.summary
        )
        for path, operations in document["paths"].items():
            if path not in VALIDATION_422_PATHS:
                for operation in operations.values():
                    operation.get("responses", {}).pop("422", None)
        app.openapi_schema = document
    return app.openapi_schema
