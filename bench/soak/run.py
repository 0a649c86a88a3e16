"""The soak itself: traffic for minutes, a sample every interval, and the verdict of issue 50."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from bench.common import percentile, table
from bench.soak import BACKSTOP_GRACE_S, HANG_MARGIN_S, P99_RATIO, PSS_GROWTH, WINDOW
from bench.soak.calls import Call
from bench.soak.graph import cache_bytes, pss_kb, replica_pids
from bench.soak.ledger import LedgerCheck, settled_ledger
from bench.soak.traffic import Traffic


@dataclass
class Sample:
    minute: int
    at: float
    load: float
    pss_kb: dict[str, int]  # "Deployment#n" -> kB
    cache: dict[str, float]  # "Deployment#replica" -> bytes


def sample(index: int, session: int, ports: list[int]) -> Sample:
    pss: dict[str, int] = {}
    for name, pids in replica_pids(session).items():
        for number, pid in enumerate(pids, 1):
            kb = pss_kb(pid)
            if kb is not None:
                pss[f"{name}#{number}" if len(pids) > 1 else name] = kb
    return Sample(index, time.time(), os.getloadavg()[0], pss, cache_bytes(ports))


def deadline_s(call: Call, limits: dict[str, float]) -> float:
    timeout = (
        limits["decision_timeout_s"] if call.kind == "decisions" else limits["request_timeout_s"]
    )
    return timeout + BACKSTOP_GRACE_S + HANG_MARGIN_S


def five_xx(calls: list[Call]) -> Counter:
    kinds: Counter = Counter()
    for call in calls:
        if call.status >= 500:
            kinds[f"{call.status} {call.code}"] += 1
        elif call.error_event:
            kinds[f"event {call.code}"] += 1
        elif call.failure:
            kinds[f"transport {call.failure}"] += 1
    return kinds


KINDS = ("fim", "next-edit", "apply", "decisions", "chat")


def latencies(calls: list[Call], kind: str) -> list[float]:
    return [c.seconds for c in calls if c.kind == kind and c.ok and not c.cancelled]


def p(values: list[float], q: float) -> str:
    return f"{percentile(values, q):.2f}" if values else "-"


@dataclass
class SoakResult:
    samples: list[Sample]
    calls: list[Call]
    ledger: LedgerCheck
    warmup: int
    limits: dict[str, float]
    verdict: dict[str, tuple[bool | None, str]] = field(default_factory=dict)


def run_soak(
    started: dict, minutes: float, sample_s: float = 60.0, warmup: int = 2, tiny: bool = False,
    limits: dict[str, float] | None = None,
) -> SoakResult:  # fmt: skip
    """Traffic for ``minutes``; a sample every ``sample_s``; the ledger check at the end."""
    from tests.ray_admin import RayAdmin

    limits = limits or {"request_timeout_s": 300.0, "decision_timeout_s": 120.0}
    admin = RayAdmin(started["ray_address"])
    try:
        ports = admin.command("metrics")["ports"]
    finally:
        admin.close()
    traffic = Traffic(started["url"], started["model"], started["keys"], tiny)
    traffic.start()
    samples: list[Sample] = []
    begun = time.monotonic()
    intervals = max(1, round(minutes * 60 / sample_s))
    header_printed = False
    for index in range(1, intervals + 1):
        end_of_interval = begun + index * sample_s
        # beside the traffic, not before the sample: a short request may queue for seconds
        threading.Thread(target=traffic.refusals, daemon=True).start()
        time.sleep(max(0.0, end_of_interval - time.monotonic()))
        samples.append(sample(index, started["pid"], ports))
        if not header_printed:
            print(table([interval_header(samples[-1])]).splitlines()[0], flush=True)
            header_printed = True
        print(interval_row(samples, traffic.snapshot(), sample_s), flush=True)
    traffic.finish()
    calls = traffic.snapshot()
    ledger = settled_ledger(started["db"], calls)
    result = SoakResult(samples, calls, ledger, warmup, limits)
    result.verdict = soak_verdict(result, sample_s)
    return result


def interval_header(first: Sample) -> list[str]:
    names = sorted(first.pss_kb)
    return ["min", "load", "reqs", *[f"{k} p50/p99 s" for k in KINDS], "5xx", "429/402",
            *[f"{n} PSS MB" for n in names], "cache MB"]  # fmt: skip


def in_interval(
    calls: list[Call], samples: list[Sample], index: int, sample_s: float
) -> list[Call]:
    """Calls that ended within interval ``index`` (1-based)."""
    end = samples[index - 1].at
    start = end - sample_s
    return [c for c in calls if start < c.ended <= end]


def interval_row(samples: list[Sample], calls: list[Call], sample_s: float) -> str:
    last = samples[-1]
    mine = in_interval(calls, samples, last.minute, sample_s)
    names = sorted(samples[0].pss_kb)
    cells = [str(last.minute), f"{last.load:.1f}", str(len(mine))]
    for kind in KINDS:
        values = latencies(mine, kind)
        cells.append(f"{p(values, 50)}/{p(values, 99)}")
    errors = five_xx(mine)
    cells.append(",".join(f"{k}:{v}" for k, v in errors.items()) or "0")
    cells.append(f"{sum(c.status == 429 for c in mine)}/{sum(c.status == 402 for c in mine)}")
    cells += [f"{last.pss_kb.get(n, 0) / 1024:.0f}" for n in names]
    cells.append(f"{sum(last.cache.values()) / 2**20:.0f}")
    return "| " + " | ".join(cells) + " |"


def soak_verdict(result: SoakResult, sample_s: float) -> dict[str, tuple[bool | None, str]]:
    """Issue 50's criteria, each (passed, figures); passed None: a figure shown beside them."""
    samples, calls = result.samples, result.calls
    after = len(samples) - result.warmup
    window = max(1, min(WINDOW, after // 2))
    verdict: dict[str, tuple[bool | None, str]] = {}
    if after >= 2:
        first = [c for i in range(result.warmup + 1, result.warmup + window + 1)
                 for c in in_interval(calls, samples, i, sample_s)]  # fmt: skip
        last = [c for i in range(len(samples) - window + 1, len(samples) + 1)
                for c in in_interval(calls, samples, i, sample_s)]  # fmt: skip
        ratios = []
        for kind in KINDS:
            a, b = latencies(first, kind), latencies(last, kind)
            if a and b:
                early, late = percentile(a, 99), percentile(b, 99)
                ratios.append((kind, late / early, early, late, f"{len(a)}/{len(b)}"))
        worst = max((r[1] for r in ratios), default=0.0)
        # n: requests in each window; under 100, a p99 is the window's slowest request
        text = ", ".join(f"{k} {a:.2f}->{b:.2f} s ({r:.2f}x, n {n})" for k, r, a, b, n in ratios)
        verdict["p99 last/first"] = (worst <= P99_RATIO, f"{window} intervals each: {text}")
        # A replica hands its heap's free pages back whenever its engine idles
        # (``pages.return_freed_memory``), so one sample may fall in a trough: growth is the
        # peak of the last window against the first window's after warm-up, as p99 compares
        # windows; a leak raises both. The peak against the sample ending warm-up is shown.
        base = samples[result.warmup - 1] if result.warmup else samples[0]
        early, late = samples[result.warmup : result.warmup + window], samples[-window:]
        growth = []
        for name in base.pss_kb:
            first, last = (max(s.pss_kb.get(name, 0) for s in w) for w in (early, late))
            growth.append((name, last / first - 1, first, last))
        worst_growth = max((g[1] for g in growth), default=0.0)
        text = ", ".join(
            f"{n} {a / 1024:.0f}->{b / 1024:.0f} MB ({g:+.1%})" for n, g, a, b in growth
        )
        verdict["PSS growth"] = (worst_growth <= PSS_GROWTH, f"peak of {window} intervals: {text}")
        over_base = []
        for name, kb in base.pss_kb.items():
            peak = max(s.pss_kb.get(name, 0) for s in samples[result.warmup :])
            over_base.append(f"{name} {kb / 1024:.0f}->{peak / 1024:.0f} MB ({peak / kb - 1:+.1%})")
        verdict["PSS peak over warm-up end"] = (None, ", ".join(over_base))
        # the prefix caches fill towards prefix_cache_mb as sessions come: what grew besides
        lean = []
        for name, *_ in growth:
            deployment = name.split("#")[0]

            def less_cache(s: Sample, deployment: str = deployment, name: str = name) -> float:
                held = sum(v for k, v in s.cache.items() if k.split("#")[0] == deployment)
                return s.pss_kb.get(name, 0) - held / 1024

            peak = max(less_cache(s) for s in samples[result.warmup :])
            lean.append(f"{name} {peak / less_cache(base) - 1:+.1%}")
        verdict["PSS less prefix cache"] = (None, ", ".join(lean))
    verdict["ledger"] = (result.ledger.clean, result.ledger.line())
    errors = five_xx(calls)
    undesigned = {k: v for k, v in errors.items() if not k.startswith("503 ")}
    verdict["5xx"] = (not undesigned, dict(errors).__repr__())
    hung = [c for c in calls if c.seconds > deadline_s(c, result.limits)]
    verdict["past deadline"] = (not hung, f"{len(hung)} requests")
    designed = sum(c.status in (402, 429) for c in calls)
    verdict["designed 429/402"] = (designed > 0, f"{designed} refusals")
    return verdict


def print_soak(result: SoakResult) -> None:
    calls = result.calls
    kinds = Counter(c.kind for c in calls)
    cancelled = sum(c.cancelled for c in calls)
    streams = sum(c.stream for c in calls)
    print(f"\n{len(calls)} requests {dict(kinds)}; {streams} streams, {cancelled} cancelled by "
          f"the client; statuses {dict(Counter(c.outcome for c in calls))}")  # fmt: skip
    rows = [["kind", "n (200)", "p50 s", "p99 s"]]
    for kind in KINDS:
        values = latencies(calls, kind)
        rows.append([kind, str(len(values)), p(values, 50), p(values, 99)])
    print(table(rows))
    for name, size in sorted(result.samples[-1].cache.items()):
        print(f"prefix cache {name}: {size / 2**20:.1f} MB at the end")
    if result.ledger.missing or result.ledger.doubled:
        print(f"ledger missing: {result.ledger.missing[:10]}")
        print(f"ledger doubled: {result.ledger.doubled[:10]}")
    print("\nverdict (issue 50's done criteria):")
    print_verdict(result.verdict)


def print_verdict(verdict: dict[str, tuple[bool | None, str]]) -> None:
    for name, (passed, text) in verdict.items():
        mark = "INFO" if passed is None else "PASS" if passed else "FAIL"
        print(f"  {mark} {name}: {text}")
