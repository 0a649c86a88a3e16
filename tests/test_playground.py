"""The browser playground (``serve_app/http/playground.py``): the page over HTTP, then a real
headless Chromium driving it against the real graph (tiny model).

The browser tests need a Chromium on the machine (Debian's ``chromium``, which .ci/run
installs); without one they are skipped, and ``-ra`` says so in the summary.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any

import pytest

from bench.browser import chromium, find_chromium
from serve_app.http.playground import ASSET_PREFIX, static_files
from serve_app.testing import local_router_app
from tests.conftest import TEST_KEY, tiny_config
from tests.test_clients_contract import ORIGINAL, UNANCHORED

EXPECT_TIMEOUT_MS = 30_000
# Chromium logs every 4xx answer as a console error: the tests that cause one check what the
# page shows of it instead.
ANSWERED_4XX = "Failed to load resource: the server responded with a status of 4"


class PageAudit(HTMLParser):
    """What the page's markup holds that a strict policy would refuse or a key could leak to."""

    def __init__(self) -> None:
        super().__init__()
        self.inline_scripts = 0
        self.script_sources: list[str] = []
        self.inline_handlers: list[str] = []
        self.style_attributes = 0
        self.forms = 0
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = dict(attrs)
        self.inline_handlers += [name for name in names if name.startswith("on")]
        self.style_attributes += "style" in names
        self.forms += tag == "form"
        if tag == "script":
            self._in_script = True
            if names.get("src"):
                self.script_sources.append(names["src"] or "")
        if tag == "style":
            self.inline_scripts += 1  # a <style> element is inline code too

    def handle_endtag(self, tag: str) -> None:
        self._in_script = self._in_script and tag != "script"

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.inline_scripts += 1


def test_the_page_is_open_and_allows_only_its_own_files(client):
    page = client.get("/")  # no key: the page is public, like /health
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert "frame-ancestors 'none'" in policy and "form-action 'none'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    audit = PageAudit()
    audit.feed(page.text)
    assert audit.inline_scripts == 0 and audit.style_attributes == 0 and audit.forms == 0
    assert audit.inline_handlers == []
    assert audit.script_sources == [ASSET_PREFIX + "playground.js"]
    files = static_files()
    assert {"/", ASSET_PREFIX + "playground.js", ASSET_PREFIX + "api.js"} <= set(files)
    for path, (body, media_type) in files.items():
        asset = client.get(path)
        assert asset.status_code == 200 and asset.headers["content-type"] == media_type
        assert asset.content == body and asset.headers["x-content-type-options"] == "nosniff"
        assert asset.headers["content-security-policy"] == policy
        if media_type.startswith("text/javascript"):
            # No code from strings, no markup from strings: server text is set as text.
            for banned in ("eval(", "new Function", "innerHTML", "outerHTML", "insertAdjacentHTML"):
                assert banned not in asset.text, (path, banned)
    # Only the listed files: nothing is looked up from the path.
    for path in ("/playground/", "/playground/../config.py", "/playground/playground.html"):
        assert client.get(path).status_code == 404
    assert client.get("/v1/models").status_code == 401  # the API still wants its key


def test_the_playground_can_be_turned_off(tiny_source, tmp_path):
    from fastapi.testclient import TestClient

    config = tiny_config(
        tiny_source, tmp_path, auth={"bootstrap_local_key": True, "playground": False}
    )
    with TestClient(local_router_app(config), raise_server_exceptions=False) as off:
        assert off.get("/").status_code == 404
        assert off.get(ASSET_PREFIX + "playground.js").status_code == 404
        assert off.get(ASSET_PREFIX + "api.js").status_code == 404


# --- in a real browser, against the real graph -----------------------------------------------


CHROMIUM = find_chromium()
# A mark, not a skip inside a fixture: the graph (a session fixture) is not started for tests
# that cannot run.
needs_browser = pytest.mark.skipif(
    CHROMIUM is None, reason="no Chromium on this machine (apt install chromium; .ci/run does)"
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    assert CHROMIUM is not None
    with chromium(CHROMIUM) as launched:
        yield launched


@pytest.fixture
def page(browser, graph) -> Iterator[Any]:
    """The playground with the test key entered; what the page logged as an error, and every
    request it made, are kept on ``page.problems`` and ``page.sent``."""
    from playwright.sync_api import expect

    context = browser.new_context(viewport={"width": 1100, "height": 800})
    page = context.new_page()
    page.problems = []
    page.sent = []
    page.on("pageerror", lambda error: page.problems.append(f"uncaught: {error}"))
    page.on(
        "console",
        lambda message: (
            message.type == "error"
            and not message.text.startswith(ANSWERED_4XX)
            and page.problems.append(message.text)
        ),
    )
    page.on("request", lambda request: page.sent.append(request))
    page.goto(graph["url"] + "/")
    page.fill("#api-key", TEST_KEY)
    page.click("#use-key")
    expect(page.locator("#key-status")).to_have_text(
        re.compile("^key accepted"), timeout=EXPECT_TIMEOUT_MS
    )
    yield page
    context.close()
    assert page.problems == [], "the page logged errors (a refused script or style is one)"


def open_tab(page: Any, name: str) -> None:
    page.click(f"#tabs button[data-tab={name}]")


@pytest.mark.ray
@needs_browser
def test_every_endpoint_shows_the_model_its_listing_names(page):
    from tests.graph import MODEL

    assert page.locator(".model").all_inner_texts() == [MODEL] * 5
    urls = [request.url for request in page.sent]
    assert not any(TEST_KEY in url for url in urls), "the key went into a URL"
    assert TEST_KEY not in page.content(), "the key is in the page's markup"
    listing = next(r for r in page.sent if r.url.endswith("/v1/fim/completions/models"))
    assert listing.headers["authorization"] == f"Bearer {TEST_KEY}"


@pytest.mark.ray
@needs_browser
def test_typing_shows_ghost_text_and_tab_accepts_it(page):
    from playwright.sync_api import expect

    code = page.locator("#fim-editor textarea")
    code.click()
    page.keyboard.press("Control+End")
    page.keyboard.type("r")
    ghost = page.locator("#fim-editor .ghost")
    expect(ghost).not_to_have_text("", timeout=EXPECT_TIMEOUT_MS)
    stats = page.locator("#fim-stats")
    expect(stats).to_contain_text("ms key to suggestion")
    expect(stats).to_contain_text("prompt tokens cached")
    suggestion = ghost.text_content()
    typed = code.input_value()
    fim = [r for r in page.sent if r.url.endswith("/v1/fim/completions")][-1]
    assert fim.post_data_json["prompt"] == typed and fim.post_data_json["suffix"] == ""
    page.keyboard.press("Tab")
    assert code.input_value() == typed + suggestion
    expect(ghost).to_have_text("")
    # What the backdrop draws is the text itself: the page shows what the textarea holds.
    assert page.locator("#fim-editor .backdrop").text_content() == typed + suggestion + "\n"


@pytest.mark.ray
@needs_browser
def test_apply_shows_the_merge_as_a_diff_and_a_failed_merge_as_its_error(page):
    from playwright.sync_api import expect

    open_tab(page, "apply")
    page.click("#apply-run")
    diff = page.locator("#apply-diff")
    expect(diff.locator(".del")).to_have_text(
        ["-     return 3.14 * r * r"], timeout=EXPECT_TIMEOUT_MS
    )
    expect(diff.locator(".add")).to_have_text(["+     return math.pi * r ** 2"])
    expect(page.locator("#apply-stats")).to_contain_text("merged in")
    # A new function between markers: nothing places it in the file, and the tiny model's
    # noise fails the check, so the answer is the contract's 422, shown as sent.
    page.fill("#apply-original", ORIGINAL)
    page.fill("#apply-snippet", UNANCHORED)
    page.click("#apply-run")
    error = page.locator("#apply-error")
    expect(error).to_be_visible(timeout=EXPECT_TIMEOUT_MS)
    expect(error).to_contain_text("HTTP 422")
    expect(error).to_contain_text('"code": "merge_failed"')
    assert diff.locator("span").count() == 0


@pytest.mark.ray
@needs_browser
def test_decisions_show_each_answer_with_its_probabilities_as_bars(page):
    from playwright.sync_api import expect

    open_tab(page, "decisions")
    page.click("#decisions-run")
    answers = page.locator("#decisions-answers .answer")
    expect(answers).to_have_count(3, timeout=EXPECT_TIMEOUT_MS)
    assert [a.get_attribute("data-question") for a in answers.all()] == [
        "is_bug", "team", "severity"
    ]  # fmt: skip
    team = page.locator('.answer[data-question="team"]')
    shown = [float(value) for value in team.locator(".value").all_inner_texts()]
    assert len(shown) == 3 and abs(sum(shown) - 1) < 0.01
    widths = [bar.evaluate("e => e.style.width") for bar in team.locator(".fill").all()]
    assert widths == [f"{value * 100:.1f}%" for value in shown] or all(
        abs(float(w.rstrip("%")) - v * 100) < 0.11 for w, v in zip(widths, shown, strict=True)
    )
    assert team.locator(".bar.chosen").count() == 1
    expect(page.locator("#decisions-stats")).to_contain_text("input tokens")
    # A body the contract refuses comes back as its 422, shown as sent.
    page.fill("#decisions-body", '{"state": {}, "questions": {}}')
    page.click("#decisions-run")
    expect(page.locator("#decisions-error")).to_contain_text("HTTP 422", timeout=EXPECT_TIMEOUT_MS)


@pytest.mark.ray
@needs_browser
def test_next_edit_sends_the_edits_made_in_the_page_as_history(page):
    from playwright.sync_api import expect

    open_tab(page, "edit")
    text = page.locator("#edit-text")
    text.click()
    page.keyboard.press("Control+Home")
    for _ in range(len("def ")):
        page.keyboard.press("ArrowRight")
    page.keyboard.type("sub")
    page.click("#edit-suggest")
    expect(page.locator("#edit-stats")).to_contain_text("answered", timeout=EXPECT_TIMEOUT_MS)
    edit = [r for r in page.sent if r.url.endswith("/v1/edit/completions")][-1]
    prompt = edit.post_data_json["messages"][0]["content"]
    assert prompt.startswith("<|recently_viewed_code_snippets|>\n\n<|/recently_viewed_code_")
    history = prompt.split("<|edit_diff_history|>\n")[1]
    assert history.startswith("--- playground.py\n+++ playground.py\n@@ -1,3 +1,3 @@\n")
    assert "-def total(items):\n+def subtotal(items):\n" in history
    assert "<|code_to_edit|>\ndef sub<|cursor|>total(items):\n" in prompt
    # Whatever the tiny model answered, the page shows it as a diff or as no change.
    expect(page.locator("#edit-diff")).not_to_be_empty()


@pytest.mark.ray
@needs_browser
def test_chat_streams_the_answer_into_the_log(page):
    from playwright.sync_api import expect

    open_tab(page, "chat")
    page.fill("#chat-text", "Say hello.")
    page.click("#chat-send")
    expect(page.locator("#chat-stats")).to_contain_text("tokens in", timeout=EXPECT_TIMEOUT_MS)
    messages = page.locator("#chat-log .message")
    expect(messages).to_have_count(2)
    assert messages.nth(0).inner_text() == "Say hello."
    assert messages.nth(1).inner_text() != ""
    chat = [r for r in page.sent if r.url.endswith("/v1/chat/completions")][-1]
    assert chat.post_data_json["stream"] is True


@pytest.mark.ray
@needs_browser
def test_the_playground_bench_times_each_key_from_the_page(browser, graph, capsys):
    from bench.keystroke import TypingSession
    from bench.playground import Keys, open_playground, report, type_session

    session = TypingSession("example.py:3", "import os\n\n", "def walk(root):", "\n", 4)
    keys = Keys()
    page = open_playground(browser, graph["url"], TEST_KEY)
    try:
        assert type_session(page, session, 0, keys) == 4  # one request per key, in order
    finally:
        page.close()
    assert len(keys.first) == 1 and len(keys.to_ghost) == len(keys.round_trip) == 3
    assert all(
        0 < trip <= ghost for trip, ghost in zip(keys.round_trip, keys.to_ghost, strict=True)
    )
    report(keys, 1, 0, graph["url"])
    assert "key to ghost text, p50" in capsys.readouterr().out


@pytest.mark.ray
@needs_browser
def test_chat_shows_a_tool_call_as_it_streams(page):
    import json

    from playwright.sync_api import expect

    open_tab(page, "chat")
    page.click("#chat-tools-box summary")
    page.check("#chat-use-tools")
    page.fill("#chat-text", "What is the weather in Paris?")
    page.click("#chat-send")
    # The answer is whole once the stats line says so; the grammar may write several calls
    # (parallel_tool_calls defaults to true), each drawn on a line of its own.
    expect(page.locator("#chat-stats")).to_contain_text("tokens in", timeout=EXPECT_TIMEOUT_MS)
    shown = page.locator("#chat-log .message.assistant .call").all_inner_texts()
    assert shown, "no tool call was drawn"
    # The tiny model writes noise, but the grammar makes each a call of the one tool offered;
    # noise may run a string to max_tokens, and then the page says the answer was cut there
    # and only the last call may be unfinished.
    cut = "cut at max_tokens" in page.locator("#chat-stats").inner_text()
    for number, call in enumerate(shown, start=1):
        assert call.startswith("→ get_weather(") and call.endswith(")"), call
        arguments = call[len("→ get_weather(") : -1]
        if cut and number == len(shown):
            assert arguments.startswith('{"city": "'), call
        else:
            assert isinstance(json.loads(arguments)["city"], str)
    chat = [r for r in page.sent if r.url.endswith("/v1/chat/completions")][-1]
    assert chat.post_data_json["tool_choice"] == "required"
    assert chat.post_data_json["tools"][0]["function"]["name"] == "get_weather"
