"""bench/next_edit.py on any config and checkpoint folder: the path the GPU run takes
(``bench.random_checkpoint``'s folder served as configs/local.yaml serves its EditModel), on
the tiny model's tokenizer, one real case, in seconds."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import next_edit, random_checkpoint
from serve_app.engine.tiny import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]


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
    next_edit.main(
        ["--config", str(ROOT / "configs" / "local.yaml"), "--source", str(folder),
         "--cases", "1", "--variants", variant, "--repeat-for", variant,
         "--answer-tokens", "expected", "--log", str(tmp_path / "log.jsonl")]
    )  # fmt: skip
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith(f"| {variant} "))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1].endswith("/1"), out  # one case answered
    assert cells[-3] != "-" and cells[-2] != "-", out  # cold and repeat timed
    logged = (tmp_path / "log.jsonl").read_text().splitlines()
    assert len(logged) == 1 and '"repeat_s"' in logged[0]
