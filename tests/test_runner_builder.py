"""Preparing the runner's weights: which decode weights ``auto`` picks, int4/int8 packs and
first-position entries saved on disk and mapped, and the dense layers left unread (or
handed back) once they are.
"""

from __future__ import annotations

import copy
import gc
import mmap
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from serve_app.engine_config import EngineConfig
from serve_app.models.loader import load_model
from serve_app.runner import native
from serve_app.runner.builder import (
    LINEARS,
    build_runner,
    configured_runner,
    decode_weights,
)
from serve_app.runner.weights import int8_supported
from tests.runner_support import PROMPTS, encode

ROOT = Path(__file__).resolve().parents[1]


def test_auto_weights_follow_the_cpu(loaded, tmp_path) -> None:
    """auto: q4 decode with 8-bit prompts wherever torch has its fbgemm/x86 int8 engine and
    the runner's C kernels build (AVX2 and a C compiler), the prompts then on the runner's q8;
    fbgemm's int8 where only the first holds, else int4."""
    runner = build_runner(loaded.model, weights="auto", cache_dir=tmp_path)
    expect_int8 = int8_supported()
    expect_q4 = expect_int8 and native.unavailable_reason() is None
    expected = "q4" if expect_q4 else "int8" if expect_int8 else "int4"
    assert decode_weights("auto") == runner.decode_weights == expected
    assert (runner.layers[0].down.int8 is not None) == (expect_int8 and not expect_q4)
    assert (runner.layers[0].down.q8 is not None) == expect_q4
    assert (runner.layers[0].down.q4 is not None) == expect_q4
    assert (runner.layers[0].down.int4 is not None) == (not expect_int8)
    assert decode_weights("dense") == "dense"


def test_prompts_on_int8_keep_the_models_own_dense_tensors(loaded) -> None:
    """The engine's defaults (auto everywhere): with prompts on the int8 weights the dense
    ones only compute first positions, so they stay the model's own fp32 tensors, uncopied,
    even where the CPU computes bf16 natively (a bf16 copy cost a replica ~1.5 GB)."""
    if not int8_supported():
        pytest.skip("no int8 engine in this torch: auto is int4, prompts dense")
    runner = configured_runner(loaded, EngineConfig(), "test")
    assert runner.quantized_prompts and runner.decode_weights in ("int8", "q4")
    down = runner.layers[0].down.parts[0][0]
    assert down.dtype == torch.float32
    assert down.data_ptr() == loaded.model.model.layers[0].mlp.down_proj.weight.data_ptr()


def test_int4_packs_are_cached_on_disk_and_mapped(loaded, tmp_path) -> None:
    first = build_runner(loaded.model, weights="int4", cache_dir=tmp_path)
    files = list(tmp_path.glob("runner-int4-*.pt"))
    assert len(files) == 1
    second = build_runner(loaded.model, weights="int4", cache_dir=tmp_path)
    x = torch.randn(2, loaded.model.config.hidden_size)
    torch.testing.assert_close(
        first.layers[0].qkv(x, True), second.layers[0].qkv(x, True), rtol=0, atol=0
    )


def test_saved_weights_leave_the_dense_layers_unread(loaded, tmp_path) -> None:
    """With int8 decode and prompts on it, everything a replica reads of the layers comes
    from the files the first replica saved (int8 values, the first-position entries of the
    tokens prompts start with): the dense weights poisoned after saving change nothing, so
    the memory-mapped model file stays out of every later replica's memory."""
    model = copy.deepcopy(loaded.model)
    start = loaded.tokenizer.convert_tokens_to_ids("<|im_start|>")
    prompt = [start, *encode(loaded, PROMPTS[0])]
    options = {"weights": "int8", "prompt_weights": "decode", "cache_dir": tmp_path}
    options |= {"first_tokens": [start]}

    def run(runner) -> torch.Tensor:
        cache = runner.new_cache(1, 16, 4096)
        with torch.inference_mode():
            out = [runner.forward(cache, 0, [prompt], [0], decode=False)]
            for step in range(3):
                token = [[int(out[-1][-1].argmax())]]
                out.append(runner.forward(cache, 0, token, [len(prompt) + step], decode=True))
        return torch.cat(out)

    saved = run(build_runner(model, **options))
    assert len(list(tmp_path.glob("runner-int8-*.pt"))) == 1
    assert len(list(tmp_path.glob("runner-first-float32-*.pt"))) == 1
    with torch.no_grad():
        for layer in model.model.layers:
            for linear in (*vars(layer.self_attn)["_modules"].values(), *layer.mlp.children()):
                if isinstance(linear, torch.nn.Linear):
                    linear.weight.view(-1)[32:-32] = float("nan")
    assert torch.isnan(run(build_runner(model, weights="dense"))).all()
    torch.testing.assert_close(run(build_runner(model, **options)), saved, rtol=0, atol=0)


def resident_pages(tensors: list[torch.Tensor]) -> int:
    """How many pages of ``tensors`` this process has in memory (``/proc/self/pagemap``'s
    present bit)."""
    present = 0
    with open("/proc/self/pagemap", "rb") as pagemap:
        for t in tensors:
            first = t.data_ptr() // mmap.PAGESIZE
            last = (t.data_ptr() + t.numel() * t.element_size() - 1) // mmap.PAGESIZE
            pagemap.seek(first * 8)
            entries = pagemap.read((last - first + 1) * 8)
            present += sum(e >> 63 for e in struct.unpack(f"{len(entries) // 8}Q", entries))
    return present


def test_a_first_start_hands_back_the_dense_layers_it_quantized(tmp_path) -> None:
    """The first replica reads every dense weight of the mapped model file to quantize it;
    where prompts and decode both run on the saved int8 weights, it hands those pages back
    once built, as a later replica never reads them (the 1.5B's 7 GB stayed resident)."""
    lm = load_model("tiny:" + str(tmp_path / "model"))
    for path in (tmp_path / "model").iterdir():  # written back, as a converted model is
        fd = os.open(path, os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    layers = [
        linear.weight
        for layer in lm.model.model.layers
        for linear in (layer.self_attn.q_proj, layer.self_attn.o_proj, layer.mlp.down_proj)
    ]
    assert all(torch.isfinite(w).all() for w in layers)
    read = resident_pages(layers)
    assert read >= sum(w.numel() * w.element_size() for w in layers) // mmap.PAGESIZE
    runner = build_runner(lm.model, weights="int8", prompt_weights="decode", cache_dir=tmp_path)
    assert len(list(tmp_path.glob("runner-int8-*.pt"))) == 1
    assert resident_pages(layers) < read // 4  # at most pages shared with a neighbouring tensor
    with torch.inference_mode():  # and read again from the file where needed
        dense = lm.model.model.layers[-1].mlp.down_proj(torch.ones(1, layers[-1].shape[1]))
        assert torch.isfinite(dense).all() and resident_pages(layers[-1:]) > 0
    assert runner.quantized_prompts


def test_the_int8_file_is_released_once_packed(loaded, tmp_path) -> None:
    """fbgemm keeps its own copy of the int8 weights: neither the replica that saves the file
    nor one that maps it later keeps the mapping (and every page prepacking read: 1.5 GB on
    the 1.5B) alive, smoothing vectors included."""
    if not int8_supported():
        pytest.skip("no int8 engine in this torch")
    calibration = encode(loaded, PROMPTS[0])
    for _ in range(2):  # the first replica saves the file, the second maps it
        runner = build_runner(
            loaded.model,
            weights="int8",
            cache_dir=tmp_path,
            calibration=calibration,
            int8_kernel="fbgemm",
        )
        gc.collect()
        (saved,) = tmp_path.glob("runner-int8-*.pt")
        assert str(saved) not in Path("/proc/self/maps").read_text()
        assert runner.layers[0].down.smooth is not None


def test_a_first_start_shows_its_preparation_on_stderr(tiny_source, tmp_path) -> None:
    """Quantizing the 1.5B takes a replica minutes on its first start: a process that set up
    no logging (a Serve replica) still prints what it prepares on stderr, which Serve shows;
    a start that maps the saved files prints nothing."""
    script = (
        "import sys; from serve_app.models.loader import load_model; "
        "from serve_app.runner.builder import build_runner; "
        f"build_runner(load_model({tiny_source!r}).model, weights='int8', cache_dir=sys.argv[1])"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", script, str(tmp_path)],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        for _ in range(2)
    ]
    assert "runner: preparing int8 weights, once" in runs[0].stderr
    assert "runner: quantizing weights:" in runs[0].stderr
    assert "runner:" not in runs[1].stderr


def test_saving_a_format_removes_its_older_versions(loaded, tmp_path) -> None:
    """The int8 file of an older format (v2: unsmoothed) is never read again: saving the
    current one removes it, and only it (another kind of file stays)."""
    older = tmp_path / "runner-int8-v2-0123456789abcdef.pt"
    other = tmp_path / "runner-first-float32-0123456789abcdef.pt"
    for path in (older, other):
        path.write_bytes(b"x")
    build_runner(loaded.model, weights="int8", cache_dir=tmp_path, calibration=[1, 2, 3])
    assert len(list(tmp_path.glob("runner-int8-v3-*.pt"))) == 1
    assert not older.exists() and other.exists()


def test_precise_activations_name_the_linears_that_round_twice(loaded, tmp_path) -> None:
    """Only the kinds named round their int8 activations twice (the down projection here, whose
    inputs peak at 20-57x their RMS), every layer's; a typo is an error, not a silent no-op."""
    runner = build_runner(
        loaded.model, weights="int8", cache_dir=tmp_path, precise_activations=("down",)
    )
    for layer in runner.layers:
        assert layer.down.precise
        assert not (layer.qkv.precise or layer.o.precise or layer.gate_up.precise)
    assert not runner.lm_head.precise
    every = build_runner(
        loaded.model, weights="int8", cache_dir=tmp_path, precise_activations=LINEARS
    )
    assert every.lm_head.precise and all(layer.qkv.precise for layer in every.layers)
    with pytest.raises(ValueError, match="unknown linears"):
        build_runner(loaded.model, weights="int8", cache_dir=tmp_path, precise_activations=("mlp",))
