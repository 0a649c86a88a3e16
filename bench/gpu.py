"""The engine's runner on a GPU: decode and prompt speed at Qwen2.5-Coder's shapes, one command.

    python -m bench.gpu                              # 0.5B, 1.5B and 7B on the first CUDA GPU
    python -m bench.gpu --models 0.5b --tokens 256
    python -m bench.gpu --graphs on                  # without the eager comparison
    python -m bench.gpu --smoke                      # a tiny config on CPU in seconds (tests)
    python -m bench.gpu --peer transformers          # + transformers' generate, same weights

``--smoke`` also reads 256- and 1,024-token prompts instead of 1k and 8k.

No download: each model is transformers' ``Qwen2Config`` with the published sizes of
Qwen2.5-Coder 0.5B/1.5B/7B, built directly on the device in bf16 with random weights (timing
does not depend on the values; the text is noise). A word-level tokenizer with one word per id
stands in for Qwen's (the engine only detokenizes): every token streams as its own chunk, so
chunk times are token times.

Everything runs through ``LLMEngine`` with prod.yaml's engine block (``runner: auto``, which on
CUDA is the runner on the model's dense bf16 weights; ``prefill_chunk_tokens`` 1024), the
prefix cache and speculation off, eos ignored. Per model:

- single stream: one request's decode tok/s (its tokens after the first over their time);
- 8 and 64 streams: that many requests at once (short prompts), completion tokens over the
  wall time from the first submit to the last token;
- TTFT: a 1k- and an 8k-token prompt alone (``max_tokens`` 1), after one warm-up of the same
  length; one slot, so the KV cache holds one 8k row, not 64.

Each figure is also printed as a share of its physical limit (``bench.gpu_limits``: the card's
copy bandwidth and bf16 matrix rate, measured at the start of the run): decode against the
bytes a step must read (every weight, each row's fp32 KV at its mean context), a first token
against the FLOPs of reading the prompt, and how much faster than the prompt its time grows
from the shortest to the longest. Then one layer's prompt attention, the last 1k chunk of an
8k prompt, timed the way the runner does it (``causal_prompt_attention``: bf16, per row,
lower-right causal, torch's flash kernel on a GPU) against one fp32 call with the padded mask
(what prompt chunks did before; decode steps still do), in the same run.

Decode runs twice per model by default (``--graphs on,off``): with CUDA graphs (``cuda_graphs``,
prod's default) and eagerly, in the same run, with the ratio, and how many of the single
stream's greedy tokens the two agree on before they first differ (a graph's attention reads
the cache's whole allocation, so its last bits may differ from the eager step's). TTFT is
measured once: prompts are read eagerly either way.

``--peer transformers`` also times transformers' ``generate`` on the same random model in the
same process (``bench.gpu_peer``) and prints each engine figure beside it: the ratio (above 1:
the engine is faster) and the engine's share of its limit.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import gc
import platform
import random
import time
from typing import Any

import torch
import torch.nn.functional as F

from bench.common import table
from bench.gpu_limits import Card, ModelCost, mean_seconds, measure_card, model_cost
from bench.gpu_peer import PeerFigures, measure_transformers, ratio_rows
from serve_app.engine.engine import LLMEngine
from serve_app.engine.protocol import GenerationRequest, SamplingParams
from serve_app.engine_config import NO_SPECULATION, EngineConfig
from serve_app.models.loader import LoadedModel, pick_device
from serve_app.models.tiny import TINY_SHAPE
from serve_app.runner.attention import causal_prompt_attention

# Published config.json values of Qwen/Qwen2.5-Coder-{0.5B,1.5B,7B}(-Instruct).
SHAPES: dict[str, dict[str, Any]] = {
    "0.5b": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "1.5b": dict(
        hidden_size=1536,
        intermediate_size=8960,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "7b": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
    # --smoke: the tiny test model's size.
    "tiny": dict(TINY_SHAPE, vocab_size=1024),
}
COMMON = dict(max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6)
STREAM_PROMPT_TOKENS = 128
# The runner's KV cache holds fp32 keys and values on every device (``Qwen2Runner.new_cache``).
KV_DTYPE = torch.float32


@dataclasses.dataclass
class Figures:
    single_tps: float
    streams_tps: dict[int, float]
    ttft_s: dict[int, float]
    single_text: str  # the single stream's greedy words (``stand_in_tokenizer``)
    cost: ModelCost | None = None


def random_model(shape: str, device: str, dtype: torch.dtype) -> Any:
    """Qwen2ForCausalLM of ``shape``'s sizes, allocated and randomly initialised on ``device``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**SHAPES[shape], **COMMON)
    torch.manual_seed(0)
    with torch.device(device):  # parameters are made and initialised there: no host copy
        model = Qwen2ForCausalLM._from_config(config, dtype=dtype)
    return model.eval()


def loaded_model(shape: str, device: str, dtype: torch.dtype) -> LoadedModel:
    model = random_model(shape, device, dtype)
    tokenizer = stand_in_tokenizer(int(model.config.vocab_size))
    name = str(dtype).removeprefix("torch.")
    return LoadedModel(model, tokenizer, f"random:{shape}", device, name, eos_token_ids=[])


def stand_in_tokenizer(vocab_size: int) -> Any:
    """Words ``w0``, ``w1``, ... one per id (~2 s for Qwen's 152k): every id decodes to text,
    and the words are in the byte-level alphabet, so the engine's token table builds fast."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    words = models.WordLevel({f"w{i}": i for i in range(vocab_size)}, unk_token="w0")
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer(words))


def prompt(length: int, vocab: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(length)]


async def run_one(engine: LLMEngine, rid: str, ids: list[int], max_tokens: int) -> tuple:
    """(completion tokens, submit time, first token's time, last token's time, text)."""
    request = GenerationRequest(rid, ids, SamplingParams(max_tokens=max_tokens), "bench")
    start = time.perf_counter()
    first = last = 0.0
    tokens = 0
    text = []
    async for chunk in engine.generate(request):
        last = time.perf_counter()
        if not tokens and chunk.completion_tokens:
            first = last
        tokens = chunk.completion_tokens
        text.append(chunk.text)
    return tokens, start, first, last, "".join(text)


async def streams(engine: LLMEngine, n: int, vocab: int, max_tokens: int) -> float:
    """Aggregate completion tok/s of ``n`` concurrent requests."""
    jobs = [
        run_one(engine, f"s{n}-{i}", prompt(STREAM_PROMPT_TOKENS, vocab, i), max_tokens)
        for i in range(n)
    ]
    start = time.perf_counter()
    results = await asyncio.gather(*jobs)
    return sum(r[0] for r in results) / (max(r[3] for r in results) - start)


async def decode_figures(
    engine: LLMEngine, vocab: int, max_tokens: int, stream_counts: list[int]
) -> tuple[float, dict[int, float], str]:
    await run_one(engine, "warm", prompt(STREAM_PROMPT_TOKENS, vocab, 99), 8)
    tokens, _, first, last, text = await run_one(
        engine, "single", prompt(STREAM_PROMPT_TOKENS, vocab, 0), max_tokens
    )
    single = (tokens - 1) / (last - first)
    many = {}
    for n in stream_counts:
        await streams(engine, n, vocab, 4)  # warm: this batch size's shapes and KV growth
        many[n] = await streams(engine, n, vocab, max_tokens)
    return single, many, text


async def ttft_figures(engine: LLMEngine, vocab: int, lengths: list[int]) -> dict[int, float]:
    out = {}
    for length in lengths:
        await run_one(engine, f"warm{length}", prompt(length, vocab, 7), 1)
        _, start, first, *_ = await run_one(engine, f"ttft{length}", prompt(length, vocab, 8), 1)
        out[length] = first - start
    return out


def engine_for(loaded: LoadedModel, max_batch: int, context: int, graphs: bool = True) -> LLMEngine:
    """prod.yaml's engine block, the prefix cache and speculation off (every prompt is read);
    ``graphs``: its ``cuda_graphs``."""
    config = EngineConfig(
        cuda_graphs=graphs,
        max_batch_size=max_batch,
        prefill_chunk_tokens=1024,
        prefix_cache_mb=0,
        max_waiting=256,
        speculation=NO_SPECULATION,
    )
    return LLMEngine(loaded, config, context_length=context)


def measure(loaded: LoadedModel, args: argparse.Namespace, graphs: bool, ttft: bool) -> Figures:
    vocab = int(loaded.model.config.vocab_size)
    counts = [int(n) for n in args.streams.split(",")]
    lengths = [int(n) for n in args.prompts.split(",")]
    context = max(lengths + [STREAM_PROMPT_TOKENS]) + args.tokens + 8
    engine = engine_for(loaded, max(counts), context, graphs)
    try:
        backend = engine.stats().backend
        if backend != "RunnerBackend":
            raise SystemExit(f"{loaded.source}: the engine chose {backend}, not the runner")
        single, many, text = asyncio.run(decode_figures(engine, vocab, args.tokens, counts))
    finally:
        engine.shutdown()
    if not ttft:
        return Figures(single, many, {}, text, model_cost(loaded.model, KV_DTYPE))
    engine = engine_for(loaded, 1, context)
    try:
        first = asyncio.run(ttft_figures(engine, vocab, lengths))
    finally:
        engine.shutdown()
    return Figures(single, many, first, text, model_cost(loaded.model, KV_DTYPE))


def agreement(a: str, b: str) -> str:
    """How many leading words two greedy texts share, of how many."""
    left, right = a.split(), b.split()
    same = next(
        (i for i, (x, y) in enumerate(zip(left, right, strict=False)) if x != y),
        min(len(left), len(right)),
    )
    return f"{same}/{max(len(left), len(right))}"


def device_name(device: str) -> str:
    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(torch.device(device))} (torch {torch.__version__})"
    return f"CPU {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def report(results: dict[str, Figures], args: argparse.Namespace, device: str, card: Card) -> None:
    print(f"device: {device_name(device)}")
    print(f"decode: {args.tokens} tokens per request, {STREAM_PROMPT_TOKENS}-token prompts")
    counts = [int(n) for n in args.streams.split(",")]
    lengths = [int(n) for n in args.prompts.split(",")]
    head = ["model", "single tok/s"] + [f"{n}-stream tok/s" for n in counts]
    head += [f"TTFT {n} s" for n in lengths]
    rows = [head]
    for name, f in results.items():
        row = [name, f"{f.single_tps:.1f}"] + [f"{f.streams_tps[n]:.1f}" for n in counts]
        rows.append(row + [f"{f.ttft_s[n]:.4g}" if n in f.ttft_s else "-" for n in lengths])
    print(table(rows))
    ratios = [["model", "graphs / eager, single"] + [f"{n} streams" for n in counts]]
    ratios[0].append("same greedy tokens")
    for name in dict.fromkeys(key.rsplit(" ", 1)[0] for key in results):
        on, off = results.get(f"{name} graphs"), results.get(f"{name} eager")
        if on is None or off is None:
            continue
        row = [name, f"{on.single_tps / off.single_tps:.2f}x"]
        row += [f"{on.streams_tps[n] / off.streams_tps[n]:.2f}x" for n in counts]
        ratios.append(row + [agreement(on.single_text, off.single_text)])
    if len(ratios) > 1:
        print(table(ratios))
    print(limit_shares(results, card, args))


def limit_shares(results: dict[str, Figures], card: Card, args: argparse.Namespace) -> str:
    """Each figure over its physical limit (``bench.gpu_limits``), and TTFT's growth from the
    shortest prompt to the longest over the prompt's."""
    counts = [1] + [int(n) for n in args.streams.split(",")]
    lengths = [int(n) for n in args.prompts.split(",")]
    context = STREAM_PROMPT_TOKENS + args.tokens // 2  # a stream's mean context while decoding
    head = ["model", "share of limit: single"] + [f"{n} streams" for n in counts[1:]]
    head += [f"TTFT {n}" for n in lengths] + [f"TTFT growth {lengths[0]}->{lengths[-1]}"]
    rows = [head]
    for name, f in results.items():
        if f.cost is None:
            continue
        measured = [f.single_tps] + [f.streams_tps[n] for n in counts[1:]]
        row = [name] + [
            f"{tps / f.cost.decode_tps(card, n, context):.0%}"
            for n, tps in zip(counts, measured, strict=True)
        ]
        row += [
            f"{f.cost.prompt_seconds(card, n) / f.ttft_s[n]:.0%}" if n in f.ttft_s else "-"
            for n in lengths
        ]
        if lengths[0] in f.ttft_s and lengths[-1] in f.ttft_s:
            growth = f.ttft_s[lengths[-1]] / f.ttft_s[lengths[0]] / (lengths[-1] / lengths[0])
            row.append(f"{growth:.2f}x the prompt's")
        else:
            row.append("-")
        rows.append(row)
    limits = [
        ["model", "weights GB", "KV KB/position"] + [f"limit {n}-stream tok/s" for n in counts]
    ]
    limits[0] += [f"floor TTFT {n} s" for n in lengths]
    for name, f in results.items():
        if (
            f.cost is None
            or not name.endswith("graphs")
            and f"{name.rsplit(' ', 1)[0]} graphs" in results
        ):
            continue
        c = f.cost
        row = [
            name.rsplit(" ", 1)[0],
            f"{c.weight_bytes / 1e9:.2f}",
            f"{c.kv_bytes_per_column / 1e3:.0f}",
        ]
        row += [f"{c.decode_tps(card, n, context):,.0f}" for n in counts]
        limits.append(row + [f"{c.prompt_seconds(card, n):.4f}" for n in lengths])
    return "\n".join(
        [
            f"card: copy {card.copy_bytes_per_s / 1e12:.2f} TB/s (read + written), matrix "
            f"{card.matmul_flops_per_s / 1e12:.3g} TFLOP/s; decode at a mean context of "
            f"{context} positions, KV {str(KV_DTYPE).removeprefix('torch.')}",
            table(limits),
            table(rows),
        ]
    )


def prompt_attention_figures(names: list[str], device: str, dtype: torch.dtype) -> str:
    """One layer's attention for the last ``chunk`` of a ``width``-token prompt, per model:
    the runner's ``causal_prompt_attention`` against one fp32 call with the padded mask."""
    chunk, width = (1024, 8192) if device.startswith("cuda") else (64, 256)
    rows = [
        ["model", f"masked fp32 ms ({chunk} over {width})", "causal_prompt_attention ms", "ratio"]
        + ["flash kernel usable"]
    ]
    for name in names:
        shape = SHAPES[name]
        heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
        dim = shape["hidden_size"] // heads
        torch.manual_seed(0)
        q = torch.randn(1, heads, chunk, dim, device=device)
        keys = torch.randn(1, kv_heads, width, dim, device=device)
        values = torch.randn(1, kv_heads, width, dim, device=device)
        start = width - chunk
        at = torch.arange(start, width, device=device).view(1, 1, chunk, 1)
        mask = torch.arange(width, device=device).view(1, 1, 1, width) <= at

        masked = functools.partial(
            F.scaled_dot_product_attention, q, keys, values, attn_mask=mask, enable_gqa=True
        )
        causal = functools.partial(
            causal_prompt_attention, q, keys, values, [(start, chunk)], dtype
        )
        gap = float((masked() - causal()).abs().max())
        before, after = (mean_seconds(work, device, 20) * 1e3 for work in (masked, causal))
        rows.append(
            [name, f"{before:.3f}", f"{after:.3f} (max diff {gap:.3g})", f"{before / after:.1f}x"]
            + [flash_usable(q[:, :, -chunk:].to(dtype), keys.to(dtype), values.to(dtype))]
        )
    return table(rows)


def flash_usable(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> str:
    """Whether torch's flash kernel takes these inputs (no mask, grouped heads), as
    ``causal_lower_right``'s dispatch asks it; "-" off CUDA, where it never does."""
    if q.device.type != "cuda":
        return "-"
    from torch.backends.cuda import SDPAParams, can_use_flash_attention

    params = SDPAParams(q, keys, values, None, 0.0, False, True)
    return "yes" if can_use_flash_attention(params, True) else "no (see the warning above)"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="0.5b,1.5b,7b", help=f"of {sorted(SHAPES)}")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--tokens", type=int, default=128, help="decode tokens per request")
    parser.add_argument("--streams", default="8,64", help="concurrent request counts")
    parser.add_argument("--prompts", default="1024,8192", help="TTFT prompt lengths")
    parser.add_argument("--graphs", default="on,off", help="decode with CUDA graphs on, off")
    parser.add_argument("--smoke", action="store_true", help="the tiny config on CPU, seconds")
    parser.add_argument("--peer", default="none", choices=["none", "transformers"])
    args = parser.parse_args(argv)
    if args.smoke:  # every figure, every code path, in seconds
        args.models, args.device, args.tokens, args.prompts = "tiny", "cpu", 8, "256,1024"
    device = pick_device(args.device)  # DeviceError where CUDA is asked for and missing
    dtype = getattr(torch, args.dtype)
    card = measure_card(device)
    names = args.models.split(",")
    print(prompt_attention_figures(names, device, dtype), flush=True)
    results = {}
    peers: dict[str, PeerFigures] = {}
    for name in names:
        started = time.perf_counter()
        loaded = loaded_model(name, device, dtype)
        print(f"{name}: built on {device} in {time.perf_counter() - started:.1f}s", flush=True)
        modes = args.graphs.split(",")
        for mode in modes:
            label = f"{name} {'graphs' if mode == 'on' else 'eager'}"
            results[label] = measure(loaded, args, mode == "on", ttft=mode == modes[0])
        if args.peer == "transformers":
            counts = [int(n) for n in args.streams.split(",")]
            lengths = [int(n) for n in args.prompts.split(",")]
            peers[name] = measure_transformers(loaded.model, args.tokens, counts, lengths, device)
        del loaded
        gc.collect()
        if device.startswith("cuda"):
            torch.cuda.empty_cache()
    report(results, args, device, card)
    if peers:
        print(peer_table(results, peers, card, args))


def peer_table(
    results: dict[str, Figures], peers: dict[str, PeerFigures], card: Card, args: argparse.Namespace
) -> str:
    """Each engine figure (the first decode mode's, which also read the TTFT prompts) beside
    transformers': the ratio, above 1 where the engine is faster, and its share of the limit."""
    context = STREAM_PROMPT_TOKENS + args.tokens // 2
    first_mode = "graphs" if args.graphs.split(",")[0] == "on" else "eager"
    rows = [["figure", "this engine", "transformers", "engine / transformers", "share of limit"]]
    for name, peer in peers.items():
        figures = results[f"{name} {first_mode}"]

        def share(kind: str, n: int, value: float, cost: ModelCost | None = figures.cost) -> str:
            if cost is None:
                return "-"
            if kind == "decode":
                return f"{value / cost.decode_tps(card, n, context):.0%}"
            return f"{cost.prompt_seconds(card, n) / value:.0%}"

        rows += ratio_rows(figures, peer, name, share)
    return table(rows)


if __name__ == "__main__":
    main()
