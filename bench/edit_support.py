"""A logged ``bench.next_edit`` run's figures split by whether the prompt shows the edit:
cases whose expected edit writes text the file excerpt, the history and the snippets already
hold (``training.edits.context_support`` at least ``--at``), and the rest, which no editor
state foretells and no next-edit model can be expected to get exactly.

    PYTHONPATH=$PWD .venv/bin/python -m bench.edit_support --from-log RUN.jsonl [--at 0.8]

Each variant of the log is tallied once per part, as ``bench.next_edit`` tallies it whole.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench import next_edit
from bench.common import table
from training.edits import context_support


def parts(log: list[dict], cases: dict[str, next_edit.Case], at: float) -> dict[str, list]:
    """The log's entries by part: the case's support at least ``at``, or below it."""
    shown = {
        name: context_support(case.scenario, case.expected) >= at for name, case in cases.items()
    }
    split: dict[str, list] = {f"shown (support >= {at})": [], f"not shown (< {at})": []}
    labels = list(split)
    for entry in log:
        split[labels[0] if shown[entry["case"]] else labels[1]].append(entry)
    return split


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from-log", type=Path, required=True, help="bench.next_edit --log")
    parser.add_argument("--data", type=Path, default=next_edit.CASES)
    parser.add_argument("--at", type=float, default=0.8)
    args = parser.parse_args(argv)
    log = [json.loads(line) for line in args.from_log.read_text().splitlines()]
    cases = {case.name: case for case in next_edit.load_cases(args.data, None)}
    for label, entries in parts(log, cases, args.at).items():
        variants = {entry["variant"] for entry in entries}
        print(f"\n{label}: {len(entries) // max(1, len(variants))} cases")
        print(table(next_edit.rows(next_edit.tallies_of(entries, cases))))


if __name__ == "__main__":
    main()
