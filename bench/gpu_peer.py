"""transformers' own ``generate`` on bench.gpu's random model, in the same process: the peer
every engine figure is printed against (``python -m bench.gpu --peer transformers``).

On the same weights, greedy, eos never ending a row (``min_new_tokens``):

- one stream: a 128-token prompt's decode tok/s after its first token, with the static cache
  (which ``generate`` compiles on CUDA; not on CPU, where inductor would take minutes), and
  eagerly with the dynamic cache;
- a static batch of N rows (each of bench.gpu's stream counts): N 128-token prompts in one
  ``generate``, completion tok/s after the first token, the way a plain batch runs;
- TTFT: each of bench.gpu's prompt lengths, ``max_new_tokens=1``, after one warm-up.

Decode rates are the tokens after the first over their time, as bench.gpu times the engine's,
noted by a streamer as each step's tokens come out; each the better of two runs.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

PROMPT_TOKENS = 128


@dataclasses.dataclass
class PeerFigures:
    single_tps: dict[str, float]  # "static" / "eager" -> tok/s
    batch_tps: dict[int, float]  # rows -> tok/s
    ttft_s: dict[int, float]


class _Clock:
    """A ``generate`` streamer that only notes when each put arrives: first the prompt, then
    each step's tokens (generate moves them to the host, so the step has run)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: Any) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def _generate(model: Any, ids: torch.Tensor, new: int, cache: str | None) -> list[float]:
    """When the prompt went in and each of ``new`` greedy tokens came out."""
    kwargs: dict[str, Any] = dict(
        max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0
    )
    if cache is not None:
        kwargs["cache_implementation"] = cache
    clock = _Clock()
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate(ids, attention_mask=torch.ones_like(ids), streamer=clock, **kwargs)
    return [start, *clock.times[1:]]


def _decode_tps(model: Any, ids: torch.Tensor, new: int, cache: str | None) -> float:
    """Tokens after the first over their time, the better of two runs."""
    best = 0.0
    for _ in range(2):
        times = _generate(model, ids, new, cache)
        best = max(best, ids.shape[0] * (new - 1) / (times[-1] - times[1]))
    return best


def _prompts(rows: int, length: int, vocab: int, device: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(rows * 100_003 + length)
    return torch.randint(0, vocab, (rows, length), generator=generator).to(device)


def measure_transformers(
    model: Any, tokens: int, rows: list[int], lengths: list[int], device: str
) -> PeerFigures:
    vocab = int(model.config.vocab_size)
    one = _prompts(1, PROMPT_TOKENS, vocab, device)
    single = {
        "static": _decode_tps(model, one, tokens, "static"),
        "eager": _decode_tps(model, one, tokens, None),
    }
    batch = {n: _decode_tps(model, _prompts(n, PROMPT_TOKENS, vocab, device), tokens, "static")
             for n in rows}  # fmt: skip
    ttft = {}
    for length in lengths:
        ids = _prompts(1, length, vocab, device)
        _generate(model, ids, 1, None)  # warm-up at this length
        times = [_generate(model, ids, 1, None) for _ in range(2)]
        ttft[length] = min(t[1] - t[0] for t in times)
    return PeerFigures(single, batch, ttft)


def ratio_rows(engine: Any, peer: PeerFigures, name: str, share: Any) -> list[list[str]]:
    """One model's figures: the engine's, transformers', the ratio, and the engine's share of
    its limit (``share(kind, n, value)``: a percentage string or "-")."""
    rows = []
    static, eager = peer.single_tps["static"], peer.single_tps["eager"]
    mine = engine.single_tps
    rows.append([
        f"{name} one stream tok/s", f"{mine:.1f}", f"{static:.1f} static, {eager:.1f} eager",
        f"{mine / max(static, eager):.2f}x the faster", share("decode", 1, mine),
    ])  # fmt: skip
    for n, tps in peer.batch_tps.items():
        if n in engine.streams_tps:
            mine = engine.streams_tps[n]
            rows.append([
                f"{name} {n} streams tok/s", f"{mine:.1f}", f"{tps:.1f} (one batch of {n})",
                f"{mine / tps:.2f}x", share("decode", n, mine),
            ])  # fmt: skip
    for length, seconds in peer.ttft_s.items():
        if length in engine.ttft_s:
            mine = engine.ttft_s[length]  # seconds: the faster is the smaller
            rows.append([
                f"{name} TTFT {length}", f"{mine:.4f} s", f"{seconds:.4f} s",
                f"{seconds / mine:.2f}x", share("ttft", length, mine),
            ])  # fmt: skip
    return rows
