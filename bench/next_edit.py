"""Next-edit judged the way its editors judge it, on real edits (shared/data/next_edit_cases.json).

    PYTHONPATH=$PWD .venv/bin/python -m bench.next_edit [--cases 48] [--variants a,b]

Each case is a real commit of a public project (bench/next_edit_cases.py: a file's first hunks
are the edit history, the next hunk the expected edit). Requests are built as Continue (even
cases) and Zed (odd cases) build them (tests/fixtures/edit_clients.py), answered by the real
edit service on the embedded model in this process, and read as that client reads them.
Every variant (a prompt style and its decoding) answers every case, interleaved. Per variant:

- exact: the region equals the expected one (trailing whitespace trimmed);
- delta chrF: Zed's edit-prediction score (character n-grams up to 6, beta 2, whitespace
  ignored) on what changed: n-grams the edit added or removed, so copying the region scores 0;
- no-op: the answer is the region unchanged; reversal: it undoes part of the newest diff;
- drops a line: the answer lacks a line of the region that the expected edit keeps;
- rejected: answers the service's checks replaced by "no change", by reason;
- latency p50/p90, cold (the first request for this file) and repeat (one more keystroke:
  the first character of the expected edit typed, and its diff added to the history).

Latency on a shared CPU is noisy; quality figures are not (greedy, fixed seed)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.common import cpu_flags, percentile, table
from bench.edit_adapter import adapter_record, adapter_style
from bench.edit_scores import delta_chrf, drops_kept_line, normalized, reverses
from tests.fixtures.edit_clients import (
    ClientCall,
    Scenario,
    continue_call,
    continue_extract,
    zed_call,
    zed_extract,
)
from training.edits import EditExample, typing_example, unified_hunk

# Fetched material stays out of the project's git: the cases live in shared/ beside the project
# (../shared/data/README.md); --data reads them from anywhere else.
CASES = Path(__file__).resolve().parents[2] / "shared" / "data" / "next_edit_cases.json"
MODEL_ID = "qwen2.5-coder-0.5b"
SHAPES: dict[str, tuple[Callable[[Scenario, str], ClientCall], Callable[[dict], str | None]]] = {
    "continue": (continue_call, continue_extract),
    "zed": (zed_call, zed_extract),
}
# name -> (prompt style, request fields that replace the client's, whether the next-edit
# adapter answers). "as sent" keeps what the client sends (Zed: no temperature, so the 0.2
# default; Continue: 0.01; both the default presence penalty of 1.0); "greedy" asks for
# temperature 0 and no penalty; "tuned" runs with --adapter, in the style it was trained on
# (its training.json's; None below).
GREEDY = {"temperature": 0.0, "presence_penalty": 0.0}
VARIANTS: dict[str, tuple[str | None, dict[str, Any], bool]] = {
    "chat/as-sent (today)": ("chat", {}, False),
    "chat/greedy": ("chat", GREEDY, False),
    "chat_split/as-sent": ("chat_split", {}, False),
    "chat_split/greedy": ("chat_split", GREEDY, False),
    "tagged/greedy": ("tagged", GREEDY, False),
    "few_shot/greedy": ("few_shot", GREEDY, False),
    "fim/greedy": ("fim", GREEDY, False),
    "tuned/as-sent": (None, {}, True),
    "tuned/greedy": (None, GREEDY, True),
}
BASELINE = "chat/as-sent (today)"

# --- cases --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    shape: str
    scenario: Scenario
    expected: str
    kind: str = "edit"  # or "no_change": the miner's examples whose answer is the region


def load_cases(
    path: Path, limit: int | None, every: int = 1, kind: str = "all", cursor: str = "as-cut"
) -> list[Case]:
    """The cases, taken round-robin across the repositories (so a run cut short, or every
    ``every``-th case, still covers every language), the first ``limit`` of them. Continue's
    shape for cases at even positions of the file, Zed's for odd ones. ``path``: a JSON list,
    or JSON lines (``.jsonl``: the miner's splits, e.g. data/next_edit/validation.jsonl).
    ``kind``: every case, or only those of one kind ("edit", "no_change"). ``cursor``: where
    the request puts the cursor (``with_cursor``)."""
    rng = random.Random(7)
    text = path.read_text()
    raws = (
        [json.loads(line) for line in text.splitlines()]
        if path.suffix == ".jsonl"
        else json.loads(text)
    )
    by_repo: dict[str, list[Case]] = {}
    for index, raw in enumerate(raws):
        if kind != "all" and raw.get("kind", "edit") != kind:
            continue
        raw = with_cursor(raw, cursor, rng)
        if raw is None:
            continue
        scenario = Scenario(
            path=raw["path"],
            file=raw["file"],
            cursor=tuple(raw["cursor"]),
            first_line=raw["first_line"],
            last_line=raw["last_line"],
            snippets=tuple(map(tuple, raw["snippets"])),
            hunks=tuple(raw["hunks"]),
        )
        # A commit's file can give several examples: the region's line tells them apart.
        name = f"{raw['repo']}@{raw['commit'][:8]}:{raw['path']}:{raw['first_line'] + 1}"
        name += " (no change)" if raw.get("kind") == "no_change" else ""
        shape = "continue" if index % 2 == 0 else "zed"
        case = Case(name, shape, scenario, raw["expected"], raw.get("kind", "edit"))
        by_repo.setdefault(raw["repo"], []).append(case)
    rounds = itertools.zip_longest(*by_repo.values())
    cases = [case for round_ in rounds for case in round_ if case is not None]
    return cases[::every][:limit]


def with_cursor(raw: dict, cursor: str, rng: random.Random) -> dict | None:
    """The case as cut (the cursor at the start of the code of the line the edit begins on),
    with the cursor at that line's end, with its region cut from the cursor's line
    (``_region_from_cursor``), or caught mid-line: its first new line half typed, the cursor
    after it (``training.edits.typing_example``). None where the case cannot be cut so. An
    editor sends the cursor where the user stopped typing."""
    if cursor == "line-end":
        row = raw["cursor"][0]
        return {**raw, "cursor": [row, len(raw["file"].split("\n")[row].rstrip())]}
    if cursor == "region-start":
        return _region_from_cursor(raw)
    if cursor == "mid-line":
        fields = {"cursor": tuple(raw["cursor"]), "snippets": list(map(tuple, raw["snippets"]))}
        typed = typing_example(EditExample(**{**raw, **fields}), rng)
        return None if typed is None else dataclasses.asdict(typed)
    return raw


def _region_from_cursor(raw: dict) -> dict | None:
    """The case with its region cut as Continue cuts it: from the cursor's line, 6 lines at
    least; the cases' own regions hold 2 lines before the edit (None where those change)."""
    lines, row = raw["file"].split("\n"), raw["cursor"][0]
    first, last = raw["first_line"], raw["last_line"]
    expected = raw["expected"].split("\n")
    if not first <= row <= last or expected[: row - first] != lines[first:row]:
        return None
    end = max(last, min(row + 5, len(lines) - 1))
    expected = expected[row - first :] + lines[last + 1 : end + 1]
    return {**raw, "first_line": row, "last_line": end, "expected": "\n".join(expected)}


def region_of(scenario: Scenario) -> str:
    return "\n".join(scenario.lines[scenario.first_line : scenario.last_line + 1])


def one_keystroke_on(case: Case) -> Scenario:
    """The scenario after the user typed the expected edit's first character (or deleted
    the first character it deletes): the file, the cursor and the history move on by one."""
    scenario = case.scenario
    region, expected = region_of(scenario), case.expected
    at = next(
        (i for i, (a, b) in enumerate(zip(region, expected, strict=False)) if a != b),
        min(len(region), len(expected)),
    )
    if at < len(expected) and (len(expected) >= len(region) or at >= len(region)):
        typed, cursor_at = region[:at] + expected[at] + region[at:], at + 1
    else:
        typed, cursor_at = region[:at] + region[at + 1 :], at
    lines = scenario.lines
    new_lines = [*lines[: scenario.first_line], *typed.split("\n")]
    new_lines += lines[scenario.last_line + 1 :]
    before_cursor = typed[:cursor_at].split("\n")
    cursor = (scenario.first_line + len(before_cursor) - 1, len(before_cursor[-1]))
    hunk = unified_hunk(lines, new_lines)
    return dataclasses.replace(
        scenario,
        file="\n".join(new_lines),
        cursor=cursor,
        last_line=scenario.last_line + typed.count("\n") - region.count("\n"),
        hunks=(*scenario.hunks, hunk)[-6:],
    )


# --- the run ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Tally:
    exact: int = 0
    chrf: float = 0.0
    noop: int = 0
    reversal: int = 0
    lossy: int = 0
    answered: int = 0
    cold: list[float] = dataclasses.field(default_factory=list)
    repeat: list[float] = dataclasses.field(default_factory=list)
    rejected: Counter = dataclasses.field(default_factory=Counter)
    followed: int = 0


def app_config(args: argparse.Namespace) -> Any:
    """``--config``'s application (its edit role's model and engine), or the embedded
    ``--model`` as configs/local.yaml runs it, with ``--threads`` and ``--weights``."""
    from serve_app.config import AppConfig, ModelConfig, Roles, serve_file_configs
    from serve_app.engine_config import EngineConfig

    if args.config:
        config = serve_file_configs(args.config)[0]
        if args.source:  # e.g. bench.random_checkpoint's folder: not the adapter's model
            update = {"source": args.source, "edit_adapter": None}
            edit = config.model(config.roles.edit).model_copy(update=update)
            models = [edit if m.id == edit.id else m for m in config.models]
            config = config.model_copy(update={"models": models})
        return config
    model = ModelConfig(id=args.model, source=f"embedded:{args.model}", dtype="float32")
    return AppConfig(
        models=[model],
        roles=Roles(fim=args.model, edit=args.model, decisions=args.model),
        engine=EngineConfig(
            torch_threads=args.threads,
            prompt_threads=args.prompt_threads,
            weights=args.weights,
        ),
    )


def start_services(
    args: argparse.Namespace, rejected: dict[str, Any], config: Any
) -> tuple[Any, dict]:
    """One engine on ``config``'s edit model, one edit service per variant on it, each
    counting its rejections in ``rejected[variant]``; sets ``args.model`` to that model."""
    from serve_app.engine.engine import LLMEngine
    from serve_app.engine.startup import EDIT_ADAPTER
    from serve_app.serving.engine_client import EngineClient
    from serve_app.serving.next_edit import NextEditService

    # A fixed seed where the config sets none: the clients' temperature 0.2 then draws the
    # same answers run after run, so two runs (or two configs) differ only where their
    # settings do.
    seeded = config.engine.model_copy(update={"seed": config.engine.seed or 0})
    config = config.model_copy(update={"engine": seeded})
    model = config.model(config.roles.edit)
    if args.adapter:
        # The model as one serving this adapter is configured: asked in the layout it learned
        # (the untuned variants name their own style).
        update = {"edit_adapter": args.adapter, "edit_prompt": adapter_style(args.adapter)}
        model = model.model_copy(update=update)
    args.model = model.id
    engine = LLMEngine.from_config(config, "edit", model=model)
    client = EngineClient(engine, model)
    services = {
        name: NextEditService(
            client,
            style=style or adapter_style(args.adapter),
            on_rejected=rejected[name],
            adapter=EDIT_ADAPTER if tuned else "",
        )
        for name, (style, _, tuned) in VARIANTS.items()
        if name in args.variants
    }
    return engine, services


def expected_length(engine: Any, case: Case) -> dict[str, int]:
    """``max_tokens`` for an answer as long as the expected one in its code block (a few
    tokens over): times a model whose answers are noise (random weights) at a real length."""
    return {"max_tokens": len(engine.loaded.tokenizer.encode(case.expected)) + 12}


async def answer(
    service: Any, call: ClientCall, fields: dict, read: Callable, salt: str, model: str
) -> tuple:
    """One request as the deployment serves it, in the prefix-cache partition ``salt`` (one
    per variant, as one per account: a variant never reads another's cached prompts)."""
    from serve_app.api.edit import EditCompletionRequest
    from serve_app.serving.billing import RequestContext, UsageRecorder

    async def unbilled(*_: Any) -> None:
        return None

    body = EditCompletionRequest.model_validate({**call.body, **fields})
    context = RequestContext(grant=None, model=model, endpoint="edit", cache_salt=salt)
    start = time.perf_counter()
    completion = await UsageRecorder(unbilled, 600).run(context, partial(service.complete, body))
    seconds = time.perf_counter() - start
    region = read(completion.model_dump())
    usage = completion.usage
    tokens = (usage.prompt_tokens, usage.cached_input_tokens, usage.completion_tokens)
    return (call.old_region if region is None else region), seconds, tokens


async def run(args: argparse.Namespace, config: Any = None) -> list[dict]:
    """Every variant on every case, interleaved, on ``config``'s edit model (default:
    ``app_config(args)``); one log entry per case and variant (also appended to ``args.log``
    as it comes, so a run cut short still has its figures)."""
    from serve_app.prompts.next_edit import parse_edit_prompt, rejected_edit

    cases = load_cases(args.data, args.cases, args.every, args.kind, args.cursor)
    rejected = {name: _LastReason() for name in VARIANTS}
    engine, services = start_services(args, rejected, config or app_config(args))
    log, expected_rejected = [], Counter()
    try:
        for number, case in enumerate(cases, 1):
            build, read = SHAPES[case.shape]
            call, repeat = (
                build(case.scenario, args.model),
                build(one_keystroke_on(case), args.model),
            )
            prompt = parse_edit_prompt(call.body["messages"][0]["content"])
            expected_rejected[rejected_edit(case.expected, prompt) or "kept"] += 1
            length = expected_length(engine, case) if args.answer_tokens == "expected" else {}
            for name, service in services.items():
                fields = {**VARIANTS[name][1], **length}
                rejected[name].last = None
                region, cold, tokens = await answer(service, call, fields, read, name, args.model)
                entry = {"case": case.name, "variant": name, "answer": region, "tokens": tokens}
                entry |= {"rejected": rejected[name].last, "cold_s": cold}
                if name in args.repeat_for:
                    _, entry["repeat_s"], entry["repeat_tokens"] = await answer(
                        service, repeat, fields, read, name, args.model
                    )
                log.append(entry)
                if args.log:
                    with args.log.open("a") as out:
                        out.write(json.dumps(entry) + "\n")
            print(f"{number}/{len(cases)} {case.name}", flush=True)
    finally:
        engine.shutdown()
    print(f"checks on the expected edits themselves: {dict(expected_rejected)}")
    return log


class _LastReason:
    """The edit service's ``on_rejected``: remembers why the last answer was no change."""

    last: str | None = None

    def __call__(self, reason: str) -> None:
        self.last = reason


def tallies_of(log: list[dict], cases: dict[str, Case]) -> dict[str, Tally]:
    """The figures of each variant from the log of a run (or the part of it that ran). Cases
    whose right answer is no change are tallied apart, in a row of their own: keeping the
    region scores 100 there, so mixed in they would pass for edits predicted."""
    tallies: dict[str, Tally] = {}
    for entry in log:
        case = cases[entry["case"]]
        row = entry["variant"] + (", no-change cases" if case.kind == "no_change" else "")
        tally = tallies.setdefault(row, Tally())
        got, want = normalized(entry["answer"]), normalized(case.expected)
        old = normalized(region_of(case.scenario))
        tally.answered += 1
        tally.exact += got == want
        tally.chrf += delta_chrf(old, want, got)
        tally.noop += got == old
        tally.reversal += reverses(old, want, got, case.scenario.hunks[-1])
        tally.lossy += drops_kept_line(old, want, got)
        tally.cold.append(entry["cold_s"])
        if entry.get("repeat_s") is not None:
            tally.repeat.append(entry["repeat_s"])
            prompt, cached, _ = entry["repeat_tokens"]
            tally.followed += cached == prompt  # answered with the cold prediction, unread
        if entry.get("rejected"):
            tally.rejected[entry["rejected"]] += 1
    return tallies


def rows(tallies: dict[str, Tally]) -> list[list[str]]:
    header = ["variant", "exact", "delta chrF", "x today", "no-op", "reversal", "drops a line"]
    header += ["rejected"]
    header += ["cold p50/p90 s", "repeat p50/p90 s", "repeats following the prediction"]
    out = [header]
    base = tallies.get(BASELINE)
    for name, tally in tallies.items():
        n = tally.answered
        chrf = tally.chrf / n
        ratio = f"{chrf / (base.chrf / base.answered):.2f}x" if base and base.chrf else "-"
        out.append(
            [
                name,
                f"{tally.exact}/{n}",
                f"{chrf:.1f}",
                ratio,
                f"{tally.noop / n:.0%}",
                f"{tally.reversal / n:.0%}",
                f"{tally.lossy / n:.0%}",
                ", ".join(f"{k} {v}" for k, v in sorted(tally.rejected.items())) or "-",
                latency(tally.cold),
                latency(tally.repeat),
                f"{tally.followed}/{len(tally.repeat)}" if tally.repeat else "-",
            ]
        )
    return out


def latency(seconds: list[float]) -> str:
    if not seconds:
        return "-"
    return f"{percentile(seconds, 50):.2f}/{percentile(seconds, 90):.2f}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=CASES)
    parser.add_argument("--cases", type=int, default=None, help="the first N cases only")
    parser.add_argument("--every", type=int, default=1, help="every K-th case only")
    parser.add_argument(
        "--kind",
        choices=["all", "edit", "no_change"],
        default="all",
        help="the miner's cases of one kind only (the bench's own are all edits)",
    )
    parser.add_argument(
        "--cursor",
        choices=["as-cut", "line-end", "mid-line", "region-start"],
        default="as-cut",
        help="where requests put the cursor: as the cases were cut, at that line's end, "
        "after the first new line half typed, or on the region's first line (its region cut "
        "from there, as Continue cuts it)",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--prompt-threads", type=int, default=None, help="threads reading prompts (--threads)"
    )
    parser.add_argument("--model", default=MODEL_ID, help="an embedded model's name")
    parser.add_argument("--weights", default="auto", help="engine.weights (decode weights)")
    parser.add_argument("--config", type=Path, help="a serve config: its edit role's model")
    parser.add_argument("--source", help="with --config: the edit model's weights from here")
    parser.add_argument(
        "--answer-tokens",
        choices=["client", "expected"],
        default="client",
        help="max_tokens as the client sends it, or the expected answer's length (timing "
        "random weights)",
    )
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    parser.add_argument(
        "--repeat-for", default=",".join(VARIANTS), help="variants timed on a repeat too"
    )
    parser.add_argument(
        "--adapter",
        help="the tuned variants' next-edit adapter (a peft folder, or builtin:<name>); "
        "without one they are left out",
    )
    parser.add_argument("--log", type=Path, help="append every answer here (JSON lines)")
    parser.add_argument("--from-log", type=Path, help="no run: the figures of a logged one")
    args = parser.parse_args(argv)
    if not args.data.exists():
        parser.error(
            f"no cases at {args.data}: the fetched cases live in shared/data/ beside the "
            "project; point --data at a copy"
        )
    named = [name.strip() for name in args.variants.split(",")]
    unknown = [name for name in named if name not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    args.variants = [n for n in named if args.adapter or args.from_log or not VARIANTS[n][2]]
    args.repeat_for = [name.strip() for name in args.repeat_for.split(",")]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.from_log:
        log = [json.loads(line) for line in args.from_log.read_text().splitlines()]
    else:
        print(f"CPU: {cpu_flags()}")
        if args.adapter:
            print(f"adapter: {args.adapter} {adapter_record(args.adapter)}")
        log = asyncio.run(run(args))
    cases = {case.name: case for case in load_cases(args.data, None, 1, args.kind, args.cursor)}
    print(table(rows(tallies_of(log, cases))))


if __name__ == "__main__":
    main()
