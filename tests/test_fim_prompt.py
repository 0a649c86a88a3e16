"""FIM prompts: the two layouts, text over the context refused (never cut), and
client-written templates, through the builder (tiny model's Qwen tokenizer) and over HTTP."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from serve_app.errors import ContextLengthExceededError, InvalidRequestError
from serve_app.grammar.token_bytes import TokenTexts
from serve_app.prompts.fim import FIM_FORMATS, build_fim_prompt
from serve_app.prompts.healing import heal_cursor
from tests.conftest import AUTH, TINY_ID

QWEN = FIM_FORMATS["qwen"]


@pytest.fixture(scope="module")
def tokenizer(tiny_source: str):
    return AutoTokenizer.from_pretrained(tiny_source.removeprefix("tiny:"))


def text_of(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids)


def test_layouts_put_the_text_nearest_the_cursor_where_they_say(tokenizer) -> None:
    psm = text_of(tokenizer, build_fim_prompt(QWEN, tokenizer, "def f(", "):\n", "psm"))
    spm = text_of(tokenizer, build_fim_prompt(QWEN, tokenizer, "def f(", "):\n", "spm"))
    assert psm == "<|fim_prefix|>def f(<|fim_suffix|>):\n<|fim_middle|>"
    assert spm == "<|fim_prefix|><|fim_suffix|>):\n<|fim_middle|>def f("


def test_a_keystroke_changes_only_the_end_of_a_suffix_first_prompt(tokenizer) -> None:
    suffix = "\n\nprint(main())\n" * 20
    before = build_fim_prompt(QWEN, tokenizer, "def main():\n    retur", suffix, "spm")
    after = build_fim_prompt(QWEN, tokenizer, "def main():\n    return", suffix, "spm")
    shared = next(i for i, (a, b) in enumerate(zip(before, after, strict=False)) if a != b)
    # Only the last line's tokens differ (however the tokenizer splits the word typed)...
    assert shared >= len(before) - len(tokenizer.encode("    retur"))
    # ... where prefix, suffix, middle differs right after the prefix, before the suffix.
    psm = [build_fim_prompt(QWEN, tokenizer, p, suffix, "psm") for p in ("retur", "return")]
    assert next(i for i, (a, b) in enumerate(zip(*psm, strict=False)) if a != b) < 8


def test_repo_context_comes_first_in_both_layouts(tokenizer) -> None:
    prompt = "<|file_sep|>src/app.py\n<|fim_prefix|>import os\n"
    for layout in ("psm", "spm"):
        text = text_of(tokenizer, build_fim_prompt(QWEN, tokenizer, prompt, "x = 1\n", layout))
        assert text.startswith("<|file_sep|>src/app.py\n<|fim_prefix|>")
        assert text.count("<|fim_prefix|>") == 1


@pytest.mark.parametrize("layout", ["psm", "spm"])
@pytest.mark.parametrize("over", ["prefix", "suffix", "both"])
def test_text_over_the_budget_is_refused_not_cut(tokenizer, layout, over) -> None:
    long = "".join(f"line_{i} = {i}\n" for i in range(3000))
    prefix = (long if over != "suffix" else "") + "cursor_here = "
    suffix = "after_cursor = 1\n" + (long if over != "prefix" else "")
    with pytest.raises(ContextLengthExceededError) as raised:
        build_fim_prompt(QWEN, tokenizer, prefix, suffix, layout, max_tokens=400)
    assert raised.value.param == "prompt"


def test_text_that_just_fits_is_read_whole(tokenizer) -> None:
    prefix = "".join(f"line_{i} = {i}\n" for i in range(40))
    whole = build_fim_prompt(QWEN, tokenizer, prefix, "x = 1\n", "spm")
    exact = build_fim_prompt(QWEN, tokenizer, prefix, "x = 1\n", "spm", max_tokens=len(whole))
    assert exact == whole
    with pytest.raises(ContextLengthExceededError):
        build_fim_prompt(QWEN, tokenizer, prefix, "x = 1\n", "spm", max_tokens=len(whole) - 1)


def test_text_within_the_budget_is_untouched(tokenizer) -> None:
    whole = build_fim_prompt(QWEN, tokenizer, "def f(", "):\n", "spm")
    assert build_fim_prompt(QWEN, tokenizer, "def f(", "):\n", "spm", max_tokens=4000) == whole


@pytest.mark.parametrize(
    "prompt",
    [
        "<|fim_prefix|>def f(<|fim_suffix|>):\n<|fim_middle|>",
        "<|fim_prefix|><|fim_suffix|>):\n<|fim_middle|>def f(",
    ],
    ids=["prefix-first", "suffix-first"],
)
def test_a_client_written_template_is_read_as_what_it_means(tokenizer, prompt) -> None:
    want = build_fim_prompt(QWEN, tokenizer, "def f(", "):\n", "spm")
    assert build_fim_prompt(QWEN, tokenizer, prompt, "", "spm") == want


def test_a_template_with_a_suffix_field_is_refused(tokenizer) -> None:
    template = "<|fim_prefix|>def f(<|fim_suffix|>):\n<|fim_middle|>"
    with pytest.raises(InvalidRequestError) as refused:
        build_fim_prompt(QWEN, tokenizer, template, "):\n", "spm")
    assert refused.value.param == "suffix"


def test_marker_spellings_inside_code_stay_text(tokenizer) -> None:
    code = '<|fim_prefix|>MARKS = ["<|fim_suffix|>", "<|fim_middle|>"]\n'
    ids = build_fim_prompt(QWEN, tokenizer, code, "print(MARKS)\n", "spm")
    special = tokenizer.convert_tokens_to_ids(["<|fim_suffix|>", "<|fim_middle|>"])
    assert [ids.count(token) for token in special] == [1, 1]  # the prompt's own, only


def healed(tokenizer, prefix: str) -> tuple[list[int], list[int], str]:
    ids = build_fim_prompt(QWEN, tokenizer, prefix, "\n", "spm")
    return ids, *heal_cursor(TokenTexts.for_tokenizer(tokenizer), ids, prefix)


def test_a_cursor_inside_a_word_gives_the_word_back(tokenizer) -> None:
    ids, prompt, answer_prefix = healed(tokenizer, "def main():\n    retur")
    assert answer_prefix.strip() == "retur"  # the whole partial word, whatever its tokens
    assert prompt == ids[: len(prompt)] and len(prompt) < len(ids)
    assert text_of(tokenizer, prompt) + answer_prefix == text_of(tokenizer, ids)


def test_every_keystroke_of_a_lines_first_word_sends_the_same_prompt(tokenizer) -> None:
    typed = [healed(tokenizer, "def main():\n    " + "return"[:n]) for n in range(6)]
    assert len({tuple(prompt) for _, prompt, _ in typed}) == 1
    assert [answer_prefix for _, _, answer_prefix in typed] == [
        "    " + "return"[:n] for n in range(6)
    ]


@pytest.mark.parametrize(
    "prefix, answer_prefix",
    [
        ("def main():\n    ", "    "),  # the indentation after Enter: blanks, not the newline
        ("def main():\n    retu", "    retu"),  # the line's first word, with its indentation
        ("    x = os.path.jo", ".jo"),
        ("foo(a, ", ", "),
        ('    """Retu', ('    """Retu', ' """Retu')),  # at most MAX_HEALED_TOKENS
        ("naïve é", ("", " é")),  # healed only where whole characters are tokens
        ("x = 1\n", ""),
        ("", ""),
    ],
)
def test_what_the_cursor_gives_back(tokenizer, prefix, answer_prefix) -> None:
    ids, prompt, healed_text = healed(tokenizer, prefix)
    assert healed_text in (answer_prefix if isinstance(answer_prefix, tuple) else [answer_prefix])
    assert text_of(tokenizer, prompt) + healed_text == text_of(tokenizer, ids)


# --------------------------------------------------------------------------- over HTTP (tiny)


def test_a_word_typed_halfway_is_read_without_it(client, tokenizer):
    prefix = "def main():\n    retur"
    body = {"model": TINY_ID, "prompt": prefix, "suffix": "\n", "max_tokens": 4, "stop": []}
    response = client.post("/v1/fim/completions", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    ids, prompt, _ = healed(tokenizer, prefix)
    assert usage["prompt_tokens"] == len(prompt) < len(ids)
    assert usage["completion_tokens"] == 4


def test_a_file_longer_than_the_context_is_a_context_length_error(client):
    prefix = "".join(f"value_{i} = {i}\n" for i in range(4000))  # ~28k tokens; context 4,096
    body = {"model": TINY_ID, "prompt": prefix, "suffix": "print(1)\n" * 500, "max_tokens": 8}
    response = client.post("/v1/fim/completions", json=body, headers=AUTH)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "context_length_exceeded",
        "prompt",
    )


def test_a_template_and_a_suffix_field_together_are_a_400(client):
    body = {
        "model": TINY_ID,
        "prompt": "<|fim_prefix|>def f(<|fim_suffix|>):\n<|fim_middle|>",
        "suffix": "):\n",
        "max_tokens": 2,
    }
    response = client.post("/v1/fim/completions", json=body, headers=AUTH)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "suffix"
