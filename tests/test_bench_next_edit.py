"""bench/next_edit.py on any config and checkpoint folder: the path the GPU run takes
(``bench.random_checkpoint``'s folder served as configs/local.yaml serves its EditModel), on
the tiny model's tokenizer, one case written here in the cases' format, in seconds. (The
bench's own cases are fetched material: they live outside the project, in shared/data/.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import next_edit, random_checkpoint
from serve_app.models.tiny import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]

# A rename in the history, and the call site below it still to update.
FILE = "def subtotal(items):\n    return sum(i.price for i in items)\n\n\nprint(total(cart))\n"
CASE = {
    "repo": "tests/rename",
    "commit": "0" * 40,
    "path": "cart.py",
    "language": "python",
    "file": FILE,
    "first_line": 3,
    "last_line": 4,
    "cursor": [4, 6],
    "expected": "\nprint(subtotal(cart))",
    "hunks": [
        "@@ -1,2 +1,2 @@\n-def total(items):\n+def subtotal(items):\n"
        "     return sum(i.price for i in items)"
    ],
    "snippets": [["shop.py", "from cart import subtotal\n"]],
}


def test_a_random_checkpoint_answers_the_cases_through_a_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tokenizer = build_tiny_model(tmp_path / "tiny")
    folder = tmp_path / "random"
    random_checkpoint.main(
        ["--shape", "tiny", "--tokenizer", str(tokenizer), "--out", str(folder), "--device", "cpu"]
    )
    assert (folder / "tokenizer.json").exists() and (folder / "config.json").exists()
    variant = "chat_split/as-sent"
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([CASE]))
    next_edit.main(
        ["--config", str(ROOT / "configs" / "local.yaml"), "--source", str(folder),
         "--data", str(cases), "--cases", "1", "--variants", variant, "--repeat-for", variant,
         "--answer-tokens", "expected", "--log", str(tmp_path / "log.jsonl")]
    )  # fmt: skip
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith(f"| {variant} "))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1].endswith("/1"), out  # one case answered
    assert cells[-3] != "-" and cells[-2] != "-", out  # cold and repeat timed
    logged = (tmp_path / "log.jsonl").read_text().splitlines()
    assert len(logged) == 1 and '"repeat_s"' in logged[0]


def test_the_tuned_variant_answers_with_the_adapter(tmp_path: Path) -> None:
    """With an adapter of zero weights the tuned variant answers as its untuned twin (same
    prompt style, same request fields): the bench routes it through the adapter, and the
    adapter is applied per request, not to the other variants. Cases read as JSON lines, the
    miner's format."""
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folder = build_tiny_model(tmp_path / "tiny")
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(folder), LoraConfig(r=2, target_modules=["q_proj"])
    )
    model.save_pretrained(tmp_path / "adapter")
    cases = tmp_path / "cases.jsonl"
    cases.write_text(json.dumps(CASE) + "\n")
    log = tmp_path / "log.jsonl"
    next_edit.main(
        ["--config", str(ROOT / "configs" / "local.yaml"), "--source", str(folder),
         "--data", str(cases), "--variants", "chat_split/as-sent,tuned/as-sent",
         "--repeat-for", "", "--answer-tokens", "expected", "--adapter",
         str(tmp_path / "adapter"), "--log", str(log)]
    )  # fmt: skip
    answers = {e["variant"]: e["answer"] for e in map(json.loads, log.read_text().splitlines())}
    assert set(answers) == {"chat_split/as-sent", "tuned/as-sent"}
    assert answers["tuned/as-sent"] == answers["chat_split/as-sent"]


def test_edit_support_splits_a_logged_run_by_what_the_prompt_shows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Carrying the history's rename on is shown by the prompt; a call seen nowhere is not.
    Each part is tallied as bench.next_edit tallies a whole run."""
    from bench import edit_support

    invented = {**CASE, "path": "invented.py", "expected": "\nprint(apply_discount(cart, 0.1))"}
    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([CASE, invented]))
    names = [case.name for case in next_edit.load_cases(cases, None)]
    answers = [CASE["expected"], "\nprint(total(cart))"]  # the first exact, the second a no-op
    log = tmp_path / "log.jsonl"
    log.write_text(
        "".join(
            json.dumps(
                {
                    "case": name,
                    "variant": "chat_split/as-sent",
                    "answer": answer,
                    "tokens": [100, 0, 10],
                    "rejected": None,
                    "cold_s": 1.0,
                }
            )
            + "\n"
            for name, answer in zip(names, answers, strict=True)
        )
    )
    edit_support.main(["--from-log", str(log), "--data", str(cases)])
    out = capsys.readouterr().out
    shown, not_shown = out.split("not shown")
    assert "1 cases" in shown and "| chat_split/as-sent | 1/1 " in shown, out
    assert "1 cases" in not_shown and "| chat_split/as-sent | 0/1 " in not_shown, out


def test_the_cases_can_put_the_cursor_where_editors_do(tmp_path: Path) -> None:
    """``--cursor``: at the line's end; after the first new line half typed (the region holds
    a beginning of it, the cursor after that); on the region's first line, the region cut from
    there as Continue cuts it, the expected region with it."""
    from bench.next_edit import region_of

    cases = tmp_path / "cases.json"
    cases.write_text(json.dumps([CASE]))
    (at_end,) = next_edit.load_cases(cases, None, cursor="line-end")
    assert at_end.scenario.cursor == (4, len("print(total(cart))"))
    (typing,) = next_edit.load_cases(cases, None, cursor="mid-line")
    row, column = typing.scenario.cursor
    typed = typing.scenario.file.split("\n")[row]
    assert column == len(typed) and "print(subtotal(cart))".startswith(typed)
    assert typed not in ("", "print(subtotal(cart))") and typing.expected == CASE["expected"]
    (cut,) = next_edit.load_cases(cases, None, cursor="region-start")
    assert cut.scenario.first_line == 4 and region_of(cut.scenario).startswith("print(total")
    assert cut.expected.startswith("print(subtotal(cart))")


def test_an_answer_is_counted_as_losing_a_line_only_where_the_expected_edit_keeps_it() -> None:
    from bench.edit_scores import drops_kept_line

    region, expected = "a\n  b\nc\nc", "a\n  B\nc\nc"
    assert drops_kept_line(region, expected, "a\n  B\nc")  # one of the two c lines lost
    assert not drops_kept_line(region, expected, expected)
    assert not drops_kept_line(region, expected, region)  # a no-op loses nothing
    assert not drops_kept_line(region, "a\nc\nc", "a\n    c\nc")  # b deleted, as expected
