"""Extract next-edit cases from public projects' commits, mechanically (bench/next_edit.py).

    python -m bench.next_edit_cases --out ../shared/data/next_edit_cases.json \\
        /work/.mirror/pallets+itsdangerous/repo=pallets/itsdangerous ...

For each commit (no merges, newest first), the first source file whose change gives an edit
example (``training.edits``, which the training data's miner shares) gives the case:
one case per commit. Recently viewed snippets are the first hunk of another file of the same
commit, after the commit.

Nothing is chosen by hand: the filters below (sizes, whitespace-only changes) are the only
selection, and every case names its repository and commit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from dataclasses import asdict
from pathlib import Path

from training.edits import EditExample, edit_examples, hunks_of

# The five languages of the cases, and their files' size: a CPU run stays short.
LANGUAGES = (".py", ".ts", ".js", ".go", ".rs")
MAX_FILE_LINES = 700


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout


def show(repo: Path, commit: str, path: str) -> str | None:
    try:
        return git(repo, "show", f"{commit}:{path}")
    except (subprocess.CalledProcessError, UnicodeDecodeError):
        return None


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


def cases_from(repo: Path, name: str, limit: int, max_commits: int) -> list[EditExample]:
    cases: list[EditExample] = []
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
            found = edit_examples(name, commit, path, old.split("\n"), new.split("\n"), others)
            if found:
                cases.append(found[0])
                break  # one case per commit: many commits, not one big one
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repos", nargs="+", help="MIRROR_DIR=owner/name")
    parser.add_argument("--out", required=True)
    parser.add_argument("--per-repo", type=int, default=14)
    parser.add_argument("--max-commits", type=int, default=400)
    args = parser.parse_args()
    cases: list[EditExample] = []
    for spec in args.repos:
        directory, name = spec.split("=")
        found = cases_from(Path(directory), name, args.per_repo, args.max_commits)
        print(f"{name}: {len(found)} cases")
        cases.extend(found)
    Path(args.out).write_text(json.dumps([asdict(case) for case in cases], indent=0) + "\n")
    print(f"{len(cases)} cases -> {args.out}")


if __name__ == "__main__":
    main()
