"""bench/gpu.py's smoke mode: the GPU benchmark's whole path (random weights built on the
device, the engine on the runner, every figure) on a tiny config on CPU, in seconds."""

from __future__ import annotations

import re

import pytest

from bench import gpu


def test_smoke_prints_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    """Both decode modes (CUDA graphs on and off: the same eager step on CPU), TTFT once,
    and their ratios with how many greedy tokens they agree on (all: the same step)."""
    gpu.main(["--smoke"])
    lines = capsys.readouterr().out.splitlines()
    out = "\n".join(lines)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines]
    head = rows.index(
        ["model", "single tok/s", "8-stream tok/s", "64-stream tok/s", "TTFT 256 s", "TTFT 1024 s"]
    )
    assert re.search(r"^device: CPU .+ threads$", out, re.M), out
    on, off = (
        [c.strip() for c in line.strip("|").split("|")] for line in lines[head + 2 : head + 4]
    )
    assert on[0] == "tiny graphs" and off[0] == "tiny eager", out
    assert all(float(cell) > 0 for cell in on[1:] + off[1:4]), out
    assert off[4:] == ["-", "-"], out
    ratios = next(row for row in rows if row[-1] == "8/8")
    assert ratios[0] == "tiny", out
    assert all(float(cell.removesuffix("x")) > 0 for cell in ratios[1:4]), out
    # Each figure as a share of its limit, the card measured in the same run.
    assert re.search(
        r"^card: copy [\d.]+ TB/s \(read \+ written\), matrix [\d.]+ TFLOP/s", out, re.M
    )
    shares = next(row for row in rows if row[0] == "tiny graphs" and row[1].endswith("%"))
    assert all(cell.endswith("%") for cell in shares[1:6]), out
    assert shares[6].endswith("x the prompt's"), out
    # The prompt attention against the padded mask, both timed, their outputs close.
    attention = next(row for row in rows if row[0] == "tiny" and "max diff" in row[2])
    assert float(attention[2].split("(max diff ")[1].rstrip(")")) < 0.05, out


def test_shapes_are_qwen25_coders() -> None:
    """The published parameter counts (0.49B, 1.54B, 7.62B), from the configs alone."""
    from transformers import Qwen2Config

    def parameters(shape: str) -> float:
        c = Qwen2Config(**gpu.SHAPES[shape], **gpu.COMMON)
        kv = c.num_key_value_heads * (c.hidden_size // c.num_attention_heads)
        attention = c.hidden_size * (2 * c.hidden_size + 2 * kv) + c.hidden_size + 2 * kv
        mlp = 3 * c.hidden_size * c.intermediate_size
        layer = attention + mlp + 2 * c.hidden_size
        heads = 1 if c.tie_word_embeddings else 2
        return (c.num_hidden_layers * layer + heads * c.vocab_size * c.hidden_size) / 1e9

    assert [round(parameters(s), 2) for s in ("0.5b", "1.5b", "7b")] == [0.49, 1.54, 7.62]


def test_draft_model_bench_on_random_shapes_keeps_every_text(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """bench/draft_model.py's GPU path (bench.gpu's random models) on the tiny shape on CPU:
    every mode prints its row, the same text as no speculation, and the step-cost table."""
    from bench import draft_model

    draft_model.main(["--random", "tiny:tiny", "--cases", "2", "--tokens", "12"])
    out = capsys.readouterr().out
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    for mode in draft_model.MODES:
        assert rows[mode].rstrip(" |").endswith("yes"), out
    assert re.search(r"^target step [\d.]+ ms; draft step [\d.]+ ms", out, re.M), out
    assert "| 8 |" in out


def test_load_smoke_leaves_nothing_behind(capsys: pytest.CaptureFixture[str]) -> None:
    """bench.gpu_load on the tiny config: every request ends (none raises, none left without a
    finish reason unless its client closed it) and the engine holds nothing afterwards."""
    from bench import gpu_load

    gpu_load.main(["--smoke"])
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| tiny"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "30" and cells[3:6] == ["0", "0", "0/0"], out
    hits, queries = (int(n) for n in cells[6].split("/"))
    assert queries == 30 and hits > 0, out  # keystrokes share their account's file


def test_smoke_beside_transformers_prints_each_figure_with_its_ratio(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--peer transformers``: transformers' generate on the same random model, each engine
    figure beside it with the ratio and the engine's share of its limit."""
    gpu.main(["--smoke", "--graphs", "on", "--peer", "transformers"])
    lines = capsys.readouterr().out.splitlines()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines if "|" in line]
    head = rows.index(
        ["figure", "this engine", "transformers", "engine / transformers", "share of limit"]
    )
    figures = {row[0]: row for row in rows[head + 2 :]}
    assert set(figures) == {
        "tiny one stream tok/s",
        "tiny 8 streams tok/s",
        "tiny 64 streams tok/s",
        "tiny TTFT 256",
        "tiny TTFT 1024",
    }
    for row in figures.values():
        assert float(row[3].split("x")[0]) > 0 and row[4].endswith("%"), row
    assert "static" in figures["tiny one stream tok/s"][2]
