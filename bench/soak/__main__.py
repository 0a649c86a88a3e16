"""``python -m bench.soak``: see the package's docstring."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import bench.soak as soak_package
from bench.common import cpu_flags
from bench.soak import BROKE, LIMITED
from bench.soak.calls import Call
from bench.soak.graph import soak_graph
from bench.soak.kills import kill_each, kill_verdict, print_kills
from bench.soak.ledger import ledger_rows
from bench.soak.run import print_soak, print_verdict, run_soak


def dump(path: Path, calls: list[Call], db: str) -> None:
    """Every call and every ledger row of the run, as JSON, to look into a failed check."""
    import dataclasses

    names = sorted({c.account for c in calls} | {BROKE, LIMITED})
    rows = {
        name: [dataclasses.asdict(row) for row in account_rows]
        for name, account_rows in ledger_rows(db, names).items()
    }
    path.write_text(json.dumps({"calls": [dataclasses.asdict(c) for c in calls], "rows": rows}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.soak", description=soak_package.__doc__.splitlines()[0]
    )
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--sample-s", type=float, default=60.0, help="one table row per interval")
    parser.add_argument("--warmup", type=int, default=2, help="intervals before the baseline")
    parser.add_argument("--tiny", action="store_true", help="the tiny random model")
    parser.add_argument("--kill", action="store_true", help="kill -9 each deployment in turn")
    parser.add_argument("--dump", type=Path, help="write every call and ledger row here (JSON)")
    parser.add_argument(
        "--outage", choices=("sqlite", "postgres"), help="take the auth store away under load"
    )
    parser.add_argument("--down", type=float, default=60.0, help="seconds the store is away")
    args = parser.parse_args(argv)
    print(
        f"bench.soak {' '.join(sys.argv[1:])}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print(f"CPU: {cpu_flags()}; load {os.getloadavg()} (shared box: timings are noisy)")
    if args.outage:
        return outage(args)
    with (
        tempfile.TemporaryDirectory(prefix="bench-soak-") as folder,
        soak_graph(Path(folder), args.tiny, args.kill) as started,
    ):
        print(f"graph up: {started['url']}, model {started['model']}", flush=True)
        if args.kill:
            phases, calls = kill_each(started, args.tiny)
            if args.dump:
                dump(args.dump, calls, started["db"])
            print_kills(phases)
            verdict = kill_verdict(phases, calls)
            print_verdict(verdict)
        else:
            result = run_soak(started, args.minutes, args.sample_s, args.warmup, args.tiny)
            if args.dump:
                dump(args.dump, result.calls, started["db"])
            print_soak(result)
            verdict = result.verdict
    print(f"load at the end {os.getloadavg()}")
    return 0 if all(passed is not False for passed, _ in verdict.values()) else 1


def outage(args: argparse.Namespace) -> int:
    """``--outage``: the store away for ``--down`` seconds under the soak's traffic."""
    from bench.soak.outage import SqliteHeld, store_outage
    from tests.conftest import ThrowawayPostgres, new_postgres_schema

    server = ThrowawayPostgres() if args.outage == "postgres" else None
    dsn = new_postgres_schema(server.url) if server else None
    try:
        with (
            tempfile.TemporaryDirectory(prefix="bench-soak-") as folder,
            soak_graph(Path(folder), args.tiny, False, auth_db=dsn) as started,
        ):
            print(f"graph up: {started['url']}, model {started['model']}", flush=True)
            store = server or SqliteHeld(started["db"])
            result = store_outage(started, store, args.outage, down_s=args.down, tiny=args.tiny)
            if args.dump:
                dump(args.dump, result.calls, started["db"])
            verdict = result.verdict()
    finally:
        if server:
            server.remove()
    print_verdict(verdict)
    return 0 if all(passed is not False for passed, _ in verdict.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
