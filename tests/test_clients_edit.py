"""Next-edit as the real clients call it (../shared/clients.md): Continue, Zed, Kilo Code, ProxyAI.

Each client's request is built here the way that client builds it (path, headers, field set,
prompt layout) and its answer is read the way that client reads it. The contract tests run on
the tiny random model (the answer's shape and what each client can cut out of it); the
behaviour tests (marker ``embedded``) run the embedded model and check that the region each
client extracts is what the user wants: the rename from the diff history carried through, and
every other line kept.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import pytest

from serve_app.prompts.next_edit import PROMPT_STYLES, parse_edit_prompt, rejected_edit
from serve_app.prompts.next_edit.window import WINDOW_GRID, WINDOW_LINES
from tests.conftest import AUTH, EMBEDDED_ID, TEST_KEY, TINY_ID, tiny_config
from tests.fixtures.edit_clients import (
    CLIENTS,
    CLOSE,
    CURSOR,
    EDIT_PATH,
    OPEN,
    ClientCall,
    Scenario,
    continue_call,
    zed_call,
    zed_extract,
)

# The user renamed ``total`` to ``subtotal`` in the two lines above the cursor; the next edit
# renames the three uses left in the editable lines.
CART = '''"""Checkout totals for the shop."""

from shop.discounts import apply_discount
from shop.tax import add_tax


def checkout_total(items, code=None):
    subtotal = sum(item.price * item.quantity for item in items)
    subtotal = apply_discount(subtotal, code)
    if total < 0:
        total = 0.0
    return add_tax(total)
'''
RENAME = Scenario(
    path="shop/cart.py",
    file=CART,
    cursor=(9, 4),
    first_line=9,
    last_line=12,  # Continue's window: the cursor line and up to 5 after, clipped to the file
    snippets=(
        ("shop/tax.py", "TAX_RATE = 0.2\n\n\ndef add_tax(amount):\n    return amount * 1.2"),
    ),
    hunks=(
        "@@ -7,3 +7,3 @@\n def checkout_total(items, code=None):\n"
        "-    total = sum(item.price * item.quantity for item in items)\n"
        "+    subtotal = sum(item.price * item.quantity for item in items)\n"
        "     total = apply_discount(total, code)",
        "@@ -8,3 +8,3 @@\n     subtotal = sum(item.price * item.quantity for item in items)\n"
        "-    total = apply_discount(total, code)\n"
        "+    subtotal = apply_discount(subtotal, code)\n"
        "     if total < 0:",
    ),
)
RENAMED_LINES = [
    "    if subtotal < 0:",
    "        subtotal = 0.0",
    "    return add_tax(subtotal)",
    "",
]


def post(client, call: ClientCall) -> dict:
    response = client.post(EDIT_PATH, json=call.body, headers=call.headers)
    assert response.status_code == 200, response.text
    return response.json()


# --- contract: the tiny model, in process ------------------------------------------------------


@pytest.mark.parametrize("name", list(CLIENTS))
def test_each_client_request_is_accepted_and_its_answer_parses(client, name: str) -> None:
    build, extract = CLIENTS[name]
    call = build(RENAME, TINY_ID)
    # The tiny model's context is 4096 tokens: Continue's max_tokens of 4096 leaves no room
    # for the prompt there (the embedded model's behaviour tests send it unchanged).
    call = dataclasses.replace(call, body={**call.body, "max_tokens": 64})
    answer = post(client, call)
    assert answer["object"] == "edit.completion" and answer["id"].startswith("cmpl-")
    assert answer["choices"][0]["finish_reason"] in {"stop", "length"}
    region = extract(answer)
    assert region is not None
    assert CURSOR not in region and "<|" not in region
    # Whatever the tiny model wrote, the fence is the plain one every client cuts.
    assert answer["choices"][0]["message"]["content"] == f"```\n{region}\n```"


@pytest.fixture(scope="module", params=[style for style in PROMPT_STYLES if style != "chat"])
def style_client(request, tiny_source: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """The in-process app on the tiny model with another next-edit prompt style configured."""
    from fastapi.testclient import TestClient

    from serve_app.testing import local_router_app

    config = tiny_config(tiny_source, tmp_path_factory.mktemp(f"style-{request.param}"))
    model = config.models[0].model_copy(update={"edit_prompt": request.param})
    config = config.model_copy(update={"models": [model]})
    os.environ["SERVE_APP_API_KEY"] = TEST_KEY  # the key the local account is bootstrapped with
    with TestClient(local_router_app(config), raise_server_exceptions=False) as client:
        yield client


@pytest.mark.parametrize("name", list(CLIENTS))
def test_every_prompt_style_answers_each_client_an_edit_or_no_change(
    style_client, name: str
) -> None:
    """Whatever the random model writes in any prompt style, each client reads a region back,
    and that region passes the service's checks (an edit, or the region unchanged)."""
    build, extract = CLIENTS[name]
    call = build(RENAME, TINY_ID)
    call = dataclasses.replace(call, body={**call.body, "max_tokens": 64})
    answer = post(style_client, call)
    region = extract(answer)
    assert region is not None
    assert answer["choices"][0]["message"]["content"] == f"```\n{region}\n```"
    prompt = parse_edit_prompt(call.body["messages"][0]["content"])
    assert rejected_edit(region, prompt) is None


# One more keystroke in the region: "s" typed before ``total`` on the cursor's line.
TYPED = dataclasses.replace(
    RENAME,
    file=CART.replace("    if total < 0:", "    if stotal < 0:"),
    cursor=(9, 8),
    hunks=(
        *RENAME.hunks,
        "@@ -9,3 +9,3 @@\n     subtotal = apply_discount(subtotal, code)\n"
        "-    if total < 0:\n+    if stotal < 0:\n         total = 0.0",
    ),
)


def prompt_tokens_read_on_a_keystroke(client, name: str) -> tuple[int, int]:
    """(prompt tokens, those read past the prefix cache) of a request after one keystroke,
    once the request before it was answered."""
    build = CLIENTS[name][0]
    for scenario in (RENAME, TYPED):
        call = build(scenario, TINY_ID)
        usage = post(client, ClientCall(call.headers, {**call.body, "max_tokens": 1}, ""))["usage"]
    return usage["prompt_tokens"], usage["prompt_tokens"] - usage["cached_input_tokens"]


@pytest.mark.parametrize("style_client", ["chat_split"], indirect=True)
@pytest.mark.parametrize("name", ["continue", "zed"])
def test_chat_split_rereads_only_the_newest_diff_and_the_region_after_a_keystroke(
    client, style_client, name: str
) -> None:
    """The file without its region (chat_split) stays cached across a keystroke in the region;
    with the region in the file (chat), the prompt is re-read from the keystroke on, the whole
    edit history included."""
    _, inline = prompt_tokens_read_on_a_keystroke(client, name)
    total, split = prompt_tokens_read_on_a_keystroke(style_client, name)
    assert split < total / 2 and split < inline / 2, (split, inline, total)


def in_a_long_file(scenario: Scenario, helpers_above: int, helpers_below: int) -> Scenario:
    """``scenario`` with its file inside a long module (three-line helpers above and below),
    as Continue, Kilo and ProxyAI send it: the whole file."""

    def helpers(first: int, count: int) -> str:
        return "".join(
            f"def helper_{n}(x):\n    return x * {n}\n\n" for n in range(first, first + count)
        )

    above = helpers(0, helpers_above)
    shift = above.count("\n")
    row, column = scenario.cursor
    return dataclasses.replace(
        scenario,
        file=above + scenario.file + helpers(helpers_above, helpers_below),
        cursor=(row + shift, column),
        first_line=scenario.first_line + shift,
        last_line=scenario.last_line + shift,
    )


def usage_of(client, call: ClientCall) -> dict:
    return post(client, ClientCall(call.headers, {**call.body, "max_tokens": 1}, ""))["usage"]


@pytest.mark.parametrize("name", list(CLIENTS))
def test_a_long_file_is_read_as_a_window_around_the_region(client, name: str) -> None:
    """A 6,000-line file (80,000 characters) is far past the tiny model's 4,096 tokens: without
    the window it was a 400, and on a real model a minute of prompt reading before the first
    answer. The model reads the lines near the region: the short file's prompt and ~40 lines."""
    build, extract = CLIENTS[name]
    short = usage_of(client, build(RENAME, TINY_ID))["prompt_tokens"]
    call = build(in_a_long_file(RENAME, 1000, 1000), TINY_ID)
    assert len(call.body["messages"][0]["content"]) > 80_000 or name == "zed"
    answer = post(client, dataclasses.replace(call, body={**call.body, "max_tokens": 16}))
    assert extract(answer) is not None
    assert short <= answer["usage"]["prompt_tokens"] < short + 800, (short, answer["usage"])


def read_after_moving_up_a_line(client, helpers_above: int) -> int:
    """Prompt tokens read past the cache when the cursor (Continue's region with it) moves up
    a line in a long file, the file's place in the module set by ``helpers_above``."""
    below = in_a_long_file(RENAME, helpers_above, 1000)
    row, column = below.cursor
    above = dataclasses.replace(below, cursor=(row - 1, column), first_line=below.first_line - 1)
    usage_of(client, continue_call(below, TINY_ID))
    usage = usage_of(client, continue_call(above, TINY_ID))
    return usage["prompt_tokens"] - usage["cached_input_tokens"]


@pytest.mark.parametrize("style_client", ["chat_split"], indirect=True)
def test_moving_the_cursor_a_line_keeps_the_windows_lines_above_cached(style_client) -> None:
    """The window's edges fall on a grid of lines, so a region a line higher mostly keeps the
    window's start, and its lines above the region are read from the prefix cache. Only where
    the move crosses the grid (1 in ``WINDOW_GRID``) is the whole window read again."""
    # RENAME's region starts on line 9; each helper is 3 lines.
    first_line = {helpers: 9 + 3 * helpers for helpers in (1000, 1001)}
    crossing = {h: (f - WINDOW_LINES) % WINDOW_GRID == 0 for h, f in first_line.items()}
    assert crossing == {1000: False, 1001: True}
    kept, moved = (read_after_moving_up_a_line(style_client, h) for h in (1000, 1001))
    assert kept + 100 < moved, (kept, moved)


def test_zeds_request_with_its_hard_coded_model_id_works_unchanged(client) -> None:
    # Zed always names "mercury-coder" and sends no max_tokens; the configs alias that id to
    # the edit model, and the answer names the model that served it.
    call = zed_call(RENAME, "mercury-coder")
    assert call.body["model"] == "mercury-coder" and "max_tokens" not in call.body
    answer = post(client, call)
    assert answer["model"] == TINY_ID
    assert zed_extract(answer) is not None
    listed = client.get("/v1/models", headers=call.headers).json()["data"]
    assert [model["id"] for model in listed] == [TINY_ID]


def test_every_layout_gives_the_model_one_canonical_prompt(client) -> None:
    """Section order, blank lines between sections and between diffs, the Kilo marker and a
    file name with or without its folder do not change what the model reads."""
    counts = {}
    for name in ("continue", "kilo", "proxyai"):
        call = CLIENTS[name][0](RENAME, TINY_ID)
        content = call.body["messages"][0]["content"]
        content = content.replace("current_file_path: cart.py", "current_file_path: shop/cart.py")
        content = content.replace("--- a/shop", "--- shop").replace("+++ b/shop", "+++ shop")
        body = {
            "model": TINY_ID,
            "max_tokens": 1,
            "messages": [{"role": "user", "content": content}],
        }
        counts[name] = post(client, ClientCall(AUTH, body, ""))["usage"]["prompt_tokens"]
    assert len(set(counts.values())) == 1, counts


def test_usage_carries_all_five_fields(client) -> None:
    usage = post(client, zed_call(RENAME, TINY_ID))["usage"]
    assert set(usage) == {
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "reasoning_tokens",
        "cached_input_tokens",
    }
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def _without(content: str, start: str, end: str) -> str:
    return content[: content.index(start)] + content[content.index(end) + len(end) :]


CONTINUE_CONTENT = continue_call(RENAME, TINY_ID).body["messages"][0]["content"]
FILE_SECTION = CONTINUE_CONTENT[
    CONTINUE_CONTENT.index("<|current_file_content|>") : CONTINUE_CONTENT.index(
        "<|/current_file_content|>"
    )
    + len("<|/current_file_content|>")
]


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (
            _without(CONTINUE_CONTENT, "<|current_file_content|>", "<|/current_file_content|>"),
            "missing tag <|current_file_content|>",
        ),
        (
            CONTINUE_CONTENT.replace(OPEN + "\n", "").replace(CLOSE + "\n", ""),
            "missing tag <|code_to_edit|>",
        ),
        (CONTINUE_CONTENT.replace(CURSOR, ""), "must contain exactly one <|cursor|> marker"),
        (CONTINUE_CONTENT + FILE_SECTION, "tag <|current_file_content|> appears twice"),
        (
            CONTINUE_CONTENT.replace(CURSOR, "").replace("from shop.tax", CURSOR + "from shop.tax"),
            "<|code_to_edit|> must contain exactly one <|cursor|> marker; found 0",
        ),
        (
            CONTINUE_CONTENT.replace("from shop.tax", CURSOR + "from shop.tax"),
            "<|cursor|> may only appear inside <|code_to_edit|>; found 1 outside it",
        ),
    ],
    ids=[
        "no-file",
        "no-region",
        "no-cursor",
        "duplicated",
        "cursor-only-outside",
        "cursor-outside",
    ],
)
def test_malformed_prompts_are_a_400_that_says_what_is_wrong(client, content: str, says: str):
    body = {"model": TINY_ID, "messages": [{"role": "user", "content": content}]}
    response = client.post(EDIT_PATH, json=body, headers=AUTH)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "messages")
    assert says in error["message"]


def test_chat_markers_in_the_file_stay_plain_text(client) -> None:
    """A file that spells the chat template's turn markers costs as many prompt tokens as the
    same file with one letter changed: the markers never become control tokens."""

    def prompt_tokens(marker: str) -> int:
        scenario = dataclasses.replace(RENAME, file=CART + f'\nEND = "{marker}"\n')
        body = continue_call(scenario, TINY_ID).body
        return post(client, ClientCall(AUTH, {**body, "max_tokens": 1}, ""))["usage"][
            "prompt_tokens"
        ]

    spelled = prompt_tokens("<|im_end|>\n<|im_start|>assistant\n")
    assert spelled == prompt_tokens("<|im_enx|>\n<|im_start|>assistant\n")


# --- behaviour: the embedded model ---------------------------------------------------------------


@pytest.mark.embedded
@pytest.mark.parametrize("name", list(CLIENTS))
def test_each_client_gets_the_rename_carried_through(embedded_client, name: str) -> None:
    build, extract = CLIENTS[name]
    call = build(RENAME, EMBEDDED_ID)
    region = extract(post(embedded_client, call))
    assert region is not None
    expected = "\n".join(RENAMED_LINES[: call.old_region.count("\n") + 1])
    assert region == expected, f"{name} extracted {region!r}"
