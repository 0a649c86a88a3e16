"""bench/gpu.py's smoke mode: the GPU benchmark's whole path (random weights built on the
device, the engine on the runner, every figure) on a tiny config on CPU, in seconds."""

from __future__ import annotations

import re

import pytest

from bench import gpu


def test_smoke_prints_every_figure(capsys: pytest.CaptureFixture[str]) -> None:
    gpu.main(["--smoke"])
    out = capsys.readouterr().out
    assert out.splitlines()[-3:-1] == [
        "| model | single tok/s | 8-stream tok/s | 64-stream tok/s | TTFT 256 s | TTFT 1024 s |",
        "| ----- | ------------ | -------------- | --------------- | ---------- | ----------- |",
    ], out
    assert re.search(r"^device: CPU .+ threads$", out, re.M), out
    cells = out.splitlines()[-1].strip("|").split("|")
    assert cells[0].strip() == "tiny"
    assert all(float(cell) > 0 for cell in cells[1:]), out


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
