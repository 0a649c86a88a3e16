"""Apply benchmark: edits of files nobody here wrote, merged by the real app on the embedded model.

    .venv/bin/python -m bench.apply                 # in process: the router app, the embedded model
    .venv/bin/python -m bench.apply --no-model      # the merge and check alone, no app, no model
    .venv/bin/python -m bench.apply --speculation   # the model path's decode, drafts off and on

The files and the edits generated from them: bench/apply_cases.py.

Figures: exact (the answer is the expected file), lossless (a 200 that keeps, in order, every
original line the expected file keeps), 422, silent loss (a 200 that does not), and p50/p90
latency by file size and by path (deterministic: every chunk placed by anchors; model: the
rest). Baseline, in a second run: ``--only-model --draft-tokens 0``, the model path without
speculation (what every apply cost before: the model rewrote every file token by token).
"""

from __future__ import annotations

import asyncio
import difflib
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

from bench.apply_cases import BUCKETS, EDITS, Case, build_cases
from bench.common import base_parser, cpu_flags, percentile, table


@dataclass
class Outcome:
    case: Case
    status: int
    seconds: float
    answer: str
    path: str  # deterministic or model
    completion_tokens: int = 0

    @property
    def exact(self) -> bool:
        return self.status == 200 and self.answer == self.case.expected

    @property
    def silent_loss(self) -> bool:
        """A 200 that lacks, in order, an original line the expected file keeps."""
        if self.status != 200:
            return False
        original, expected = self.case.original.splitlines(), self.case.expected.splitlines()
        matcher = difflib.SequenceMatcher(None, original, expected, autojunk=False)
        kept = [
            line.rstrip()
            for a, _, size in matcher.get_matching_blocks()
            for line in original[a : a + size]
            if line.strip()
        ]
        remaining = iter(line.rstrip() for line in self.answer.splitlines())
        return not all(line in remaining for line in kept)


def path_of(case: Case) -> str:
    from serve_app.apply.placement import plan_update
    from serve_app.errors import MergeFailedError

    try:
        return "deterministic" if plan_update(case.original, case.update).is_certain else "model"
    except MergeFailedError:
        return "deterministic"


def run_without_model(cases: list[Case]) -> list[Outcome]:
    """The merge and check alone (what the service runs before any forward pass)."""
    from serve_app.apply.check import check_merge
    from serve_app.apply.placement import plan_update
    from serve_app.errors import MergeFailedError

    outcomes = []
    for case in cases:
        start = time.perf_counter()
        status, answer = 422, ""
        try:
            plan = plan_update(case.original, case.update)
            if plan.is_certain:
                answer = plan.merged()
                check_merge(plan, answer)
                status = 200
        except MergeFailedError:
            status = 422
        outcomes.append(Outcome(case, status, time.perf_counter() - start, answer, path_of(case)))
    return outcomes


def run_in_process(cases: list[Case], args) -> list[Outcome]:
    """Each case through the real router app (local testing mode) on the embedded model."""
    from fastapi.testclient import TestClient

    from serve_app.config import AppConfig, AuthOptions, ModelConfig, Roles
    from serve_app.engine_config import EngineConfig, SpeculationConfig
    from serve_app.testing import local_router_app
    from tests.clients import tagged_apply, updated_code
    from tests.conftest import TEST_KEY

    # The local account's key is bootstrapped from this variable, as configs/local.yaml's is.
    key = os.environ.setdefault("SERVE_APP_API_KEY", TEST_KEY)
    headers = {"Authorization": f"Bearer {key}"}
    model_id = args.model
    config = AppConfig(
        models=[ModelConfig(id=model_id, source=f"embedded:{model_id}")],
        roles=Roles(fim=model_id, edit=model_id, decisions=model_id),
        engine=EngineConfig(
            torch_threads=args.threads,
            speculation=SpeculationConfig(apply=args.draft_tokens),
        ),
        auth=AuthOptions(bootstrap_local_key=True, docs="open"),
        data_dir=tempfile.mkdtemp(prefix="bench-apply-"),
    )
    outcomes = []
    with TestClient(local_router_app(config), raise_server_exceptions=False) as client:
        for case in cases:
            body = {
                "model": model_id,
                "messages": [{"role": "user", "content": tagged_apply(case.original, case.update)}],
            }
            start = time.perf_counter()
            response = client.post("/v1/apply/completions", json=body, headers=headers)
            seconds = time.perf_counter() - start
            answer, tokens = "", 0
            if response.status_code == 200:
                payload = response.json()
                answer = updated_code(payload["choices"][0]["message"]["content"])
                tokens = payload["usage"]["completion_tokens"]
            elif response.status_code != 422:
                print(f"  {case.kind} {case.path}: {response.status_code} {response.text[:200]}")
            outcomes.append(
                Outcome(case, response.status_code, seconds, answer, path_of(case), tokens)
            )
            print(
                f"  {case.language} {case.kind:16} {case.lines:4} lines {outcomes[-1].path:13} "
                f"{response.status_code} {seconds:6.2f} s exact={outcomes[-1].exact}",
                flush=True,
            )
    return outcomes


def run_speculation(cases: list[Case], args) -> list[list[str]]:
    """The model path's decode alone: the apply prompt of each whole-function rewrite on files
    of <= 200 lines, greedy, on one in-process engine without drafts and one with the apply
    role's drafts; decode tok/s after the first token, acceptance, and whether the texts are
    the same."""
    from serve_app.engine.engine import EngineConfig, LLMEngine
    from serve_app.engine.protocol import GenerationRequest, SamplingParams
    from serve_app.models.loader import load_model
    from serve_app.prompts.apply import ApplyInput
    from serve_app.prompts.chat_encoding import encode_chat

    loaded = load_model(f"embedded:{args.model}", threads=args.threads)
    chosen = [c for c in cases if c.kind == "change body" and c.lines <= 200][: args.spec_cases]
    prompts = [
        encode_chat(
            loaded.tokenizer,
            ApplyInput(c.original, c.update).messages(),
            continue_final_message=True,
        )
        for c in chosen
    ]
    rows = [["apply role drafts", "requests", "decoded tok", "decode s", "tok/s", "acceptance"]]
    texts: dict[int, list[str]] = {}
    for drafts in (0, args.draft_tokens):
        config = EngineConfig(weights="int8", draft_tokens={"apply": drafts}, draft_max_batch=2)
        engine = LLMEngine(loaded, config)
        tokens, seconds, texts[drafts] = 0, 0.0, []
        try:
            for i, ids in enumerate(prompts):
                params = SamplingParams(max_tokens=len(ids) + 64, temperature=0.0, stop=("\n```",))
                request = GenerationRequest(f"a{drafts}-{i}", list(ids), params, route="apply")
                text, last, decode_seconds = asyncio.run(_timed_decode(engine, request))
                seconds += decode_seconds
                tokens += last.completion_tokens - 1
                texts[drafts].append(text)
            stats = engine.stats()
        finally:
            engine.shutdown()
        acceptance = f"{stats.draft_acceptance:.0%}" if stats.draft_tokens else "-"
        rows.append(
            [
                str(drafts),
                str(len(prompts)),
                str(tokens),
                f"{seconds:.1f}",
                f"{tokens / seconds:.1f}",
                acceptance,
            ]
        )
    same = texts[0] == texts[args.draft_tokens]
    print(f"same text with and without drafts: {same}; load {os.getloadavg()[0]:.1f}")
    return rows


async def _timed_decode(engine, request) -> tuple[str, object, float]:
    """A request's text, last chunk, and seconds from its first token to its end (decode
    alone: the prompt is read the same way with and without drafts)."""
    parts, last, first = [], None, None
    async for chunk in engine.generate(request):
        first = first if first is not None else time.perf_counter()
        parts.append(chunk.text)
        last = chunk
    return "".join(parts), last, time.perf_counter() - first


def counts_table(outcomes: list[Outcome]) -> list[list[str]]:
    rows = [["edit", "cases", "exact", "lossless 200", "422", "silent loss", "other"]]
    kinds = list(EDITS) + ["all"]
    for kind in kinds:
        group = [o for o in outcomes if kind in ("all", o.case.kind)]
        if not group:
            continue
        rows.append(
            [
                kind,
                str(len(group)),
                str(sum(o.exact for o in group)),
                str(sum(o.status == 200 and not o.silent_loss for o in group)),
                str(sum(o.status == 422 for o in group)),
                str(sum(o.silent_loss for o in group)),
                str(sum(o.status not in (200, 422) for o in group)),
            ]
        )
    return rows


def latency_table(outcomes: list[Outcome]) -> list[list[str]]:
    rows = [["group", "requests", "p50 s", "p90 s", "exact"]]
    groups: list[tuple[str, Callable[[Outcome], bool]]] = [
        (f"<= {bucket} lines", lambda o, b=bucket: _bucket(o.case.lines) == b) for bucket in BUCKETS
    ]
    groups += [
        ("<= 200 lines, all paths", lambda o: o.case.lines <= 200),
        ("path: deterministic", lambda o: o.path == "deterministic"),
        ("path: model", lambda o: o.path == "model"),
    ]
    for name, wanted in groups:
        group = [o for o in outcomes if wanted(o)]
        if group:
            seconds = [o.seconds for o in group]
            rows.append(
                [
                    name,
                    str(len(group)),
                    f"{percentile(seconds, 50):.3f}",
                    f"{percentile(seconds, 90):.3f}",
                    str(sum(o.exact for o in group)),
                ]
            )
    model = [o for o in outcomes if o.path == "model" and o.completion_tokens]
    if model:
        rate = sum(o.completion_tokens for o in model) / sum(o.seconds for o in model)
        print(f"model path: {len(model)} answers, {rate:.1f} output tok/s (speculation role apply)")
    return rows


def _bucket(lines: int) -> int:
    return next(b for b in BUCKETS if lines <= b)


def main() -> None:
    parser = base_parser(__doc__, "edit")
    parser.add_argument("--per-bucket", type=int, default=2, help="files per language and size")
    parser.add_argument("--no-model", action="store_true", help="merge and check only, no app")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the replica")
    parser.add_argument("--limit", type=int, default=0, help="run only the first N cases")
    parser.add_argument("--draft-tokens", type=int, default=16, help="the apply role's drafts")
    parser.add_argument("--only-model", action="store_true", help="only the model-path cases")
    parser.add_argument(
        "--speculation", action="store_true", help="the model path's decode, drafts on/off"
    )
    parser.add_argument("--spec-cases", type=int, default=4)
    args = parser.parse_args()
    cases = build_cases(args.per_bucket)
    if args.only_model:
        cases = [case for case in cases if path_of(case) == "model"]
    if args.limit:
        cases = cases[: args.limit]
    files = sorted({(case.language, case.path, case.lines) for case in cases})
    print(f"{len(cases)} cases on {len(files)} files:")
    for language, path, lines in files:
        print(f"  {language} {lines:4} lines {path}")
    print(f"CPU: {cpu_flags()}; load {os.getloadavg()[0]:.1f}")
    if args.speculation:
        print(table(run_speculation(cases, args)))
        return
    outcomes = run_without_model(cases) if args.no_model else run_in_process(cases, args)
    print(table(counts_table(outcomes)))
    print()
    print(table(latency_table(outcomes)))
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
