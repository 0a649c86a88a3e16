"""The project's JSON-schema automaton against maintained grammar libraries (issue 47, item 2).

    python -m bench.grammar_library [--repeats 5] [--timeout 20] [--engines automaton,...]

In one run, with the embedded model's tokenizer (Qwen2.5-Coder, 151,936 ids), for each engine
installed (``bench.grammar_engines``):

- compile time per schema (``bench.grammar_cases.CASES``; the median of ``--repeats``), in a
  worker process so a compile that never ends is killed instead of hanging the run;
- the per-token cost of the next-token mask while walking a valid answer token by token
  (p50/p99 in microseconds), and whether every token of the answer, then the end token, was
  let through. The automaton is timed as the engine calls it (``allowed_ids``: the top-64
  candidates by logit, checked on validator copies), with the answer's token given the best
  logit (the model agrees with the grammar) and with random logits (it does not: the
  vocabulary scan), and once over the whole vocabulary, which is what a library's mask is;
- hostile schemas: compile, then one mask where an answer reaches the hostile part, under
  ``--timeout`` and a memory cap;
- the features the project refuses with a 400 or leaves to the post-check, as each engine
  answers them; and whether each engine's masks pass the documents today's JSON tests expect
  to pass, and stop those they expect to fail.

The CPU is printed first (the libraries' mask kernels use AVX2/AVX-512 where present), and
the load average: figures taken beside another job are slower, the ratios less so.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import statistics
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch

from bench.common import cpu_flags
from bench.grammar_cases import CASES, FEATURES, HOSTILE, SEMANTICS, TEST_SCHEMA, Schema
from bench.grammar_engines import LIBRARIES, Engine, load_tokenizer, make_engine

SEED = 0


def default_tokenizer() -> str:
    from serve_app.models.embedded.registry import default_cache_dir

    return str(default_cache_dir() / "qwen2.5-coder-0.5b")


# ---------------------------------------------------------------------- compile in a worker


def _worker(
    name: str, tokenizer_path: str, threads: int, memory_gib: float, conn: Connection
) -> None:
    """Serve compile requests for engine ``name`` until the pipe closes."""
    torch.set_num_threads(1)  # as a replica decodes (configs/local.yaml: torch_threads 1)
    tokenizer, texts, eos = load_tokenizer(tokenizer_path)
    engine = make_engine(name, tokenizer, texts, eos, threads)
    engine.compile({"type": "object", "properties": {"a": {"type": "integer"}}})  # imports, caches
    # Cap the address space above what loading took: a compile that blows up dies here
    # instead of taking the machine's memory from the job beside it.
    size = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = size + int(memory_gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    logits = torch.randn(len(texts), generator=torch.Generator().manual_seed(SEED))
    conn.send("ready")
    while True:
        try:
            schema, repeats, prefix = conn.recv()
        except EOFError:
            return
        times: list[float] = []
        try:
            for _ in range(repeats):
                start = time.perf_counter()
                compiled = engine.compile(schema)
                times.append((time.perf_counter() - start) * 1e3)
                if sum(times) > 2000:  # repeats steady the fast compiles; a slow one is slow
                    break
            walker = engine.walker(compiled)
            for position, token in enumerate(tokenizer.encode(prefix)):
                if not walker.advance(token):
                    raise ValueError(f"answer prefix {prefix!r} refused at its token {position}")
            start = time.perf_counter()
            walker.mask(logits)
            mask_ms = (time.perf_counter() - start) * 1e3
            conn.send({"status": "ok", "ms": times, "mask_ms": mask_ms})
        except MemoryError:
            conn.send({"status": "memory", "ms": times, "message": "MemoryError"})
        except Exception as e:  # the engine refused the schema: its message is the point
            message = " ".join(f"{type(e).__name__}: {e}".split())
            conn.send({"status": "refused", "ms": times, "message": message})


@dataclass
class Worker:
    """A process compiling for one engine; killed and restarted after a timeout."""

    name: str
    args: argparse.Namespace
    process: Any = None
    conn: Connection | None = None

    def ask(self, schema: Schema, repeats: int, prefix: str = "") -> dict[str, Any]:
        if self.process is None or not self.process.is_alive():
            self._start()
        assert self.conn is not None
        started = time.perf_counter()
        self.conn.send((schema, repeats, prefix))
        if not self.conn.poll(self.args.timeout + 2):
            self.stop()
            return {"status": "timeout", "ms": [], "message": f"no answer in {self.args.timeout} s"}
        try:
            return self.conn.recv()
        except EOFError:  # died: the memory cap (Rust aborts on a failed allocation) or a crash
            elapsed = (time.perf_counter() - started) * 1e3
            self.stop()
            return {"status": "died", "ms": [elapsed], "message": "worker died (memory cap?)"}

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")  # no fork of threaded Rust/C++ runtimes
        self.conn, theirs = context.Pipe()
        args = (self.name, self.args.tokenizer, self.args.threads, self.args.memory_gib, theirs)
        self.process = context.Process(target=_worker, args=args, daemon=True)
        self.process.start()
        if not self.conn.poll(300) or self.conn.recv() != "ready":
            raise RuntimeError(f"the {self.name} worker did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.join()
        self.process = self.conn = None


# ----------------------------------------------------------------------------- token walks


@dataclass
class Walk:
    steps_ns: list[int] = field(default_factory=list)
    refused_at: str | None = None  # the first token of the answer the mask did not allow


def walk(
    engine: Engine, compiled: Any, ids: list[int], eos: int, base: torch.Tensor, boost: bool
) -> Walk:
    """Mask, check, advance for every token of ``ids`` then the end token; masks timed."""
    walker = engine.walker(compiled)
    result = Walk()
    for position, token in enumerate([*ids, eos]):
        logits = base
        if boost:
            logits = base.clone()
            logits[token] = 10.0  # above any N(0, 1) draw: the model's choice is this token
        start = time.perf_counter_ns()
        walker.mask(logits)
        result.steps_ns.append(time.perf_counter_ns() - start)
        if result.refused_at is None and boost and not walker.allows(token):
            result.refused_at = f"token {position} of {len(ids)}"
        if token != eos:
            walker.advance(token)
    return result


def accepts(engine: Engine, compiled: Any, data: bytes, tok: dict[str, Any]) -> bool:
    """Whether the engine's masks let ``data`` through, then the end token: as the tokenizer
    spells it, or one single-byte token at a time where it is not UTF-8. (Not byte by byte
    always: llguidance's masks drop non-canonical splits of text the grammar forces, so
    after ``{"`` of a one-key object only the token ``name`` is allowed, not ``n``.)"""
    walker = engine.walker(compiled)
    eos = tok["eos"][0]
    try:
        ids = tok["tokenizer"].encode(data.decode())
    except UnicodeDecodeError:
        ids = [tok["texts"].byte_token_ids[b] for b in data]
    for token in [*ids, eos]:
        logits = torch.zeros(len(tok["texts"]))
        logits[token] = 1.0
        walker.mask(logits)
        if not walker.allows(token):
            return False
        if token != eos:
            walker.advance(token)
    return True


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# ------------------------------------------------------------------------------- sections


def measure_cases(
    engines: dict[str, Engine], workers: dict[str, Worker], tok: Any, args: argparse.Namespace
) -> None:
    import json

    eos = tok["eos"][0]
    base = torch.randn(len(tok["texts"]), generator=torch.Generator().manual_seed(SEED))
    print("\n## Compile and per-token mask (tokens: the answer's, plus the end token)")
    print(f"{'schema':22} {'engine':22} {'tok':>4} {'compile ms':>10} {'x aut':>6} "
          f"{'mask p50 us':>11} {'p99 us':>8} {'x aut':>6}  answer let through")  # fmt: skip
    for case in CASES:
        text = json.dumps(case.instance, ensure_ascii=False)
        ids = tok["tokenizer"].encode(text)
        assert b"".join(tok["texts"].token_bytes[i] for i in ids) == text.encode()
        ref: dict[str, float] = {}
        for name, engine in engines.items():
            answer = workers[name].ask(case.schema, args.repeats)
            if answer["status"] != "ok":
                print(f"{case.name:22} {name:22} {answer['status']}: {answer['message'][:70]}")
                continue
            compile_ms = statistics.median(answer["ms"])
            compiled = engine.compile(case.schema)
            modes = [("", True)] + ([(" (random logits)", False)] if name == "automaton" else [])
            for suffix, boost in modes:
                # Random logits make the automaton scan the vocabulary (~60 ms a token): once.
                repeats = args.repeats if boost else 1
                walks = [walk(engine, compiled, ids, eos, base, boost) for _ in range(repeats)]
                steps = [ns / 1e3 for w in walks for ns in w.steps_ns]
                p50, p99 = percentile(steps, 0.5), percentile(steps, 0.99)
                if name == "automaton" and boost:
                    ref = {"compile": compile_ms if case.schema is not None else 0.0, "p50": p50}
                through = "-" if not boost else (walks[0].refused_at or "yes")
                # json_object mode has nothing for the automaton to compile: no ratio.
                ratio_c = f"{compile_ms / ref['compile']:6.1f}" if ref.get("compile") else "     -"
                ratio_m = f"{p50 / ref['p50']:6.2f}" if ref else "     -"
                print(f"{case.name:22} {name + suffix:22} {len(ids) + 1:4} {compile_ms:10.2f} "
                      f"{ratio_c} {p50:11.1f} {p99:8.1f} {ratio_m}  {through}")  # fmt: skip


def full_vocab_automaton(tok: Any) -> None:
    """What the automaton would pay for a whole-vocabulary mask, as the libraries compute."""
    import json

    from serve_app.grammar.schema import compile_schema
    from serve_app.grammar.validator import JsonValidator

    text = json.dumps(CASES[2].instance).encode()
    node = compile_schema(TEST_SCHEMA).root
    spelled = tok["texts"].token_bytes
    print("\n## The automaton over the whole vocabulary (one mask, SCHEMA (tests))")
    for cut in (0, 3, text.index(b"Hopper")):
        validator = JsonValidator(node)
        validator.feed(text[:cut])
        start = time.perf_counter()
        allowed = [i for i, data in enumerate(spelled) if data and validator.copy().feed(data)]
        elapsed = (time.perf_counter() - start) * 1e3
        print(
            f"after {text[:cut].decode()!r:24} {elapsed:8.0f} ms  ({len(allowed)} tokens allowed)"
        )


def apply_cost(tok: Any) -> None:
    """Putting a mask on the logits, 64 tokens allowed: the automaton's index_copy of its
    allowed ids, against a whole-vocabulary bitmask (what the libraries hand back) unpacked."""
    import numpy as np

    vocab = len(tok["texts"])
    logits = torch.randn(vocab)
    allowed = torch.arange(0, vocab, vocab // 64)[:64]
    bitmask = torch.zeros((vocab + 31) // 32, dtype=torch.int32)
    bitmask[allowed // 32] |= 1 << (allowed % 32).to(torch.int32)

    def automaton() -> torch.Tensor:
        return torch.full_like(logits, float("-inf")).index_copy(0, allowed, logits[allowed])

    def unpack() -> torch.Tensor:
        bits = np.unpackbits(bitmask.numpy().view(np.uint8), bitorder="little", count=vocab)
        return logits.masked_fill(~torch.from_numpy(bits.view(np.bool_)), float("-inf"))

    assert torch.equal(automaton(), unpack())
    print("\n## Applying a mask of 64 allowed tokens to 151,936 logits (us, median of 200)")
    for name, fn in (
        ("automaton index_copy", automaton),
        ("bitmask: numpy unpackbits + masked_fill", unpack),
    ):
        runs = []
        for _ in range(200):
            start = time.perf_counter_ns()
            fn()
            runs.append((time.perf_counter_ns() - start) / 1e3)
        print(f"{name:42} {statistics.median(runs):8.1f}")


def compile_table(
    title: str, rows: list[tuple[str, str, Schema, str]], workers: dict[str, Worker]
) -> None:
    """Each schema through each engine's worker: compile, then one mask after the row's
    answer prefix (random logits: the automaton's vocabulary scan), or the refusal."""
    print(f"\n## {title}")
    for what, today, schema, prefix in rows:
        print(what + (f"  [today: {today}]" if today else f"  [mask after {prefix!r}]"))
        for name, worker in workers.items():
            answer = worker.ask(schema, 1, prefix)
            ms = f"{answer['ms'][0]:9.1f} ms" if answer["ms"] else " " * 12
            if answer["status"] == "ok":
                detail = f"compiles; mask {answer['mask_ms']:.1f} ms"
            else:
                detail = f"{answer['status']}: {answer['message'][:150]}"
            print(f"    {name:14} {ms}  {detail}")


def semantics(engines: dict[str, Engine], tok: Any) -> None:
    print("\n## Today's JSON tests' documents through each engine's masks (pass/fail as expected?)")
    compiled: dict[tuple[str, str], Any] = {}
    for name, engine in engines.items():
        wrong: list[str] = []
        for label, schema, data, expected in SEMANTICS:
            key = (name, repr(schema))
            if key not in compiled:
                try:
                    compiled[key] = engine.compile(schema)
                except Exception as e:
                    compiled[key] = e
            if isinstance(compiled[key], Exception):
                wrong.append(f"{label}: schema refused ({compiled[key]})"[:120])
                continue
            got = accepts(engine, compiled[key], data, tok)
            if got != expected:
                wrong.append(f"{label}: {'accepts' if got else 'refuses'} {data[:60]!r}")
        print(f"{name}: {len(SEMANTICS) - len(wrong)}/{len(SEMANTICS)} as the tests expect")
        for line in wrong:
            print(f"    {line}")


# ----------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", default=default_tokenizer())
    parser.add_argument("--engines", default=",".join(("automaton", *LIBRARIES)))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per compile")
    parser.add_argument("--memory-gib", type=float, default=6.0, help="per compile worker")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="xgrammar's")
    parser.add_argument("--skip", default="", help="comma list: cases,hostile,features,semantics")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    torch.set_num_threads(1)  # as a replica decodes (configs/local.yaml: torch_threads 1)

    print(f"CPU: {cpu_flags()}")
    flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[-1].split("\n", 1)[0].split()
    print(f"avx2: {'avx2' in flags}; avx512f: {'avx512f' in flags}; "
          f"load average: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")  # fmt: skip
    tokenizer, texts, eos = load_tokenizer(args.tokenizer)
    tok = {"tokenizer": tokenizer, "texts": texts, "eos": eos}
    print(f"tokenizer: {args.tokenizer} ({len(texts)} ids); end tokens {eos}")
    engines: dict[str, Engine] = {}
    for name in args.engines.split(","):
        try:
            start = time.perf_counter()
            engines[name] = make_engine(name, tokenizer, texts, eos, args.threads)
            setup = time.perf_counter() - start
            print(f"{name} {engines[name].version}: tokenizer set up in {setup:.2f} s")
        except ImportError as e:
            print(f"{name}: not installed ({e})")
    workers = {name: Worker(name, args) for name in engines}
    try:
        if "cases" not in skip:
            measure_cases(engines, workers, tok, args)
            full_vocab_automaton(tok)
            apply_cost(tok)
        if "hostile" not in skip:
            title = f"Hostile schemas: compile, then one mask there ({args.timeout:.0f} s cap)"
            compile_table(title, [(n, "", s, p) for n, s, p in HOSTILE], workers)
        if "features" not in skip:
            rows = [(what, today, s, "") for what, today, s in FEATURES]
            compile_table("What the project caps or leaves to the post-check", rows, workers)
        if "semantics" not in skip:
            semantics(engines, tok)
    except Exception:
        traceback.print_exc()
        raise
    finally:
        for worker in workers.values():
            worker.stop()


if __name__ == "__main__":
    main()
