"""What a person typing in the playground feels: key pressed to ghost text on screen.

    python -m bench.playground --key $KEY [--url http://127.0.0.1:8000] [--sessions 6]
        [--keystrokes 12] [--seed N] [--screenshot docs/playground.png]

A headless Chromium (``bench.browser``) opens the page a running service serves (``make run``)
and types into its FIM pane. Each session is a place in a standard-library module, as
``bench.keystroke`` draws them: ~1,000 tokens of the file before a line and ~300 after it are
put in the pane with the caret at the line's start, then the line is typed one key at a time,
each key once the last key's suggestion is on screen (prefix grows by a character, the suffix
stays, the same file again: the cached path). Per key the page itself records the time from
the key's input event to the suggestion drawn, and the HTTP round trip of its request.

Figures: key to ghost text, p50 and p90, over every key after a session's first; the first
key of each session (its prompt cold); the share of keys drawn within Zed's 0.3 s. The
baseline is the request's own round trip as the page saw it, measured on the same keys: the
ratio is what the page adds (its debounce, drawing) to what an editor plugin would wait for.
With ``--screenshot``, the page's own example file with two keys typed is shot afterwards.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field

from bench.browser import chromium, find_chromium
from bench.common import DEFAULT_URL, cpu_flags, percentile, table
from bench.keystroke import TypingSession, typing_sessions

BUDGET_S = 0.3  # Zed's aim per edit prediction
ANSWER_TIMEOUT_MS = 180_000  # a session's first key reads ~1,300 prompt tokens cold
STATS = "#fim-stats"
CODE = "#fim-editor textarea"


@dataclass
class Keys:
    """Per-key times in seconds: key to ghost text, and the request's round trip within it."""

    to_ghost: list[float] = field(default_factory=list)
    round_trip: list[float] = field(default_factory=list)
    first: list[float] = field(default_factory=list)


def open_playground(browser, url: str, key: str):  # noqa: ANN001, ANN201 - Playwright objects
    from playwright.sync_api import expect

    page = browser.new_page(viewport={"width": 1100, "height": 720})
    page.goto(url.rstrip("/") + "/")
    page.fill("#api-key", key)
    page.click("#use-key")
    expect(page.locator("#key-status")).to_contain_text("key accepted", timeout=ANSWER_TIMEOUT_MS)
    return page


def press_and_wait(page, char: str, sequence: int) -> tuple[float, float]:  # noqa: ANN001
    """Type ``char`` and wait for the suggestion of request ``sequence`` to be drawn."""
    from playwright.sync_api import expect

    page.keyboard.type(char)
    stats = page.locator(STATS)
    try:
        expect(stats).to_have_attribute("data-sequence", str(sequence), timeout=ANSWER_TIMEOUT_MS)
    except AssertionError:
        shown = page.locator("#fim-error").text_content() or "nothing"
        message = f"no suggestion drawn for key {sequence}; the page shows: {shown}"
        raise SystemExit(message) from None
    to_ghost = float(stats.get_attribute("data-latency-ms") or "nan") / 1000
    round_trip = float(stats.get_attribute("data-round-trip-ms") or "nan") / 1000
    return to_ghost, round_trip


def type_session(page, session: TypingSession, sequence: int, keys: Keys) -> int:  # noqa: ANN001
    """Put the session's file in the pane, type its line's first keys; the last sequence."""
    code = page.locator(CODE)
    code.evaluate(
        "(pane, [text, caret]) => { pane.value = text; pane.focus();"
        " pane.setSelectionRange(caret, caret); }",
        [session.prefix + session.suffix, len(session.prefix)],
    )
    for index, char in enumerate(session.line[: session.keystrokes]):
        sequence += 1
        to_ghost, round_trip = press_and_wait(page, char, sequence)
        if index == 0:
            keys.first.append(to_ghost)
        else:
            keys.to_ghost.append(to_ghost)
            keys.round_trip.append(round_trip)
    return sequence


def screenshot(browser, url: str, key: str, path: str) -> None:  # noqa: ANN001
    """The page's own example with two keys typed (the second on the cached path) and the
    suggestion showing."""
    page = open_playground(browser, url, key)
    page.click(CODE)
    page.keyboard.press("Control+End")
    for sequence, char in enumerate("fi", start=1):
        press_and_wait(page, char, sequence)
    page.screenshot(path=path)
    page.close()


def report(keys: Keys, sessions: int, seed: int, url: str) -> None:
    within = sum(t <= BUDGET_S for t in keys.to_ghost) / max(len(keys.to_ghost), 1)
    p50, p50_trip = statistics.median(keys.to_ghost), statistics.median(keys.round_trip)
    rows = [
        ["figure", "playground", "its request's round trip", "ratio"],
        ["key to ghost text, p50", f"{p50:.3f} s", f"{p50_trip:.3f} s", f"{p50 / p50_trip:.2f}x"],
        [
            "key to ghost text, p90",
            f"{percentile(keys.to_ghost, 90):.3f} s",
            f"{percentile(keys.round_trip, 90):.3f} s",
            f"{percentile(keys.to_ghost, 90) / percentile(keys.round_trip, 90):.2f}x",
        ],
        ["a session's first key, p50", f"{statistics.median(keys.first):.3f} s", "", ""],
        [f"keys drawn within {BUDGET_S} s", f"{within:.0%}", "", ""],
    ]
    print(f"# bench.playground: {url}, {sessions} sessions, seed {seed}")
    print(f"# cpu: {cpu_flags()}")
    print(f"# {len(keys.to_ghost)} keys after a session's first, {time.strftime('%H:%M UTC')}")
    print(table(rows))


def main() -> None:
    import argparse
    import os

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("SERVE_APP_URL", DEFAULT_URL))
    parser.add_argument("--key", default=os.environ.get("SERVE_APP_API_KEY"))
    parser.add_argument("--sessions", type=int, default=6)
    parser.add_argument("--keystrokes", type=int, default=12)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--screenshot", default=None, help="a PNG path for the page's picture")
    args = parser.parse_args()
    executable = find_chromium()
    if executable is None:
        raise SystemExit("no Chromium found: apt install chromium, or set SERVE_APP_CHROMIUM")
    seed = args.seed if args.seed is not None else random.randrange(10**6)
    sessions = typing_sessions(args.sessions, args.keystrokes, seed)
    keys = Keys()
    with chromium(executable) as browser:
        page = open_playground(browser, args.url, args.key)
        sequence = 0
        for session in sessions:
            sequence = type_session(page, session, sequence, keys)
        page.close()
        if args.screenshot:
            screenshot(browser, args.url, args.key, args.screenshot)
    report(keys, len(sessions), seed, args.url)


if __name__ == "__main__":
    main()
