"""A headless Chromium for the playground's tests and bench: the machine's own browser (Debian's
``chromium`` package, or ``$SERVE_APP_CHROMIUM``), driven by Playwright; Playwright never
downloads one.

The flags keep Chromium off the network except for the page under test: without them it
reaches for Google's update, sync and field-trial hosts at start, which a machine with no
internet refuses.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
QUIET_FLAGS = (
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-quic",
)


def find_chromium() -> str | None:
    """The browser to drive: ``$SERVE_APP_CHROMIUM``, else the first of ``BROWSER_NAMES`` on
    PATH; ``None`` when there is none."""
    configured = os.environ.get("SERVE_APP_CHROMIUM")
    if configured:
        return configured
    return next((path for name in BROWSER_NAMES if (path := shutil.which(name))), None)


@contextmanager
def chromium(executable: str) -> Iterator[Any]:
    """A Playwright ``Browser`` on ``executable``. As root (CI's containers) Chromium's sandbox
    cannot start, so it runs without one there; the pages it loads are the project's own."""
    from playwright.sync_api import sync_playwright

    flags = [*QUIET_FLAGS, *(("--no-sandbox",) if os.geteuid() == 0 else ())]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=flags)
        try:
            yield browser
        finally:
            browser.close()
