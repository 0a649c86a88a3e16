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
from pathlib import PurePath

from fastapi import FastAPI, Response

PAGE_PATH = "/"
ASSET_PREFIX = "/playground/"
PAGE_FILE = "playground.html"
# The files served under ASSET_PREFIX, by suffix: the page's modules, its style and its icon.
# Each becomes a route of its own when the app is built; nothing is looked up from a request.
MEDIA_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
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


def static_files() -> dict[str, tuple[bytes, str]]:
    """Every path the playground answers, with its body and media type."""
    folder = resources.files(__package__) / "static"
    files = {PAGE_PATH: ((folder / PAGE_FILE).read_bytes(), "text/html; charset=utf-8")}
    for entry in sorted(folder.iterdir(), key=lambda entry: entry.name):
        media_type = MEDIA_TYPES.get(PurePath(entry.name).suffix)
        if media_type is not None:
            files[ASSET_PREFIX + entry.name] = (entry.read_bytes(), media_type)
    return files


def register_playground(app: FastAPI) -> frozenset[str]:
    """Serve the page at ``/`` and its files under ``/playground/``; the paths, which are open
    to anyone (like ``/health``)."""
    files = static_files()

    def serve(body: bytes, media_type: str) -> Callable[[], Awaitable[Response]]:
        async def route() -> Response:
            return Response(body, media_type=media_type, headers=HEADERS)

        return route

    for path, (body, media_type) in files.items():
        app.get(path, include_in_schema=False)(serve(body, media_type))
    return frozenset(files)
