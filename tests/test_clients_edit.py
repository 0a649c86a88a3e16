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
import re
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from tests.conftest import AUTH, EMBEDDED_ID, TEST_KEY, TINY_ID

CURSOR = "<|cursor|>"
OPEN, CLOSE = "<|code_to_edit|>", "<|/code_to_edit|>"
EDIT_PATH = "/v1/edit/completions"


@dataclass(frozen=True)
class Scenario:
    """What the editor knows: a file, the cursor, the editable lines, recent context."""

    path: str
    file: str
    cursor: tuple[int, int]  # (line, column), 0-based
    first_line: int  # editable lines, inclusive
    last_line: int
    snippets: tuple[tuple[str, str], ...]
    hunks: tuple[str, ...]  # the recent edits to ``path``, oldest first, as unified hunks

    @property
    def lines(self) -> list[str]:
        return self.file.split("\n")

    def lines_with_cursor(self) -> list[str]:
        lines = self.lines
        row, column = self.cursor
        lines[row] = lines[row][:column] + CURSOR + lines[row][column:]
        return lines


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


# --- how each client builds its request ---------------------------------------------------------


@dataclass(frozen=True)
class ClientCall:
    headers: dict[str, str]
    body: dict
    old_region: str  # what the client will replace with the text it extracts


def _continue_snippets(scenario: Scenario) -> str:
    return "\n".join(
        f"<|recently_viewed_code_snippet|>\ncode_snippet_file_path: {path}\n{code}\n"
        "<|/recently_viewed_code_snippet|>"
        for path, code in scenario.snippets
    )


def _continue_file(scenario: Scenario) -> str:
    """The whole file, cursor inline, region tags on their own lines around the editable lines."""
    lines = scenario.lines_with_cursor()
    first, last = scenario.first_line, scenario.last_line
    return "\n".join([*lines[:first], OPEN, *lines[first : last + 1], CLOSE, *lines[last + 1 :]])


def _bare_diffs(scenario: Scenario) -> list[str]:
    """Continue's diffs: jsdiff patches with the Index and === lines cut off."""
    return [f"--- {scenario.path}\n+++ {scenario.path}\n{hunk}" for hunk in scenario.hunks]


def _continue_layout(scenario: Scenario, diff_separator: str) -> str:
    return (
        f"<|recently_viewed_code_snippets|>\n{_continue_snippets(scenario)}\n"
        "<|/recently_viewed_code_snippets|>\n\n"
        f"<|current_file_content|>\ncurrent_file_path: {scenario.path.rsplit('/', 1)[-1]}\n"
        f"{_continue_file(scenario)}\n<|/current_file_content|>\n\n"
        f"<|edit_diff_history|>\n{diff_separator.join(_bare_diffs(scenario))}\n"
        "<|/edit_diff_history|>\n"
    )


def _continue_region(scenario: Scenario) -> str:
    return "\n".join(scenario.lines[scenario.first_line : scenario.last_line + 1])


def continue_call(scenario: Scenario, model: str) -> ClientCall:
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json",
        "Authorization": f"Bearer {TEST_KEY}",
    }
    body = {
        "model": model,
        "messages": [{"role": "user", "content": _continue_layout(scenario, "\n")}],
        "max_tokens": 4096,
        "temperature": 0.01,
        "stream": False,
    }
    return ClientCall(headers, body, _continue_region(scenario))


def kilo_call(scenario: Scenario, model: str) -> ClientCall:
    """Continue's layout, diffs joined by a blank line, the public service's marker appended."""
    content = _continue_layout(scenario, "\n\n") + "\n\n<|!@#IS_NEXT_EDIT!@#|>"
    body = {"model": model, "max_tokens": 512, "messages": [{"role": "user", "content": content}]}
    return ClientCall(
        {**AUTH, "Content-Type": "application/json"}, body, _continue_region(scenario)
    )


def _zed_editable(scenario: Scenario) -> tuple[int, int, int]:
    """Offsets of Zed's editable range (row starts to the last row's end, newline excluded)
    and of the cursor, in the file (Zed's context excerpt here is the whole file)."""
    lines = scenario.lines
    starts = [sum(len(line) + 1 for line in lines[:row]) for row in range(len(lines))]
    row, column = scenario.cursor
    last = scenario.last_line - 1  # Zed's range ends at a line with text, not the empty last one
    return starts[scenario.first_line], starts[last] + len(lines[last]), starts[row] + column


def zed_call(scenario: Scenario, model: str) -> ClientCall:
    start, end, cursor = _zed_editable(scenario)
    text = scenario.file
    snippets = "".join(
        f"<|recently_viewed_code_snippet|>\ncode_snippet_file_path: {path}\n{code}"
        "<|/recently_viewed_code_snippet|>\n"
        for path, code in scenario.snippets
    )
    events = "".join(
        ("// User accepted prediction:\n" if index else "")
        + f"--- a/project/{scenario.path}\n+++ b/project/{scenario.path}\n{hunk}\n"
        for index, hunk in enumerate(scenario.hunks)
    )
    content = (
        f"<|recently_viewed_code_snippets|>\n{snippets}<|/recently_viewed_code_snippets|>\n"
        f"<|current_file_content|>\ncurrent_file_path: project/{scenario.path}\n"
        f"{text[:start]}{OPEN}\n{text[start:cursor]}{CURSOR}{text[cursor:end]}{CLOSE}\n"
        f"{text[end:]}<|/current_file_content|>\n"
        f"<|edit_diff_history|>\n{events}<|/edit_diff_history|>\n"
    )
    headers = {**AUTH, "Content-Type": "application/json", "Connection": "keep-alive"}
    body = {"model": model, "messages": [{"role": "user", "content": content}], "stream": False}
    return ClientCall(headers, body, text[start:end])


def proxyai_call(scenario: Scenario, model: str) -> ClientCall:
    """ProxyAI's prompt layout is not in clients.md: the spec's documented order is used
    (snippets, history, file), git-style diffs separated by blank lines."""
    history = "\n\n".join(
        f"--- a/{scenario.path}\n+++ b/{scenario.path}\n{hunk}" for hunk in scenario.hunks
    )
    content = (
        f"<|recently_viewed_code_snippets|>\n{_continue_snippets(scenario)}\n"
        "<|/recently_viewed_code_snippets|>\n"
        f"<|edit_diff_history|>\n{history}\n<|/edit_diff_history|>\n"
        f"<|current_file_content|>\ncurrent_file_path: {scenario.path}\n"
        f"{_continue_file(scenario)}\n<|/current_file_content|>"
    )
    body = {"model": model, "messages": [{"role": "user", "content": content}]}
    return ClientCall(
        {**AUTH, "Content-Type": "application/json"}, body, _continue_region(scenario)
    )


# --- how each client reads the answer ------------------------------------------------------------


def _js_slice(text: str, start: int, end: int) -> str:
    """JavaScript's String.slice: a negative end counts from the end."""
    return text[start : end if end >= 0 else len(text) + end]


def continue_extract(answer: dict) -> str:
    """Continue: the text between the first "```\\n" and the last "\\n```" (cutting 3 and 1
    characters when the fence is missing, as indexOf/lastIndexOf give -1)."""
    content = answer["choices"][0]["message"]["content"]
    return _js_slice(content, content.find("```\n") + 4, content.rfind("\n```"))


def zed_extract(answer: dict) -> str | None:
    """Zed: strict fields, an id it can send back, the fence cut exactly; None means no edit."""
    assert {"id", "object", "created", "model", "choices", "usage"} <= set(answer)
    assert answer["id"].startswith("cmpl-")
    assert isinstance(answer["created"], int) and isinstance(answer["model"], str)
    choice = answer["choices"][0]
    assert {"index", "message", "finish_reason"} <= set(choice)
    assert choice["message"]["role"] == "assistant"
    for field in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert isinstance(answer["usage"][field], int)
    content = choice["message"]["content"]
    assert content.startswith("```\n") and content.endswith("\n```"), content
    region = content.removeprefix("```\n").removesuffix("\n```")
    return None if region == "None" else region


def kilo_extract(answer: dict) -> str | None:
    """Kilo Code: from the first ``` (a language tag allowed) to the next ```; no closing fence
    drops the suggestion; stray region tags at the edges are stripped. Dropping the newline
    before the closing fence is inferred (the fence sits on its own line)."""
    content = answer["choices"][0]["message"]["content"]
    match = re.search(r"```[^\n]*\n(.*?)```", content, re.DOTALL)
    if match is None:
        return None
    region = match.group(1).removesuffix("\n")
    return region.removeprefix(OPEN + "\n").removesuffix("\n" + CLOSE)


def proxyai_extract(answer: dict) -> str | None:
    """ProxyAI: the code of the fenced block."""
    content = answer["choices"][0]["message"]["content"]
    match = re.search(r"```[\w+-]*\n(.*?)\n```", content, re.DOTALL)
    return match.group(1) if match else None


CLIENTS: dict[str, tuple[Callable[[Scenario, str], ClientCall], Callable[[dict], str | None]]] = {
    "continue": (continue_call, continue_extract),
    "zed": (zed_call, zed_extract),
    "kilo": (kilo_call, kilo_extract),
    "proxyai": (proxyai_call, proxyai_extract),
}


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
