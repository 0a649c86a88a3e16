"""The apply benchmark's cases (bench/apply.py runs them): files nobody here wrote, and
edits generated from each.

Files: the Python standard library of the running interpreter, JavaScript shipped inside
installed packages (the venv's, then node's own npm) and C/C++ shipped inside installed packages
(markupsafe's and websockets' C speedups, torch's c10 headers): per language, the first files
(by path) with enough functions in each size bucket (<= 50, <= 200, <= 500 lines).

Edits, generated from each file: change a body (the whole new function between markers), insert
a function after another, delete a function, add a helper and call it, add a function and export
it at the end (the file's last line changed, no marker after), rename a function and its calls,
several chunks at once, and an edit with no anchors (a function added at the end, or a header
line at the start). Except where said, the update is the diff to the expected file as a client
would send it: each change with unchanged lines around it (at least one that says something),
``... existing code ...`` markers between.
"""

from __future__ import annotations

import difflib
import re
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BUCKETS = (50, 200, 500)
MARKERS = {
    "py": "# ... existing code ...",
    "js": "// ... existing code ...",
    "c": "// ... existing code ...",
}
MAX_BLOCK_LINES = 40


# --- files and their functions ------------------------------------------------------------


@dataclass(frozen=True)
class Block:
    """A function (or method) of a file: lines ``[start, end)``, its name, its indent."""

    start: int
    end: int
    name: str
    indent: str


_PY_DEF = re.compile(r"(\s*)def (\w+)\(.*:\s*$")
_JS_DEF = re.compile(r"(\s*)(?:async\s+)?function\s*\*?\s*(\w+)\s*\(.*\{\s*$")
_C_DEF = re.compile(
    r"()(?:static\s+|inline\s+|const\s+)*[A-Za-z_][\w\s\*:<>,]*?\b(\w+)\s*\([^;]*\)\s*(?:const\s*)?\{\s*$"
)
_HEADERS = {"py": _PY_DEF, "js": _JS_DEF, "c": _C_DEF}
_NOT_NAMES = {"if", "for", "while", "switch", "catch", "return", "sizeof"}


def blocks_of(lines: list[str], language: str) -> list[Block]:
    found = []
    for start, line in enumerate(lines):
        match = _HEADERS[language].fullmatch(line)
        if not match or match.group(2) in _NOT_NAMES:
            continue
        if language == "py" and start and lines[start - 1].strip().startswith("@"):
            continue
        end = _block_end(lines, start, len(match.group(1)), language)
        if end is not None and 3 <= end - start <= MAX_BLOCK_LINES:
            found.append(Block(start, end, match.group(2), match.group(1)))
    return found


def _block_end(lines: list[str], start: int, depth: int, language: str) -> int | None:
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > depth):
        end += 1
    if language == "py":
        while end > start + 1 and not lines[end - 1].strip():
            end -= 1
        return end
    if end < len(lines) and _indent(lines[end]) == depth and lines[end].strip().startswith("}"):
        return end + 1
    return None


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def candidate_files(language: str) -> list[Path]:
    site = Path(sysconfig.get_paths()["purelib"])
    if language == "py":
        return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    if language == "js":
        return sorted(site.rglob("*.js")) + sorted(Path("/usr/lib/node_modules").rglob("*.js"))
    c_files = [site / "markupsafe/_speedups.c", site / "websockets/speedups.c"]
    return [f for f in c_files if f.exists()] + sorted(
        (site / "torch/include/c10/util").glob("*.h")
    )


def pick_files(language: str, per_bucket: int) -> list[tuple[Path, list[str]]]:
    """The first files (by path) of each size bucket with at least three usable functions."""
    picked: dict[int, list[tuple[Path, list[str]]]] = {bucket: [] for bucket in BUCKETS}
    for path in candidate_files(language):
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        lines = text.splitlines()
        if "\t" in text or ".min." in path.name or not lines:
            continue
        bucket = next((b for b in BUCKETS if len(lines) <= b), None)
        if bucket is None or len(picked[bucket]) >= per_bucket:
            continue
        if len({b.name for b in blocks_of(lines, language)}) >= 3:
            picked[bucket].append((path, lines))
        if all(len(files) >= per_bucket for files in picked.values()):
            break
    return [file for bucket in BUCKETS for file in picked[bucket]]


# --- edits --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    kind: str
    language: str
    path: str
    original: str
    update: str
    expected: str

    @property
    def lines(self) -> int:
        return len(self.original.splitlines())


def _statement(language: str, text: str) -> str:
    return text if language == "py" else text + ";"


def _new_function(language: str, name: str, indent: str) -> list[str]:
    inner = indent + "    "
    if language == "py":
        return [f"{indent}def {name}(value):", f"{inner}return value * 2 + 1"]
    if language == "js":
        return [
            f"{indent}function {name}(value) {{",
            f"{inner}return value * 2 + 1;",
            f"{indent}}}",
        ]
    return [
        f"{indent}static int {name}(int value) {{",
        f"{inner}return value * 2 + 1;",
        f"{indent}}}",
    ]


def _gap(lines: list[str], block: Block) -> list[str]:
    """The blank lines that set ``block`` off from what comes before it."""
    run, at = [], block.start - 1
    while at >= 0 and not lines[at].strip():
        run.append("")
        at -= 1
    return run or [""]


def _body_line(lines: list[str], block: Block) -> int | None:
    """A body line worth changing: the first that says something, not a closing brace."""
    for at in range(block.start + 1, block.end):
        text = lines[at].strip()
        if len(text) > 6 and not text.startswith(("}", "#", "//", "/*", "*", '"""', "'''")):
            return at
    return None


def _changed(line: str, language: str, tag: str) -> str:
    comment = "#" if language == "py" else "//"
    return f"{line.rstrip()}  {comment} {tag}"


def edit_change_body(lines, blocks, language):
    block = blocks[0]
    at = _body_line(lines, block)
    if at is None:
        return None
    new = list(lines)
    inner = lines[at][: _indent(lines[at])]
    new[at : at + 1] = [
        inner + _statement(language, "trace_apply_bench()"),
        _changed(lines[at], language, "checked"),
    ]
    body = new[block.start : block.end + 1]
    marker = MARKERS[language]
    update = [marker, *body, marker] if block.end + 1 < len(new) else [marker, *body]
    return new, "\n".join(update)


def edit_insert(lines, blocks, language):
    block = blocks[len(blocks) // 2]
    added = _new_function(language, "apply_bench_inserted", block.indent)
    new = lines[: block.end] + [""] + added + lines[block.end :]
    return new, None


def edit_delete(lines, blocks, language):
    block = blocks[len(blocks) // 2]
    end = block.end
    while end < len(lines) and not lines[end].strip():
        end += 1
    if end >= len(lines):
        return None
    return lines[: block.start] + lines[end:], None


def edit_helper_and_call(lines, blocks, language):
    block = blocks[-1]
    at = _body_line(lines, block)
    if at is None:
        return None
    helper = _new_function(language, "apply_bench_helper", block.indent)
    inner = lines[at][: _indent(lines[at])]
    call = inner + _statement(language, "apply_bench_helper(0)")
    new = (
        lines[: block.start]
        + helper
        + _gap(lines, block)
        + lines[block.start : at]
        + [call]
        + lines[at:]
    )
    return new, None


def edit_export(lines, blocks, language):
    last = max(i for i, line in enumerate(lines) if line.strip())
    if len(lines[last].strip()) < 5:
        return None
    added = _new_function(language, "apply_bench_exported", "")
    new = (
        lines[:last]
        + added
        + [""]
        + [_changed(lines[last], language, "exports apply_bench_exported")]
    )
    new += lines[last + 1 :]
    if lines[last - 1].strip():
        new[last:last] = [""] * _usual_gap(lines)
    update = [
        MARKERS[language],
        *added,
        "",
        _changed(lines[last], language, "exports apply_bench_exported"),
    ]
    return new, "\n".join(update)


def edit_rename(lines, blocks, language):
    text = "\n".join(lines)
    for block in blocks:
        uses = re.findall(rf"\b{re.escape(block.name)}\b", text)
        if 2 <= len(uses) <= 6 and len(block.name) > 3:
            renamed = re.sub(rf"\b{re.escape(block.name)}\b", block.name + "_renamed", text)
            return renamed.splitlines(), None
    return None


def edit_several(lines, blocks, language):
    if len(blocks) < 3:
        return None
    new = list(lines)
    for block in (blocks[-1], blocks[len(blocks) // 2], blocks[0]):  # bottom up: lines stay put
        at = _body_line(new, block)
        if at is None:
            return None
        new[at] = _changed(new[at], language, "reviewed")
    return new, None


def edit_no_anchors(lines, blocks, language):
    """By the file's place in the list: a header line at the start, a function added at the
    end, or one added in the middle between markers (nothing says where: the model's case)."""
    marker = MARKERS[language]
    added = _new_function(language, "apply_bench_appended", "")
    form = len(lines) % 3
    if form == 0:
        header = (
            "# Reviewed by the apply benchmark."
            if language == "py"
            else "// Reviewed by the apply benchmark."
        )
        return [header, *lines], "\n".join([header, marker])
    if form == 1:
        code_end = max(i for i, line in enumerate(lines) if line.strip()) + 1
        new = lines[:code_end] + [""] * _usual_gap(lines) + added + lines[code_end:]
        return new, "\n".join([marker, *added])
    block = next((b for b in blocks if not b.indent), None)
    if block is None:
        return None
    new = lines[: block.end] + [""] * _usual_gap(lines) + added + lines[block.end :]
    return new, "\n".join([marker, *added, marker])


def _usual_gap(lines: list[str]) -> int:
    """As docs/apply.md: a function added at the end is set off like the file's last block."""
    run, gap = 0, 1
    for line in lines:
        if not line.strip():
            run += 1
        else:
            gap, run = (run if run else gap), 0
    return gap


EDITS: dict[str, Callable] = {
    "change body": edit_change_body,
    "insert function": edit_insert,
    "delete function": edit_delete,
    "helper and call": edit_helper_and_call,
    "add and export": edit_export,
    "rename + calls": edit_rename,
    "several chunks": edit_several,
    "no anchors": edit_no_anchors,
}


def diff_update(original: list[str], new: list[str], language: str) -> str:
    """The change as a client writes it: each hunk with unchanged lines around it (two, or
    more until one says something, and until the hunk has a line that occurs once in the file
    and is not a copy of original text), markers between hunks and at cut edges."""
    matcher = difflib.SequenceMatcher(None, original, new, autojunk=False)
    text = "\n".join(original)
    hunks: list[list[int]] = []
    for tag, _, _, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        lo, hi = _context_start(new, j1), _context_end(new, j2)
        for _ in range(4):
            hunk = new[lo:hi]
            if any(original.count(line) == 1 for line in hunk if _says_something(line)) and (
                "\n".join(hunk) not in text
            ):
                break
            lo, hi = max(0, lo - 2), min(len(new), hi + 2)
        if hunks and lo <= hunks[-1][1]:
            hunks[-1][1] = max(hunks[-1][1], hi)
        else:
            hunks.append([lo, hi])
    marker = MARKERS[language]
    out: list[str] = []
    for lo, hi in hunks:
        if lo > 0:
            out.append(marker)
        out += new[lo:hi]
    if hunks and hunks[-1][1] < len(new):
        out.append(marker)
    return "\n".join(out)


def _says_something(line: str) -> bool:
    return len(re.findall(r"\w", line)) >= 3


def _context_start(lines: list[str], at: int) -> int:
    lo = max(0, at - 2)
    while lo > 0 and at - lo < 6 and not any(_says_something(line) for line in lines[lo:at]):
        lo -= 1
    return lo


def _context_end(lines: list[str], at: int) -> int:
    hi = min(len(lines), at + 2)
    while (
        hi < len(lines) and hi - at < 6 and not any(_says_something(line) for line in lines[at:hi])
    ):
        hi += 1
    return hi


def build_cases(per_bucket: int) -> list[Case]:
    cases = []
    for language in ("py", "js", "c"):
        for path, lines in pick_files(language, per_bucket):
            blocks = blocks_of(lines, language)
            for kind, edit in EDITS.items():
                made = edit(lines, blocks, language)
                if made is None:
                    continue
                new, update = made
                update = update if update is not None else diff_update(lines, new, language)
                cases.append(
                    Case(kind, language, str(path), "\n".join(lines), update, "\n".join(new))
                )
    return cases
