"""Extract next-edit cases from public projects' commits, mechanically (bench/next_edit.py).

    python -m bench.next_edit_cases --out ../shared/data/next_edit_cases.json \\
        /work/.mirror/pallets+itsdangerous/repo=pallets/itsdangerous ...

For each commit (no merges, newest first) and each source file it changes, the change is split
into hunks (line-level change blocks, blocks one line apart merged). A file with at least two
hunks gives one case: the hunks before the first one that lies near the one before it (within
``NEAR`` lines) are the edit history, in the order they appear in the file; that hunk is the
expected edit; the file with the history applied is the current file. The editable region is
the expected hunk's old lines with ``CONTEXT`` lines either side, the cursor at the start of
the first changed line's code (where the user would be about to type). Recently viewed
snippets are the first hunk of another file of the same commit, after the commit.

Nothing is chosen by hand: the filters below (sizes, whitespace-only changes) are the only
selection, and every case names its repository and commit.
"""

from __future__ import annotations

import argparse
import difflib
import json
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

LANGUAGES = {".py": "python", ".ts": "typescript", ".js": "javascript", ".go": "go", ".rs": "rust"}
NEAR = 40  # lines between the last history hunk and the expected one
CONTEXT = 2  # unchanged lines either side of the expected change in the region
MAX_FILE_LINES = 700
MAX_CHANGE_LINES = 8  # old or new lines of the expected hunk
MAX_HISTORY_LINES = 30  # lines of one history hunk, old plus new
MAX_HISTORY = 3  # hunks (Continue sends up to 6 diffs; 3 keeps a CPU run short)
WINDOW = 20  # lines of the file kept either side of the region (an excerpt, as Zed sends)


@dataclass(frozen=True)
class Hunk:
    """Lines [a_start, a_end) of the old file become lines [b_start, b_end) of the new one."""

    a_start: int
    a_end: int
    b_start: int
    b_end: int


@dataclass
class Case:
    repo: str
    commit: str
    path: str
    language: str
    file: str  # the current file (history applied), an excerpt around the region
    first_line: int  # the editable region, 0-based inclusive line numbers in ``file``
    last_line: int
    cursor: tuple[int, int]  # (line, column) in ``file``
    expected: str  # the region after the expected edit
    hunks: list[str]  # the history, oldest first, unified hunks with 3 lines of context
    snippets: list[tuple[str, str]]  # (path, code) of recently viewed code


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout


def show(repo: Path, commit: str, path: str) -> str | None:
    try:
        return git(repo, "show", f"{commit}:{path}")
    except (subprocess.CalledProcessError, UnicodeDecodeError):
        return None


def hunks_of(old: list[str], new: list[str]) -> list[Hunk]:
    """Change blocks of a line diff, blocks separated by at most one unchanged line merged."""
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    hunks: list[Hunk] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        if hunks and i1 - hunks[-1].a_end <= 1:
            last = hunks.pop()
            hunks.append(Hunk(last.a_start, i2, last.b_start, j2))
        else:
            hunks.append(Hunk(i1, i2, j1, j2))
    return hunks


def applied(old: list[str], new: list[str], hunk: Hunk) -> list[str]:
    """``old`` with every hunk up to and including ``hunk`` applied (hunks are in order)."""
    return new[: hunk.b_end] + old[hunk.a_end :]


def unified_hunk(before: list[str], after: list[str]) -> str:
    """The one-hunk unified diff body (from ``@@``) between two versions of a file."""
    lines = list(difflib.unified_diff(before, after, lineterm="", n=3))
    return "\n".join(lines[2:])


def is_trivial(lines: list[str]) -> bool:
    return not "".join(lines).strip()


def case_for(
    repo_name: str, commit: str, path: str, old: list[str], new: list[str], others: list
) -> Case | None:
    hunks = hunks_of(old, new)
    for index in range(1, len(hunks)):
        target = hunks[index]
        if target.a_start - hunks[index - 1].a_end > NEAR:
            continue
        old_part, new_part = old[target.a_start : target.a_end], new[target.b_start : target.b_end]
        if max(len(old_part), len(new_part)) > MAX_CHANGE_LINES:
            continue
        if "".join(old_part).split() == "".join(new_part).split():
            continue  # whitespace only: nothing a model could be judged on
        history = hunks[max(0, index - MAX_HISTORY) : index]
        if any((h.a_end - h.a_start) + (h.b_end - h.b_start) > MAX_HISTORY_LINES for h in history):
            continue
        return build_case(repo_name, commit, path, old, new, hunks[:index], target, others)
    return None


def build_case(
    repo_name: str,
    commit: str,
    path: str,
    old: list[str],
    new: list[str],
    done: list[Hunk],
    target: Hunk,
    others: list,
) -> Case | None:
    versions = [old] + [applied(old, new, hunk) for hunk in done]
    hunks = [unified_hunk(a, b) for a, b in zip(versions, versions[1:], strict=False)]
    current = versions[-1]
    shift = done[-1].b_end - done[-1].a_end  # where the target's old lines sit in ``current``
    start, end = target.a_start + shift, target.a_end + shift
    first = max(0, start - CONTEXT)
    last = min(len(current), end + CONTEXT) - 1
    if last < first:
        return None
    region_new = current[first:start] + new[target.b_start : target.b_end] + current[end : last + 1]
    changed = current[start] if start < len(current) else ""
    cursor_line = start if start <= last else last
    column = len(changed) - len(changed.lstrip()) if start <= last else 0
    low = max(0, first - WINDOW)
    high = min(len(current), last + 1 + WINDOW)
    excerpt = current[low:high]
    return Case(
        repo=repo_name,
        commit=commit,
        path=path,
        language=LANGUAGES[Path(path).suffix],
        file="\n".join(excerpt) + "\n",
        first_line=first - low,
        last_line=last - low,
        cursor=(cursor_line - low, column),
        expected="\n".join(region_new),
        hunks=hunks[-MAX_HISTORY:],
        snippets=others,
    )


def snippets_of(repo: Path, commit: str, paths: list[str]) -> list[tuple[str, str]]:
    """The first changed lines of another file, as they are after the commit, with 3 lines
    either side: what the user looked at while making the commit."""
    found = []
    for path in paths[:1]:
        old, new = show(repo, f"{commit}^", path), show(repo, commit, path)
        if old is None or new is None:
            continue
        new_lines = new.split("\n")
        hunks = hunks_of(old.split("\n"), new_lines)
        if hunks:
            start = max(0, hunks[0].b_start - 3)
            found.append((path, "\n".join(new_lines[start : hunks[0].b_end + 3])))
    return found


def cases_from(repo: Path, name: str, limit: int, max_commits: int) -> list[Case]:
    cases: list[Case] = []
    commits = git(repo, "log", "--no-merges", f"-{max_commits}", "--format=%H").split()
    for commit in commits:
        if len(cases) >= limit:
            break
        try:
            changed = git(repo, "diff", "--name-only", f"{commit}^", commit).split()
        except subprocess.CalledProcessError:
            continue  # the root commit
        sources = [p for p in changed if Path(p).suffix in LANGUAGES]
        for path in sources:
            old, new = show(repo, f"{commit}^", path), show(repo, commit, path)
            if old is None or new is None or len(old.split("\n")) > MAX_FILE_LINES:
                continue
            others = snippets_of(repo, commit, [p for p in sources if p != path])
            case = case_for(name, commit, path, old.split("\n"), new.split("\n"), others)
            if case is not None:
                cases.append(case)
                break  # one case per commit: many commits, not one big one
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repos", nargs="+", help="MIRROR_DIR=owner/name")
    parser.add_argument("--out", required=True)
    parser.add_argument("--per-repo", type=int, default=14)
    parser.add_argument("--max-commits", type=int, default=400)
    args = parser.parse_args()
    cases: list[Case] = []
    for spec in args.repos:
        directory, name = spec.split("=")
        found = cases_from(Path(directory), name, args.per_repo, args.max_commits)
        print(f"{name}: {len(found)} cases")
        cases.extend(found)
    Path(args.out).write_text(json.dumps([asdict(case) for case in cases], indent=0) + "\n")
    print(f"{len(cases)} cases -> {args.out}")


if __name__ == "__main__":
    main()
