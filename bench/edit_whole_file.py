"""Next-edit on a whole file, as Continue, Kilo Code and ProxyAI send it, against an excerpt.

    PYTHONPATH=$PWD .venv/bin/python -m bench.edit_whole_file [--files 8] [--config FILE]

Continue and Kilo send the whole file with every next-edit request (clients.md); Zed sends an
excerpt. The service shows the model a window of lines around the region either way
(``prompts/edit/window.py``), so a request's cold cost should not grow with the file. Each case
is a place in a standard-library module (``bench.fim_cases.stdlib_files``, spread over their
sizes; code not written here): the cursor at the start of a line's code, the region that line
and the 5 after it (Continue's default), no history. The same request is sent twice, in
Continue's layout, each in its own prefix-cache partition: with the whole file, and with the
file cut to 20 lines either side of the region by the client (the baseline, an excerpt as Zed
sends). Both go to the real ``EditService`` on ``--config``'s edit model in this process.

Printed per case: the file's lines and tokens (what the model read of the whole file before
the window), the prompt tokens read and the seconds of each request; then p50 of each and the
whole / excerpt ratio (1.00x: a whole file costs what an excerpt does).
"""

from __future__ import annotations

import argparse
import asyncio
import random
from pathlib import Path
from typing import Any

from bench.common import cpu_flags, percentile, table
from bench.fim_cases import stdlib_files
from bench.next_edit import answer, app_config
from tests.fixtures.edit_clients import Scenario, continue_call, continue_extract

EXCERPT_LINES = 20  # the baseline's excerpt: lines either side of the region, as Zed's cases
REGION_AFTER = 5  # Continue's region: the cursor line and the 5 after it


def places(count: int, seed: int) -> list[Scenario]:
    """One place in each of ``count`` modules spread evenly over the modules' sizes."""
    rng = random.Random(seed)
    files = sorted(stdlib_files(), key=lambda path: path.read_text(errors="replace").count("\n"))
    step = max(1, len(files) // count)
    scenarios = []
    for path in files[::step][:count]:
        lines = path.read_text(errors="replace").split("\n")
        code = [n for n in range(len(lines) // 4, 3 * len(lines) // 4) if lines[n].strip()]
        row = rng.choice(code)
        column = len(lines[row]) - len(lines[row].lstrip())
        last = min(row + REGION_AFTER, len(lines) - 1)
        scenarios.append(Scenario(path.name, "\n".join(lines), (row, column), row, last, (), ()))
    return scenarios


def excerpt_of(scenario: Scenario) -> Scenario:
    """The scenario with its file cut to ``EXCERPT_LINES`` lines either side of the region."""
    low = max(0, scenario.first_line - EXCERPT_LINES)
    high = scenario.last_line + 1 + EXCERPT_LINES
    row, column = scenario.cursor
    return Scenario(
        scenario.path,
        "\n".join(scenario.lines[low:high]),
        (row - low, column),
        scenario.first_line - low,
        scenario.last_line - low,
        (),
        (),
    )


async def run(args: argparse.Namespace) -> list[list[str]]:
    from serve_app.engine.engine import LLMEngine
    from serve_app.serving.edit import EditService
    from serve_app.serving.engine_client import EngineClient

    config = app_config(args)
    config = config.model_copy(update={"engine": config.engine.model_copy(update={"seed": 0})})
    model = config.model(config.roles.edit)
    engine = LLMEngine.from_config(config, "edit", model=model)
    service = EditService(EngineClient(engine, model))
    tokenizer = engine.loaded.tokenizer
    header = ["module", "lines", "file tokens", "whole: read", "whole s", "excerpt: read"]
    rows, seconds = [[*header, "excerpt s"]], {"whole": [], "excerpt": []}
    try:
        for scenario in places(args.files, args.seed):
            row = [scenario.path, str(len(scenario.lines))]
            row.append(str(len(tokenizer.encode(scenario.file))))
            for name, shown in (("whole", scenario), ("excerpt", excerpt_of(scenario))):
                call = continue_call(shown, model.id)
                _, took, (prompt, cached, _) = await answer(
                    service, call, {}, continue_extract, name, model.id
                )
                seconds[name].append(took)
                row += [str(prompt - cached), f"{took:.2f}"]
            rows.append(row)
            print(" ".join(row), flush=True)
    finally:
        engine.shutdown()
    whole, excerpt = (percentile(seconds[name], 50) for name in ("whole", "excerpt"))
    rows.append(["p50", "", "", "", f"{whole:.2f}", "", f"{excerpt:.2f}"])
    rows.append(["whole / excerpt", "", "", "", f"{whole / excerpt:.2f}x", "", ""])
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--config", type=Path, default=Path("configs/local.yaml"))
    parser.add_argument("--source", help="with --config: the edit model's weights from here")
    args: Any = parser.parse_args(argv)
    print(f"CPU: {cpu_flags()}")
    print(table(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
