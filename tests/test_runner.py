"""The engine's own runner on the tiny model: dense output identical to the HF model, int4 close
to it, prefix-cache reuse exact, speculation exact (greedy and seeded sampling), int4 packs
cached on disk.

Weights are redrawn with std 0.3 (as in test_engine) so outputs depend on the prompt.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import mmap
import os
import struct

import pytest
import torch

from serve_app.engine.engine import LLMEngine
from serve_app.engine.loader import LoadedModel, load_model
from serve_app.engine.prefix_cache import PrefixCache
from serve_app.engine.protocol import GenerationRequest, SamplingParams, generate_text
from serve_app.engine.runner.prepare import build_runner, cpu_has_bf16_compute, decode_weights
from serve_app.engine.runner.speculation import propose_draft
from serve_app.engine.runner.weights import (
    INT4_GROUP,
    Linear,
    dequantize_int4_reference,
    int4_supported,
    int8_values,
    quantize_int4,
    quantize_int8,
)
from tests.conftest import engine_config, speculating

PROMPTS = [
    "def add(a, b):",
    "class Point:\n    def __init__(self, x, y):",
    "for i in range(10):\n    print(i)\n" * 3,
    "x",
    "import os\nimport sys\n\nif __name__ == '__main__':\n    main()\n" * 2,
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):",
]


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    lm = load_model("tiny:" + str(tmp_path_factory.mktemp("tiny")))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in lm.model.parameters():
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return dataclasses.replace(lm, eos_token_ids=[])


def reference(loaded: LoadedModel, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding through the HF model, the whole sequence at every step."""
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(loaded.model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def generate_all(
    loaded: LoadedModel, config, requests: list[GenerationRequest]
) -> tuple[list[list[int]], LLMEngine]:
    """Run requests concurrently; returns each one's token ids (re-encoded from its text is
    lossy, so the ids come from the detokenizer-independent usage: we decode via the text)."""
    engine = LLMEngine(loaded, config)
    try:

        async def main():
            return await asyncio.gather(*(generate_text(engine, r) for r in requests))

        results = asyncio.run(asyncio.wait_for(main(), timeout=120))
    finally:
        engine.shutdown()
    return [text for text, _ in results], engine


def encode(loaded: LoadedModel, text: str) -> list[int]:
    return loaded.tokenizer.encode(text)


def greedy(rid: str, prompt: list[int], n: int, role: str = "") -> GenerationRequest:
    return GenerationRequest(rid, prompt, SamplingParams(max_tokens=n), "test", role=role)


def test_runner_is_the_default_backend_and_hf_stays_selectable(loaded) -> None:
    for config, backend in (
        (engine_config(), "RunnerBackend"),
        (engine_config(runner="hf"), "HFBackend"),
    ):
        engine = LLMEngine(loaded, config)
        assert engine.stats().backend == backend
        engine.shutdown()


def test_dense_runner_matches_hf_through_joins_and_leaves(loaded) -> None:
    """Six requests of different lengths through three slots: rows join, leave and are
    compacted while others decode; every output equals the HF model's greedy output."""
    prompts = [encode(loaded, t) for t in PROMPTS]
    lengths = [5, 30, 12, 20, 8, 25]
    requests = [
        greedy(f"r{i}", p, n) for i, (p, n) in enumerate(zip(prompts, lengths, strict=True))
    ]
    texts, _ = generate_all(
        loaded, engine_config(max_batch_size=3, prefill_chunk_tokens=16), requests
    )
    for text, prompt, n in zip(texts, prompts, lengths, strict=True):
        assert text == loaded.tokenizer.decode(
            reference(loaded, prompt, n), skip_special_tokens=True
        )


def test_prefix_hit_reproduces_cold_logits(loaded) -> None:
    """KV copied out of a slot into the prefix cache and back into another slot gives the same
    logits for the rest of the prompt as reading it cold."""
    runner = build_runner(loaded.model, weights="dense")
    cache = runner.new_cache(3, 16, 4096)
    prompt = encode(loaded, PROMPTS[4])
    with torch.inference_mode():
        cold = runner.forward(cache, 0, [prompt], [0], decode=True)
        prefix = PrefixCache()
        prefix.insert(prompt[:20], cache.read(0, 20), "test")
        hit, kv = prefix.lookup(prompt, "test")
        assert hit == 20
        cache.load(2, kv)
        warm = runner.forward(cache, 2, [prompt[20:]], [20], decode=True)
    torch.testing.assert_close(warm, cold[20:], rtol=0, atol=1e-4)


def test_int4_kernel_computes_the_dequantized_matrix() -> None:
    weight = torch.randn(48, 4 * INT4_GROUP, generator=torch.Generator().manual_seed(1))
    packed, scales = quantize_int4(weight)
    dequantized = dequantize_int4_reference(weight)
    assert (dequantized - weight).abs().max() <= (weight.abs().max() * 2 / 15)  # half a step
    x = torch.randn(3, 4 * INT4_GROUP).bfloat16()
    y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, INT4_GROUP, scales).float()
    expected = x.float() @ dequantized.t()
    # bf16 output: within a couple of bf16 steps (1/128 relative) of the largest value.
    torch.testing.assert_close(y, expected, rtol=0, atol=float(expected.abs().max()) / 64)


def int4_numbers(loaded: LoadedModel) -> LoadedModel:
    """A copy of the HF model whose layers' linear weights are what int4 keeps of them (the
    tiny model's 399-row lm_head does not fit the kernel's 16-row blocks: it stays dense)."""
    assert not int4_supported(loaded.model.config.vocab_size, INT4_GROUP)
    model = copy.deepcopy(loaded.model)
    with torch.no_grad():
        for module in model.model.layers.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight.copy_(dequantize_int4_reference(module.weight))
    return dataclasses.replace(loaded, model=model)


def test_int4_decode_computes_its_dequantized_weights(loaded) -> None:
    """Decode forwards run on int4: their logits are those of the model whose
    weights are int4's dequantized values, up to bf16 activations, which is ~20x closer than
    that model is to the fp32 one; the greedy picks agree."""
    runner = build_runner(loaded.model, weights="int4")
    cache = runner.new_cache(1, 16, 4096)
    prompt = encode(loaded, PROMPTS[1])[:12]
    with torch.inference_mode():
        logits = runner.forward(cache, 0, [prompt], [0], decode=True)
        expected = int4_numbers(loaded).model(torch.tensor([prompt])).logits[0]
        fp32 = loaded.model(torch.tensor([prompt])).logits[0]
    drift = (expected - fp32).abs().max()
    assert (logits - expected).abs().max() < drift / 10
    assert torch.equal(logits.argmax(-1), expected.argmax(-1))


def test_int4_engine_output_against_fp32(loaded) -> None:
    """Reports how many greedy outputs int4 keeps identical to fp32 on this random model
    (std 0.3 weights amplify quantization; bench.int4_faithfulness measures the 0.5B)."""
    prompts = [encode(loaded, t) for t in PROMPTS]
    requests = [greedy(f"r{i}", p, 16) for i, p in enumerate(prompts)]
    int4, engine = generate_all(loaded, engine_config(weights="int4"), requests)
    dense, _ = generate_all(loaded, engine_config(weights="dense"), requests)
    same = sum(a == b for a, b in zip(int4, dense, strict=True))
    print(f"tiny model: {same}/{len(prompts)} int4 greedy outputs identical to fp32")
    assert engine.stats().backend == "RunnerBackend" and all(int4)


def test_int8_linear_is_close_to_dense() -> None:
    """fbgemm's int8 linear: per-channel int8 weights and per-call uint8 activations keep a
    matrix product within ~2% of its largest value (the tiny model amplifies it;
    bench.int4_faithfulness measures the 0.5B)."""
    generator = torch.Generator().manual_seed(2)
    weight = torch.randn(64, 96, generator=generator)
    bias = torch.randn(64, generator=generator)
    x = torch.randn(3, 96, generator=generator)
    y = Linear([(weight, bias)], int8=quantize_int8(weight))(x, True)
    expected = x @ weight.t() + bias
    assert y.dtype == torch.float32 and y.shape == expected.shape
    assert (y - expected).abs().max() < expected.abs().max() * 0.02


def test_int8_rows_do_not_depend_on_the_rest_of_the_call() -> None:
    """Each row is quantized on its own scale: a row's result is bit-identical alone and next
    to a row with 30x its activations, and that row does not coarsen it."""
    generator = torch.Generator().manual_seed(3)
    weight = torch.randn(64, 96, generator=generator)
    bias = torch.randn(64, generator=generator)
    linear = Linear([(weight, bias)], int8=quantize_int8(weight))
    x = torch.randn(4, 96, generator=generator)
    x[2] *= 30
    batched = linear(x, True)
    alone = torch.cat([linear(x[i : i + 1], True) for i in range(4)])
    assert torch.equal(batched, alone)
    expected = x[0] @ weight.t() + bias
    assert (batched[0] - expected).abs().max() < expected.abs().max() * 0.02


def test_precise_int8_leaves_under_a_thirtieth_of_the_activation_rounding_error() -> None:
    """Rows peaking at 40x their RMS (the down projection's input): one 7-bit rounding leaves
    a typical element a few levels; the second pass over what it dropped leaves the weights'
    rounding alone, and still works per row."""
    generator = torch.Generator().manual_seed(5)
    weight = torch.randn(64, 512, generator=generator)
    x = torch.randn(6, 512, generator=generator)
    x[:, 7] = 40 * x.pow(2).mean(1).sqrt()
    values, scales = int8_values(weight)
    exact = x @ (values.float() * scales.unsqueeze(1).float()).t()  # the int8 weights, fp32 math
    packed = quantize_int8(weight)
    one, two = (Linear([(weight, None)], int8=packed, precise=p)(x, True) for p in (False, True))
    assert (two - exact).abs().max() < (one - exact).abs().max() / 30
    alone = torch.cat(
        [Linear([(weight, None)], int8=packed, precise=True)(x[i : i + 1], True) for i in range(6)]
    )
    assert torch.equal(two, alone)


@pytest.mark.parametrize("weights", ["int8", "int4", "dense"])
def test_a_request_decodes_the_same_alone_and_batched(loaded, weights) -> None:
    """Concurrent requests share every decode step; each one's tokens are those it gets alone."""
    prompts = [encode(loaded, t) for t in PROMPTS]
    requests = [greedy(f"r{i}", p, 24) for i, p in enumerate(prompts)]
    config = engine_config(weights=weights, prefix_cache_mb=0)
    batched, engine = generate_all(loaded, config, requests)
    assert engine.stats().peak_decode_batch == len(prompts)
    alone = [generate_all(loaded, config, [r])[0][0] for r in requests]
    assert batched == alone


def kv_of(cache, length: int) -> torch.Tensor:
    """Every layer's keys and values of slot 0's first ``length`` positions, as one tensor."""
    return torch.cat([torch.cat([k, v]).flatten() for k, v in cache.read(0, length)])


def test_int8_engine_decodes_on_int8_and_prefills_dense(loaded) -> None:
    """weights="int8": decode steps run fbgemm's int8 linears, prompts the dense weights, so a
    prefill writes exactly the dense runner's KV and a decode step's logits stay close. Both
    read their logits through the int8 head (it feeds no KV)."""
    dense = build_runner(loaded.model, weights="dense")
    int8 = build_runner(loaded.model, weights="int8")
    assert int8.layers[0].qkv.int8 is not None and dense.layers[0].qkv.int8 is None
    prompt = encode(loaded, PROMPTS[1])[:12]
    with torch.inference_mode():
        caches = [runner.new_cache(1, 16, 4096) for runner in (dense, int8)]
        prefill = [
            r.forward(c, 0, [prompt], [0], decode=False)
            for r, c in zip((dense, int8), caches, strict=True)
        ]
        kv = [kv_of(c, len(prompt)) for c in caches]
        step = [
            r.forward(c, 0, [[5]], [12], decode=True)
            for r, c in zip((dense, int8), caches, strict=True)
        ]
    torch.testing.assert_close(kv[1], kv[0], rtol=0, atol=0)
    assert (prefill[1] - prefill[0]).abs().max() < prefill[0].abs().max() * 0.1
    assert not torch.equal(step[1], step[0])
    assert (step[1] - step[0]).abs().max() < step[0].abs().max() * 0.1
    requests = [greedy("r0", prompt, 8)]
    texts, engine = generate_all(loaded, engine_config(weights="int8"), requests)
    assert engine.stats().backend == "RunnerBackend" and all(texts)


def test_a_small_prompt_chunk_runs_on_the_decode_weights(loaded) -> None:
    """A prompt chunk of at most ``small_prefill_tokens`` tokens after the prompt's start (the
    tail after a prefix-cache hit) runs on int8 like a decode step, since on dense weights it
    would cost a decode step's time: its KV is what a decode pass over the same tokens writes.
    A longer chunk, a chunk holding position 0 (whose outsized activations int8 flattens:
    ``Qwen2Runner.first_token``), or any chunk with the threshold at 0 writes the dense KV
    exactly."""
    small = build_runner(loaded.model, weights="int8", small_prefill_tokens=8)
    plain = build_runner(loaded.model, weights="int8")
    prompt = encode(loaded, PROMPTS[1])[:16]
    for start, end in ((4, 10), (4, 16), (0, 6)):
        with torch.inference_mode():
            caches = [runner.new_cache(1, 16, 4096) for runner in (small, plain, small)]
            for cache in caches:  # the same dense prefix in every cache
                if start:
                    plain.forward(cache, 0, [prompt[:start]], [0], decode=False)
            chunk = [prompt[start:end]]
            small.forward(caches[0], 0, chunk, [start], decode=False)
            plain.forward(caches[1], 0, chunk, [start], decode=False)
            small.forward(caches[2], 0, chunk, [start], decode=True)  # on the int8 weights
        ran, dense, decoded = (kv_of(c, end) for c in caches)
        if start > 0 and end - start <= 8:
            torch.testing.assert_close(ran, decoded, rtol=1e-4, atol=1e-4)
            assert (ran - dense).abs().max() > 1e-3
        else:
            torch.testing.assert_close(ran, dense, rtol=0, atol=0)
    config = engine_config(weights="int8", small_prefill_tokens=8)
    texts, engine = generate_all(loaded, config, [greedy("r0", prompt[:6], 8)])
    assert engine.stats().backend == "RunnerBackend" and all(texts)


def test_prompts_on_the_decode_weights_keep_position_zero_dense(loaded, monkeypatch) -> None:
    """prompt_weights="decode": position 0 is the dense runner's exactly (computed once per
    token id and kept), every later position is what a decode pass over the same tokens
    writes (int8, so not the dense KV), whatever the chunking; a one-token prompt reads its
    logits from the kept entry; the kept entries are bounded."""
    from serve_app.engine.runner import qwen2

    dense = build_runner(loaded.model, weights="dense")
    quantized = build_runner(loaded.model, weights="int8", prompt_weights="decode")
    assert quantized.quantized_prompts and not dense.quantized_prompts
    prompt = encode(loaded, PROMPTS[1])[:16]
    with torch.inference_mode():
        whole, chunked, decoded, ref = (quantized.new_cache(1, 16, 4096) for _ in range(4))
        logits = quantized.forward(whole, 0, [prompt], [0], decode=False)
        for start, end in ((0, 5), (5, 16)):  # the second reads the kept position 0
            chunk_logits = quantized.forward(chunked, 0, [prompt[start:end]], [start], decode=False)
        dense.forward(ref, 0, [prompt], [0], decode=False)
        dense.forward(decoded, 0, [prompt[:1]], [0], decode=False)
        quantized.forward(decoded, 0, [prompt[1:]], [1], decode=True)
        assert list(quantized.first_tokens) == [prompt[0]]
        one = [quantized.forward(c, 0, [prompt[:1]], [0], decode=False) for c in (whole, ref)]
    torch.testing.assert_close(kv_of(whole, 1), kv_of(ref, 1), rtol=0, atol=0)
    torch.testing.assert_close(kv_of(whole, 16), kv_of(decoded, 16), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(kv_of(chunked, 16), kv_of(whole, 16), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(chunk_logits, logits, rtol=1e-4, atol=1e-4)
    assert (kv_of(whole, 16) - kv_of(ref, 16)).abs().max() > 1e-3  # the rest ran on int8
    torch.testing.assert_close(one[0], one[1], rtol=0, atol=0)

    monkeypatch.setattr(qwen2, "FIRST_TOKENS_KEPT", 3)
    with torch.inference_mode():
        for token in (7, 8, 9, 7, 10):
            quantized.forward(ref, 0, [[token, 11]], [0], decode=False)
    assert list(quantized.first_tokens) == [9, 7, 10]
    config = engine_config(weights="int8", prompt_weights="decode")
    texts, engine = generate_all(loaded, config, [greedy("r0", prompt, 8)])
    assert engine.stats().backend == "RunnerBackend" and all(texts)


def test_auto_weights_follow_the_cpu(loaded, tmp_path) -> None:
    """auto: int8 where the CPU has no native bf16 (the int4 kernel's activations), else int4."""
    runner = build_runner(loaded.model, weights="auto", cache_dir=tmp_path)
    expect_int8 = not cpu_has_bf16_compute()
    assert decode_weights("auto") == ("int8" if expect_int8 else "int4")
    assert (runner.layers[0].down.int8 is not None) == expect_int8
    assert (runner.layers[0].down.int4 is not None) == (not expect_int8)
    assert decode_weights("dense") == "dense"


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


def test_propose_draft() -> None:
    assert propose_draft([1, 2, 3, 9, 1, 2, 3], 2) == [9, 1]
    assert propose_draft([5, 6, 7, 8], 3) == []  # the last n-gram never occurred before
    assert propose_draft([1, 2, 3, 4, 1, 2], 5) == [3, 4, 1, 2]  # shorter when near the end
    assert propose_draft([1, 2], 0) == []


@pytest.fixture(scope="module")
def repetitive(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """The tiny model as initialised (std 0.02): it repeats itself, so drafts get accepted."""
    lm = load_model("tiny:" + str(tmp_path_factory.mktemp("tiny-plain")))
    return dataclasses.replace(lm, eos_token_ids=[])


# top_k=2 keeps sampled text repetitive enough to draft from on the near-uniform plain model.
@pytest.mark.parametrize("params", [{}, {"temperature": 0.9, "top_k": 2, "seed": 7}])
@pytest.mark.parametrize(
    ("model", "weights"),
    [
        ("loaded", "dense"),
        ("repetitive", "dense"),
        ("repetitive", "int4"),
        ("loaded", "int8"),
        ("repetitive", "int8"),
    ],
)
def test_speculation_gives_the_same_tokens(request, model, weights, params) -> None:
    """Greedy: identical by construction. Seeded sampling: each emitted token is drawn with the
    request's own generator exactly as without speculation, so the text is identical too."""
    lm = request.getfixturevalue(model)
    prompts = [encode(lm, t) for t in PROMPTS]

    def requests(role: str) -> list[GenerationRequest]:
        return [
            GenerationRequest(
                f"r{i}", p, SamplingParams(max_tokens=40, **params), "test", role=role
            )
            for i, p in enumerate(prompts)
        ]

    spec_config = engine_config(weights=weights, speculation=speculating(edit=4))
    plain, _ = generate_all(lm, engine_config(weights=weights), requests("edit"))
    spec, engine = generate_all(lm, spec_config, requests("edit"))
    assert spec == plain
    stats = engine.stats()
    assert stats.accepted_draft_tokens <= stats.draft_tokens
    if model == "repetitive":  # drafts verified, several tokens per step
        assert stats.accepted_draft_tokens > 0
        assert stats.decode_steps < len(prompts) * (40 - 1)
    _, other = generate_all(lm, spec_config, requests("fim"))
    assert other.stats().draft_tokens == 0  # only the configured role speculates


def test_speculation_stops_above_its_batch_limit(repetitive) -> None:
    """Drafts only while the decode batch is at most ``draft_max_batch`` rows: a lone request
    drafts under a limit of 1, and no request drafts under a limit of 0."""
    prompt = encode(repetitive, PROMPTS[0])
    request = GenerationRequest("s", prompt, SamplingParams(max_tokens=24), "test", role="fim")
    drafts = {}
    for limit in (1, 0):
        config = engine_config(speculation=speculating(limit, fim=4))
        (text,), engine = generate_all(repetitive, config, [request])
        drafts[limit] = (engine.stats().draft_tokens, text)
    assert drafts[1][0] > 0 and drafts[0][0] == 0
    assert drafts[1][1] == drafts[0][1]


def test_speculation_keeps_json_constraints(loaded) -> None:
    prompt = encode(loaded, PROMPTS[2])
    params = SamplingParams(max_tokens=40, response_format={"type": "json_object"})
    request = GenerationRequest("j", prompt, params, "test", role="chat")
    (plain,), _ = generate_all(loaded, engine_config(), [request])
    (spec,), _ = generate_all(loaded, engine_config(speculation=speculating(chat=4)), [request])
    assert spec == plain


def test_bf16_prefill_runs_where_asked(loaded) -> None:
    """``prefill_dtype=bfloat16`` (chosen automatically on AVX512-BF16/AMX CPUs) serves too; its
    first tokens match fp32 on this model."""
    prompts = [encode(loaded, t) for t in PROMPTS[:3]]
    requests = [greedy(f"r{i}", p, 1) for i, p in enumerate(prompts)]
    bf16, engine = generate_all(loaded, engine_config(prefill_dtype="bfloat16"), requests)
    fp32, _ = generate_all(loaded, engine_config(prefill_dtype="float32"), requests)
    assert engine.stats().backend == "RunnerBackend"
    assert sum(a == b for a, b in zip(bf16, fp32, strict=True)) >= 2


def test_slots_are_freed_whatever_ends_a_request(loaded) -> None:
    """Requests ending at their first token (max_tokens=1), at a stop sequence or normally,
    three times more than there are slots: every one gets a slot and finishes."""
    prompts = [encode(loaded, t) for t in PROMPTS] * 4
    requests = [greedy(f"r{i}", p, 1 + (i % 3) * 5) for i, p in enumerate(prompts)]
    texts, engine = generate_all(loaded, engine_config(max_batch_size=2), requests)
    assert len(texts) == len(requests)
    assert engine.stats().requests_finished == len(requests)
