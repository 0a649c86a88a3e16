"""The runner off the CPU, checked where a CPU can check it.

On a CUDA GPU the runner runs the dense weights in the model's dtype (bf16 as prod.yaml loads
it): the same forward as a CPU runner with ``prefill_dtype: bfloat16`` and ``weights: dense``
over a bf16 model, which these tests run. Device placement is checked on the meta device: a
tensor a pass made on the CPU instead of the weights' device fails there, as it would on CUDA.
What only a GPU shows (speed, CUDA kernels' numbers) is bench/gpu.py's.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from serve_app.engine.backend_choice import make_backend
from serve_app.engine.engine import LLMEngine
from serve_app.engine.model_backend import PromptChunk
from serve_app.engine_config import EngineConfig
from serve_app.models.loader import DeviceError, LoadedModel, load_model, pick_device
from serve_app.runner.builder import build_runner, decode_weights, prefill_dtype
from serve_app.runner.qwen2 import unsupported_reason
from tests.conftest import engine_config, redrawn
from tests.runner_support import PROMPTS, encode

CUDA = torch.device("cuda")
# The engine as a GPU replica builds it: runner: auto, dense weights in the model's dtype.
GPU_LIKE = {"weights": "dense", "prefill_dtype": "bfloat16"}


@pytest.fixture(scope="module")
def bf16(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """The tiny model loaded in bf16, weights ``redrawn`` as the other runner tests'."""
    return redrawn(load_model("tiny:" + str(tmp_path_factory.mktemp("tiny")), dtype="bfloat16"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_cuda_on_a_machine_without_it_fails_at_start_and_says_so(tmp_path) -> None:
    for device in ("cuda", "cuda:1"):
        with pytest.raises(DeviceError, match="torch sees no CUDA GPU"):
            load_model("tiny:" + str(tmp_path), device=device)
    assert not (tmp_path / "config.json").exists()  # refused before building anything
    with pytest.raises(DeviceError, match="unknown device"):
        pick_device("gpu")
    assert pick_device("auto") == "cpu" and pick_device("cpu") == "cpu"


def test_off_the_cpu_the_runner_takes_dense_weights_in_the_model_dtype() -> None:
    """What configured_runner resolves for a CUDA model: auto is dense in the model's dtype;
    int4/int8 (CPU kernels) are refused with what to change. The CPU's answers stand."""
    assert decode_weights("auto", CUDA) == decode_weights("dense", CUDA) == "dense"
    for weights in ("q4", "int4", "int8"):
        with pytest.raises(DeviceError, match="run on CPU only.*engine.weights"):
            decode_weights(weights, CUDA)
    assert decode_weights("auto") in ("q4", "int4", "int8") and decode_weights("dense") == "dense"
    assert prefill_dtype("auto", CUDA, torch.bfloat16) == torch.bfloat16
    assert prefill_dtype("auto", CUDA, torch.float16) == torch.float16
    assert prefill_dtype("float32", CUDA, torch.bfloat16) == torch.float32


def test_runner_auto_serves_a_bf16_model_on_its_own_dense_weights(bf16) -> None:
    """runner: auto with dense bf16 weights is the runner, over the HF parameters themselves
    (no copy: on a GPU the model is in memory once); hf stays selectable as the reference."""
    engine = LLMEngine(bf16, engine_config(**GPU_LIKE))
    try:
        assert engine.stats().backend == "RunnerBackend"
        runner = engine.backend.runner
        assert runner.decode_weights == "dense" and runner.device == torch.device("cpu")
        weight = runner.layers[0].qkv.parts[0][0]
        hf_weight = bf16.model.model.layers[0].self_attn.q_proj.weight
        assert weight.dtype == torch.bfloat16 and weight.data_ptr() == hf_weight.data_ptr()
    finally:
        engine.shutdown()
    engine = LLMEngine(bf16, engine_config(runner="hf", **GPU_LIKE))
    assert engine.stats().backend == "HFBackend"
    engine.shutdown()


@dataclasses.dataclass
class Stream:
    """What a backend reads of a request (``ModelBackend``), and the greedy tokens it got."""

    prompt_ids: list[int]
    kv: Any = None
    num_computed: int = 0
    last_token_id: int = -1
    ids: list[int] = dataclasses.field(default_factory=list)
    logits: list[torch.Tensor] = dataclasses.field(default_factory=list)
    adapter: str = ""

    def take(self, logits: torch.Tensor) -> None:
        self.logits.append(logits.float())
        self.last_token_id = int(logits.argmax())
        self.ids.append(self.last_token_id)


def greedy_streams(loaded: LoadedModel, config, n: int, chunk: int = 16) -> list[Stream]:
    """``n`` greedy tokens for every prompt through the backend ``config`` picks, driven as
    the engine drives it: prompts read in ``chunk``-token pieces, then decoded as one batch."""
    backend = make_backend(loaded, config, max_columns=4096)
    streams = [Stream(encode(loaded, text)) for text in PROMPTS]
    with torch.inference_mode():
        for stream in streams:
            backend.begin(stream, None)
            for start in range(0, len(stream.prompt_ids), chunk):
                stream.num_computed = min(start + chunk, len(stream.prompt_ids))
                piece = PromptChunk(stream, start, stream.num_computed)
                (logits,) = backend.prefill([piece])
            stream.take(logits)
        backend.join(streams)
        for _ in range(n - 1):
            rows = list(backend.rows)
            for stream, logits in zip(rows, backend.decode([[] for _ in rows]), strict=True):
                stream.num_computed += 1
                stream.take(logits)
        backend.release(streams)
    return streams


# A logit gap the two bf16 forwards may see differently: HF rounds the residual stream to bf16
# after every layer, the runner keeps it in fp32 (their logits differ by up to ~0.5 here, on
# logits of magnitude ~10; bf16's step there is 0.06).
NEAR_TIE = 0.5


def test_bf16_runner_generates_the_hf_bf16_greedy_tokens(bf16) -> None:
    """Six prompts read in chunks and decoded as one batch, 8 tokens each: the runner on bf16
    weights picks the HF bf16 model's greedy tokens, up to where HF's own top two tokens are
    within ``NEAR_TIE`` (this random model has exact bf16 ties); past such a point the two
    continue different texts and are not compared."""
    runner = greedy_streams(bf16, engine_config(**GPU_LIKE), 8)
    hf = greedy_streams(bf16, engine_config(runner="hf"), 8)
    same = 0
    for ours, theirs in zip(runner, hf, strict=True):
        for step, (a, b) in enumerate(zip(ours.ids, theirs.ids, strict=True)):
            if a != b:
                gap = float(theirs.logits[step][b] - theirs.logits[step][a])
                assert gap <= NEAR_TIE, (ours.ids, theirs.ids, step, gap)
                break
            same += 1
    print(f"bf16 runner: {same}/{8 * len(PROMPTS)} greedy tokens as HF bf16's before a near-tie")
    assert same >= 8 * len(PROMPTS) // 2


def test_bf16_runner_is_as_close_to_fp32_as_the_hf_bf16_model(bf16) -> None:
    """Every prompt position's logits: the runner on bf16 weights is within 1.5x of the HF
    bf16 model's distance to the same weights in fp32, and picks fp32's greedy token about
    as often (measured: 129 and 128 of 133 positions)."""
    fp32 = copy.deepcopy(bf16.model).float()
    runner = build_runner(bf16.model, weights="dense", dense_dtype=torch.bfloat16)
    drift = {"runner": 0.0, "hf": 0.0}
    agree = {"runner": 0, "hf": 0}
    with torch.inference_mode():
        for text in PROMPTS:
            ids = encode(bf16, text)
            truth = fp32(torch.tensor([ids])).logits[0]
            logits = {
                "runner": runner.forward(runner.new_cache(1, 16, 4096), 0, [ids], [0], decode=True),
                "hf": bf16.model(torch.tensor([ids])).logits[0].float(),
            }
            for name, value in logits.items():
                drift[name] = max(drift[name], float((value - truth).abs().max()))
                agree[name] += int((value.argmax(-1) == truth.argmax(-1)).sum())
    assert drift["runner"] <= 1.5 * drift["hf"], drift
    assert agree["runner"] >= agree["hf"] - 3, agree


def meta_model() -> Qwen2ForCausalLM:
    """A tiny Qwen2 on the meta device: tensors with shapes and no data, so a pass checks
    where every tensor is without a GPU (mixing meta and CPU tensors raises, as CUDA's do)."""
    config = Qwen2Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    with torch.device("meta"):
        return Qwen2ForCausalLM._from_config(config, dtype=torch.bfloat16)


def test_every_tensor_a_pass_makes_is_on_the_weights_device() -> None:
    model = meta_model()
    assert "cpu and cuda, not meta" in (unsupported_reason(model) or "")
    runner = build_runner(model, weights="auto")  # off the CPU: dense
    assert runner.decode_weights == "dense" and runner.device.type == "meta"
    norms = [runner.final_norm] + [w for x in runner.layers for w in (x.input_norm, x.post_norm)]
    assert all(w.dtype == torch.float32 for w in norms)  # fp32 like x: the fused rms_norm
    cache = runner.new_cache(3, 16, 256)
    assert all(t.device.type == "meta" for t in cache.keys + cache.values)
    with torch.inference_mode():
        prefill = runner.forward(cache, 0, [[1, 2, 3, 4, 5]], [0], decode=False)
        cache.ensure(200)  # growth keeps the device
        step = runner.forward(cache, 0, [[1], [2, 3]], [5, 0], decode=True)  # ragged rows
        chunk = runner.forward(cache, 1, [[4, 5, 6]], [2], decode=False)
        mask = torch.ones(3, 8, dtype=torch.bool)  # a tree built on the CPU, as the scorer does
        tree = runner.forward_tree(cache, 0, 5, [7, 8, 9], torch.tensor([5, 6, 6]), mask)
    assert prefill.shape == (1, 512) and step.shape == (3, 512) and chunk.shape == (1, 512)
    assert tree.shape == (3, 64)
    assert all(t.device.type == "meta" for t in (prefill, step, chunk, tree))
    assert all(t.device.type == "meta" for t in cache.keys + cache.values)
    with pytest.raises(DeviceError, match="run on CPU only"):
        build_runner(model, weights="int8")


def test_the_engine_config_a_gpu_replica_gets_builds_a_dense_runner_in_the_model_dtype(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """configured_runner off the CPU, with the meta device standing in for CUDA (admitted for
    this test only): prod.yaml's engine block (weights and prefill_dtype auto) gives the runner
    on the model's own bf16 weights, where on this CPU auto would mean int8/int4 and fp32; the
    scorer gets the same; int4/int8 stop the replica at start."""
    from serve_app.runner import qwen2
    from serve_app.runner.builder import configured_runner

    monkeypatch.setattr(qwen2, "RUNNER_DEVICES", ("cpu", "cuda", "meta"))
    loaded = LoadedModel(meta_model(), None, "meta", "meta", "bfloat16")
    for config in (EngineConfig(), EngineConfig().for_scoring(0)):
        runner = configured_runner(loaded, config, "test")
        assert runner is not None and runner.decode_weights == "dense"
        # bf16: the parameters themselves (fp32, the CPU's auto here, would be a copy)
        assert runner.layers[0].gate_up.parts[0][0].dtype == torch.bfloat16
        assert not runner.quantized_prompts
    for weights in ("q4", "int4", "int8"):
        with pytest.raises(DeviceError, match="run on CPU only"):
            configured_runner(loaded, EngineConfig(weights=weights), "test")
    assert configured_runner(loaded, EngineConfig(runner="hf"), "test") is None
