"""The browser playground: a static page at ``/`` that calls the public API with a key the
user pastes into it. It holds no privilege of its own: the page, its script and its style are
plain files anyone may fetch, and every request it makes is an ordinary API call with that key.

The policy below allows scripts and styles from this origin only (no inline script, no eval),
calls to this origin only, and no framing, so the page cannot be made to send the key anywhere
else or be overlaid by another site.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import resources

from fastapi import FastAPI, Response

PAGE_PATH = "/"
ASSET_PREFIX = "/playground/"
# name -> media type: the only files served; nothing is looked up from the request's path.
ASSETS = {
    "playground.js": "text/javascript; charset=utf-8",
    "playground.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
}
CONTENT_SECURITY_POLICY = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "img-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def playground_paths() -> frozenset[str]:
    """The paths the playground answers: open to anyone, like ``/health``."""
    return frozenset({PAGE_PATH, *(ASSET_PREFIX + name for name in ASSETS)})


def register_playground(app: FastAPI) -> None:
    """Serve the page at ``/`` and its two assets under ``/playground/``."""
    files = resources.files(__package__) / "static"
    page = (files / "playground.html").read_bytes()

    def serve(body: bytes, media_type: str) -> Callable[[], Awaitable[Response]]:
        async def route() -> Response:
            return Response(body, media_type=media_type, headers=HEADERS)

        return route

    app.get(PAGE_PATH, include_in_schema=False)(serve(page, "text/html; charset=utf-8"))
    for name, media_type in ASSETS.items():
        body = (files / name).read_bytes()
        app.get(ASSET_PREFIX + name, include_in_schema=False)(serve(body, media_type))
