"""What next-edit's answer checks say of the right answers: the expected edits themselves, in
every cursor placement the bench uses, no model loaded. Each refusal here is a right answer
the service would turn into "no change".

    python -m bench.next_edit_checks                                  # the bench's 40 cases
    python -m bench.next_edit_checks --data data/next_edit/validation.jsonl --kind edit
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from bench.next_edit import CASES, SHAPES, load_cases
from serve_app.prompts.next_edit import parse_edit_prompt, rejected_edit

CURSORS = ("as-cut", "line-end", "mid-line", "region-start")


def expected_checks(data: Path, kind: str, cursor: str) -> Counter:
    """``rejected_edit`` on each case's expected edit, as its client's request would show it."""
    tally: Counter = Counter()
    for case in load_cases(data, None, 1, kind, cursor):
        build, _ = SHAPES[case.shape]
        call = build(case.scenario, "model")
        prompt = parse_edit_prompt(call.body["messages"][0]["content"])
        tally[rejected_edit(case.expected, prompt) or "kept"] += 1
    return tally


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=CASES)
    parser.add_argument("--kind", default="edit", choices=["all", "edit", "no_change"])
    args = parser.parse_args(argv)
    for cursor in CURSORS:
        tally = expected_checks(args.data, args.kind, cursor)
        kept = tally.pop("kept", 0)
        print(f"{args.data.name}, cursor {cursor}: {kept} of {kept + sum(tally.values())} kept"
              f"; refused {dict(tally.most_common()) or 'none'}")  # fmt: skip


if __name__ == "__main__":
    main()
