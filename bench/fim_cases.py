"""FIM cases cut from code no one here wrote: Python's standard library and torch's C++ headers.

A case is a file split at the start of one line: the text before it (``prefix``), the line
itself (``line``, what a completion should write first) and the text after it (``suffix``).
Four shapes, because the best prompt layout differs between them (docs/fim.md):

- ``file``: a line of a module with 30 lines before and 10 after (an editor's window);
- ``long``: 150 lines before and 50 after (a long file, most of it context);
- ``function``: a line inside a short function, with only that function around it (the
  shape of public single-line infilling sets such as HumanEval-infilling);
- ``cpp``: ``file``'s window over C++ headers that ship with torch (another language).

``stdlib_lines`` is the speculation benches' workload (bench.fim_speculation,
bench.draft_model): a line of one of six small modules with 40 lines either side.

Lines are drawn with a seeded generator from files sorted by name, so a run is repeatable;
blank lines, comments and lines under 8 characters are skipped (nothing to predict).
"""

from __future__ import annotations

import ast
import random
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class FimCase:
    source: str  # file name and line number, for reading a miss
    prefix: str
    line: str
    suffix: str


SMALL_MODULES = ["textwrap.py", "shlex.py", "fnmatch.py", "glob.py", "bisect.py", "heapq.py"]


def stdlib_lines(count: int, seed: int = 0) -> list[tuple[str, str, str]]:
    """(prefix, suffix, removed line) triples from ``SMALL_MODULES``, seeded."""
    rng = random.Random(seed)
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [(root / name).read_text().splitlines(keepends=True) for name in SMALL_MODULES]
    cases = []
    while len(cases) < count:
        lines = rng.choice(files)
        i = rng.randrange(40, len(lines) - 40)
        if len(lines[i].strip()) < 12 or lines[i].lstrip().startswith("#"):
            continue
        cases.append(("".join(lines[i - 40 : i]), "".join(lines[i + 1 : i + 41]), lines[i]))
    return cases


def stdlib_files() -> list[Path]:
    """Top-level standard-library modules of 300+ lines (no tests, no generated tables)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.glob("*.py")):
        text = path.read_text(errors="replace")
        if text.count("\n") >= 300 and not path.name.startswith(("test", "_")):
            files.append(path)
    return files


def cpp_files() -> list[Path]:
    root = Path(torch.__file__).parent / "include" / "c10" / "util"
    return [p for p in sorted(root.glob("*.h")) if p.read_text(errors="replace").count("\n") > 120]


def _predictable(line: str, comment: str) -> bool:
    stripped = line.strip()
    return len(stripped) >= 8 and not stripped.startswith(comment)


def window_cases(
    files: list[Path], count: int, before: int, after: int, seed: int, comment: str = "#"
) -> list[FimCase]:
    rng = random.Random(seed)
    texts = [(p.name, p.read_text(errors="replace").splitlines(keepends=True)) for p in files]
    texts = [(name, lines) for name, lines in texts if len(lines) > before + after + 1]
    cases: list[FimCase] = []
    while len(cases) < count:
        name, lines = rng.choice(texts)
        i = rng.randrange(before, len(lines) - after)
        if not _predictable(lines[i], comment):
            continue
        cases.append(
            FimCase(
                f"{name}:{i + 1}",
                "".join(lines[i - before : i]),
                lines[i].rstrip("\n"),
                "".join(lines[i + 1 : i + 1 + after]),
            )
        )
    return cases


def function_cases(files: list[Path], count: int, seed: int) -> list[FimCase]:
    """The first line of a statement inside a function of 4-15 lines (not its docstring),
    with only that function as context."""
    rng = random.Random(seed)
    candidates: list[tuple[str, list[str], int]] = []
    for path in files:
        source = path.read_text(errors="replace")
        lines = source.splitlines(keepends=True)
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not node.end_lineno:
                continue
            body = lines[node.lineno - 1 : node.end_lineno]
            if not 4 <= len(body) <= 15:
                continue
            starts = {
                stmt.lineno - node.lineno
                for stmt in ast.walk(node)
                if isinstance(stmt, ast.stmt) and stmt is not node and not _is_docstring(stmt)
            }
            for i in sorted(starts):
                if 0 < i < len(body) and _predictable(body[i], "#"):
                    candidates.append((f"{path.name}:{node.lineno + i}", body, i))
    picked = rng.sample(candidates, min(count, len(candidates)))
    return [
        FimCase(name, "".join(body[:i]), body[i].rstrip("\n"), "".join(body[i + 1 :]))
        for name, body, i in picked
    ]


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


CASE_SETS: dict[str, Callable[[int, int], list[FimCase]]] = {
    "file": lambda count, seed: window_cases(stdlib_files(), count, 30, 10, seed),
    "long": lambda count, seed: window_cases(stdlib_files(), count, 150, 50, seed),
    "function": lambda count, seed: function_cases(stdlib_files(), count, seed),
    "cpp": lambda count, seed: window_cases(cpp_files(), count, 30, 10, seed, comment="//"),
}
