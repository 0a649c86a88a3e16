"""int4 and int8 against fp32 on the real model: same greedy tokens? same FIM quality?

    python -m bench.int4_faithfulness --threads 1 --cases 16 [--weights int4,int8]

FIM cases cut one line out of files of Python's standard library (code the model's authors
did not write for this test), keep up to 40 lines either side, and ask for the middle. Each case
is read once on dense weights, its KV copied to a second slot, and then decoded greedily on fp32
and on each quantized weight type; with ``--prompts decode`` each quantized type also reads the
prompt itself (``prompt_weights: decode``: position 0 dense, the rest on its own weights), as
the service does on AVX2, and decodes from there. Printed per type: the share of cases whose
tokens are identical to fp32's, where the first divergences fall, and the share of cases whose
first generated line is exactly the removed line. The edit example (``EXAMPLE_EDIT_CONTENT``)
is one more case (tokens only). With ``--batch N`` the cases are also decoded N at a time in one
batch (as concurrent requests are), fp32 and each type alike, and compared with fp32 alone: a
quantized path whose rows depend on each other shows it here.
"""

from __future__ import annotations

import argparse
import random
import sysconfig
from pathlib import Path

import torch

from serve_app.models.loader import load_model
from serve_app.prompts.edit import fit_to_context, parse_edit_prompt
from serve_app.prompts.fim import build_fim_prompt, fim_format_for
from serve_app.runner.builder import build_runner
from serve_app.runner.smoothing import calibration_ids
from tests.fixtures.edit import EXAMPLE_EDIT_CONTENT

STDLIB_FILES = ["textwrap.py", "shlex.py", "fnmatch.py", "glob.py", "bisect.py", "heapq.py"]


def fim_cases(count: int, seed: int = 0) -> list[tuple[str, str, str]]:
    """(prefix, suffix, removed line) triples from the standard library, seeded."""
    rng = random.Random(seed)
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [(root / name).read_text().splitlines(keepends=True) for name in STDLIB_FILES]
    cases = []
    while len(cases) < count:
        lines = rng.choice(files)
        i = rng.randrange(40, len(lines) - 40)
        if len(lines[i].strip()) < 12 or lines[i].lstrip().startswith("#"):
            continue
        cases.append(("".join(lines[i - 40 : i]), "".join(lines[i + 1 : i + 41]), lines[i]))
    return cases


def greedy_batch(runner, cache, slot0: int, firsts: list[int], starts: list[int], n: int):
    """``n`` greedy tokens per row, the first given (row b in slot ``slot0 + b``, its next
    token at position ``starts[b]``), all rows decoded together."""
    outs, tokens = [[t] for t in firsts], list(firsts)
    for step in range(n - 1):
        rows = [[t] for t in tokens]
        logits = runner.forward(cache, slot0, rows, [s + step for s in starts], decode=True)
        tokens = [int(t) for t in logits.argmax(-1)]
        for out, token in zip(outs, tokens, strict=True):
            out.append(token)
    return outs


def batched_identical(runners: dict, cache, prompts: list, alone: list[list[int]], args) -> dict:
    """Per runner, how many of ``prompts`` decoded ``args.batch`` at a time give the tokens
    that fp32 gives alone (``alone``)."""
    same = dict.fromkeys(runners, 0)
    b = args.batch
    for group in range(0, len(prompts), b):
        ids = [p for p, _ in prompts[group : group + b]]
        firsts = []
        for j, prompt in enumerate(ids):
            firsts.append(
                int(runners["fp32"].forward(cache, j, [prompt], [0], decode=False)[0].argmax())
            )
        starts = [len(p) for p in ids]
        for name, runner in runners.items():
            for j, prompt in enumerate(ids):
                cache.move(j, b + j, len(prompt))
            outs = greedy_batch(runner, cache, b, firsts, starts, args.tokens)
            same[name] += sum(o == a for o, a in zip(outs, alone[group : group + b], strict=True))
        print(".", end="", flush=True)
    print()
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="embedded:qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cases", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--weights", default="int4", help="comma-separated: int4, int8")
    parser.add_argument("--batch", type=int, default=0, help="also decode N cases per batch")
    parser.add_argument(
        "--prompts",
        choices=("dense", "decode"),
        default="dense",
        help="decode: each quantized type also reads the prompts on its own weights",
    )
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    loaded = load_model(args.source, threads=args.threads)
    tok = loaded.tokenizer
    dense = build_runner(loaded.model, weights="dense")
    # as the service builds them: int8 smoothed by the calibration text
    options = {"cache_dir": loaded.location, "calibration": calibration_ids(tok)}
    quantized = {
        name: build_runner(loaded.model, weights=name, **options)
        for name in args.weights.split(",")
    }
    if args.prompts == "decode":
        quantized |= {
            f"{name}+prompt": build_runner(
                loaded.model, weights=name, prompt_weights="decode", **options
            )
            for name in args.weights.split(",")
        }
    cache = dense.new_cache(max(2, 2 * args.batch), 1024, loaded.max_position_embeddings)
    fmt = fim_format_for(tok, loaded.model_type)
    prompts = [(build_fim_prompt(fmt, tok, p, s), line) for p, s, line in fim_cases(args.cases)]
    _, edit_ids = fit_to_context(parse_edit_prompt(EXAMPLE_EDIT_CONTENT), tok, 30000)
    prompts.append((edit_ids, None))
    same = dict.fromkeys(quantized, 0)
    divergences: dict[str, list[int]] = {name: [] for name in quantized}
    exact = dict.fromkeys(["fp32", *quantized], 0)
    alone: list[list[int]] = []
    for ids, line in prompts:
        first = int(dense.forward(cache, 0, [ids], [0], decode=False)[0].argmax())
        outs = {}
        for name, runner in [("fp32", dense), *quantized.items()]:
            if runner.quantized_prompts:  # reads the prompt itself, in slot 1
                own = int(runner.forward(cache, 1, [ids], [0], decode=False)[0].argmax())
                outs[name] = greedy_batch(runner, cache, 1, [own], [len(ids)], args.tokens)[0]
                continue
            cache.move(0, 1, len(ids))  # slot 0 keeps the prompt; each decodes in slot 1
            outs[name] = greedy_batch(runner, cache, 1, [first], [len(ids)], args.tokens)[0]
        alone.append(outs["fp32"])
        for name in quantized:
            if outs[name] == outs["fp32"]:
                same[name] += 1
            else:
                pairs = zip(outs[name], outs["fp32"], strict=True)
                divergences[name].append(next(i for i, (a, b) in enumerate(pairs) if a != b))
        if line is not None:
            for name, out in outs.items():
                exact[name] += tok.decode(out).split("\n")[0].strip() == line.strip()
        print(".", end="", flush=True)
    print()
    n_fim = len(prompts) - 1
    print(f"model {args.source}, {args.tokens} greedy tokens per case, {args.threads} thread(s)")
    for name in quantized:
        share = same[name] / len(prompts)
        print(f"identical {name}/fp32 outputs: {same[name]}/{len(prompts)} ({share:.0%})")
        print(f"  first divergence at token: {sorted(divergences[name])}")
    lines = ", ".join(f"{name} {count}/{n_fim}" for name, count in exact.items())
    print(f"FIM exact first line: {lines}")
    if args.batch:
        decoders = {k: r for k, r in quantized.items() if not r.quantized_prompts}
        same_batched = batched_identical({"fp32": dense, **decoders}, cache, prompts, alone, args)
        for name, count in same_batched.items():
            print(
                f"decoded {args.batch} per batch, identical to fp32 alone: {name} "
                f"{count}/{len(prompts)}"
            )


if __name__ == "__main__":
    main()
