"""Mine next-edit training examples from the commit history of public repositories.

    python -m training.mine --out data/next_edit --mirrors /work/.mirror
    python -m training.mine --out data/next_edit DIR=owner/name [DIR=owner/name ...]

Each repository is a git directory (a bare mirror is enough). Only repositories whose licence
files are all permissive (MIT, Apache-2.0, BSD, ISC, Unlicense) are mined; a repository that
evaluations held out from this project use, or that bench/next_edit's cases come from, is
refused by name. For each commit (no merges, newest first) and each source file it changes,
``training.edits`` gives the edit examples and, for every ``NO_CHANGE_EVERY``-th file, one
no-change example. Examples are deduplicated on what the model sees and must answer.

Written to ``--out``: ``train.jsonl`` and ``validation.jsonl`` (one example a line, each with
its repository, commit and path) and ``manifest.json`` (the data's version, the repositories
with their HEAD, licence, split and counts, and the share of no-change examples). The
validation split holds whole repositories: per language with at least two repositories, the
one whose name hashes lowest (or those ``--validation`` names), so no validation repository
appears in a training example. The data is an artefact: it stays out of git, and this command
makes it again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from training.edits import EditExample, edit_examples, language_of, no_change_example

# Evaluations held out from this project use these (../shared/data/README.md: the HumanEval
# sources too, and the sets built from HumanEval); bench/next_edit's cases come from these.
NEVER_MINED = (
    "pallets/flask",
    "hashicorp/terraform",
    "tree-sitter/tree-sitter",
    "microsoft/vscode",
    "zed-industries/",
    "openai/human-eval",
    "openai/human-eval-infilling",
    "nuprl/multipl-e",
    "bigcode-project/bigcode-evaluation-harness",
    "pallets/itsdangerous",
    "sindresorhus/ky",
    "spf13/cobra",
    "dtolnay/anyhow",
    # bench.tools' function-calling cases (BFCL).
    "shishirpatil/gorilla",
)
PERMISSIVE = {
    "MIT": ("permission is hereby granted, free of charge",),
    "Apache-2.0": ("apache license", "version 2.0"),
    "BSD": ("redistribution and use in source and binary forms",),
    "ISC": ("permission to use, copy, modify, and/or distribute this software",),
    "Unlicense": ("this is free and unencumbered software released into the public domain",),
}
COPYLEFT = ("gnu general public license", "gnu lesser general public license", "mozilla public")
LICENCE_FILE = re.compile(r"^(licen[cs]e|copying|unlicense)([-._].*)?$", re.IGNORECASE)
MAX_FILE_LINES = 3000
MAX_BLOB_BYTES = 256 * 1024
MAX_EXAMPLES_PER_COMMIT = 3
NO_CHANGE_EVERY = 4  # files of a commit between two no-change examples, across the repository


class Repository:
    """A git directory read through one ``git cat-file --batch`` process."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cat = subprocess.Popen(
            ["git", "-C", str(path), "cat-file", "--batch"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )

    def close(self) -> None:
        if self._cat.stdin:
            self._cat.stdin.close()
        self._cat.wait()

    def git(self, *args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(self.path), *args], capture_output=True, text=True, check=True
        ).stdout

    def commits(self, limit: int) -> list[str]:
        return self.git("log", "--no-merges", f"-{limit}", "--format=%H", "HEAD").split()

    def changes(self, commit: str) -> list[tuple[str, str, str]]:
        """(path, old blob, new blob) of each file ``commit`` modifies (not adds or deletes)."""
        out = self.git("diff-tree", "-r", "--no-commit-id", "--no-renames", f"{commit}^", commit)
        found = []
        for line in out.splitlines():
            meta, _, path = line.partition("\t")
            fields = meta.split()
            if len(fields) == 5 and fields[4] == "M":
                found.append((path, fields[2], fields[3]))
        return found

    def text(self, ref: str) -> str | None:
        """A blob (or ``commit:path``) as UTF-8 text; None if absent, binary or too large."""
        assert self._cat.stdin is not None and self._cat.stdout is not None
        self._cat.stdin.write(ref.encode() + b"\n")
        self._cat.stdin.flush()
        header = self._cat.stdout.readline().split()
        if len(header) < 3:  # "<ref> missing"
            return None
        data = self._cat.stdout.read(int(header[2]) + 1)[:-1]
        if len(data) > MAX_BLOB_BYTES or b"\0" in data:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return None

    def licences(self) -> list[str]:
        """The licence of each licence file at HEAD: a PERMISSIVE key, "copyleft" or "?"."""
        names = self.git("ls-tree", "--name-only", "HEAD").split("\n")
        found = []
        for name in filter(LICENCE_FILE.match, names):
            text = " ".join((self.text(f"HEAD:{name}") or "").lower().split())
            found.append(classify_licence(text))
        return found


def classify_licence(text: str) -> str:
    """A PERMISSIVE key when every marker of that licence is in ``text`` (lower case, spaces
    collapsed), "copyleft" for the GPL family or the MPL, else "?" (a file that only points at
    the others, as ripgrep's COPYING or packaging's LICENSE do)."""
    if any(marker in text for marker in COPYLEFT):
        return "copyleft"
    for name, markers in PERMISSIVE.items():
        if all(marker in text for marker in markers):
            return name
    return "?"


def refused(name: str, licences: list[str]) -> str | None:
    """Why ``name`` may not be mined, or None: it must have a permissive licence file and no
    copyleft one."""
    lowered = name.lower()  # GitHub's names are case-insensitive
    if any(
        lowered == banned or (banned.endswith("/") and lowered.startswith(banned))
        for banned in NEVER_MINED
    ):
        return "held out from this project"
    if "copyleft" in licences or not any(licence in PERMISSIVE for licence in licences):
        return f"licence files read as {licences or 'none'}"
    return None


@dataclass
class Mined:
    name: str
    head: str
    licence: str
    examples: list[EditExample] = field(default_factory=list)

    @property
    def language(self) -> str:
        counts = Counter(example.language for example in self.examples)
        return counts.most_common(1)[0][0] if counts else "?"


def mine_repository(path: Path, name: str, max_commits: int, limit: int) -> Mined | str:
    """The examples of one repository, or why it was refused."""
    repo = Repository(path)
    try:
        try:
            licences = repo.licences()
        except subprocess.CalledProcessError:
            return f"{path} is not a git directory with a HEAD"
        reason = refused(name, licences)
        if reason:
            return reason
        permissive = sorted({licence for licence in licences if licence in PERMISSIVE})
        mined = Mined(name, repo.git("rev-parse", "HEAD").strip(), "+".join(permissive))
        files_seen = 0
        for commit in repo.commits(max_commits):
            if len(mined.examples) >= limit:
                break
            edits, quiet, files_seen = commit_examples(repo, name, commit, files_seen)
            mined.examples += edits[:MAX_EXAMPLES_PER_COMMIT] + quiet
        return mined
    finally:
        repo.close()


def commit_examples(
    repo: Repository, name: str, commit: str, files_seen: int
) -> tuple[list[EditExample], list[EditExample], int]:
    """The edit and no-change examples of one commit; ``files_seen``: source files read
    so far in this repository (every ``NO_CHANGE_EVERY``-th gives a no-change example)."""
    try:
        changes = repo.changes(commit)
    except subprocess.CalledProcessError:
        return [], [], files_seen  # the root commit
    sources = [change for change in changes if language_of(change[0])]
    edits: list[EditExample] = []
    quiet: list[EditExample] = []
    for index, (path, old_blob, new_blob) in enumerate(sources):
        old, new = repo.text(old_blob), repo.text(new_blob)
        if old is None or new is None or old.count("\n") > MAX_FILE_LINES:
            continue
        snippets = _snippet(repo, sources[:index] + sources[index + 1 :])
        old_lines, new_lines = old.split("\n"), new.split("\n")
        edits += edit_examples(name, commit, path, old_lines, new_lines, snippets)
        files_seen += 1
        if files_seen % NO_CHANGE_EVERY == 0:
            example = no_change_example(name, commit, path, old_lines, new_lines, snippets)
            quiet += [example] if example else []
    return edits, quiet, files_seen


def _snippet(repo: Repository, others: list[tuple[str, str, str]]) -> list[tuple[str, str]]:
    """The start of another file the commit changes, as the commit left it: what the user
    looked at while making it (Continue's recently viewed snippets)."""
    for path, _, new_blob in others[:1]:
        text = repo.text(new_blob)
        if text is not None:
            return [(path, "\n".join(text.split("\n")[:8]))]
    return []


def key_of(example: EditExample) -> str:
    """What the model sees and must answer: two examples alike here are one."""
    seen = json.dumps([example.hunks, example.file, example.cursor, example.expected])
    return hashlib.sha256(seen.encode()).hexdigest()


def validation_repositories(mined: list[Mined], named: list[str]) -> set[str]:
    if named:
        return set(named)
    by_language: dict[str, list[str]] = {}
    for repo in mined:
        by_language.setdefault(repo.language, []).append(repo.name)
    return {
        min(names, key=lambda name: hashlib.sha256(name.encode()).hexdigest())
        for names in by_language.values()
        if len(names) >= 2
    }


def write(out: Path, mined: list[Mined], validation: set[str]) -> dict:
    """Deduplicate, split by repository, write the files; returns the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    seen: set[str] = set()
    splits: dict[str, list[str]] = {"train": [], "validation": []}
    repos = {}
    for repo in mined:
        split = "validation" if repo.name in validation else "train"
        kept = Counter()
        for example in repo.examples:
            key = key_of(example)
            if key in seen:
                continue
            seen.add(key)
            kept[example.kind] += 1
            splits[split].append(json.dumps(asdict(example)))
        repos[repo.name] = {
            "head": repo.head,
            "licence": repo.licence,
            "language": repo.language,
            "split": split,
            "edit": kept["edit"],
            "no_change": kept["no_change"],
        }
    digest = hashlib.sha256()
    for split, lines in splits.items():
        text = "".join(line + "\n" for line in lines)
        (out / f"{split}.jsonl").write_text(text)
        digest.update(text.encode())
    total = sum(len(lines) for lines in splits.values())
    no_change = sum(repo["no_change"] for repo in repos.values())
    manifest = {
        "version": digest.hexdigest()[:16],
        "examples": {split: len(lines) for split, lines in splits.items()},
        "no_change_share": round(no_change / total, 3) if total else 0.0,
        "languages": sorted({repo["language"] for repo in repos.values()}),
        "repositories": repos,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def repository_specs(args: argparse.Namespace) -> list[tuple[Path, str]]:
    specs = []
    for spec in args.repos:
        directory, _, name = spec.partition("=")
        if not name:
            raise SystemExit(f"{spec}: name each repository as GIT_DIR=owner/name")
        specs.append((Path(directory), name))
    if args.mirrors:  # the fetch tool's layout: owner+name/repo
        for folder in sorted(Path(args.mirrors).glob("*+*/repo")):
            specs.append((folder, folder.parent.name.replace("+", "/", 1)))
    return specs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repos", nargs="*", help="GIT_DIR=owner/name")
    parser.add_argument("--mirrors", help="a folder of owner+name/repo git directories")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-commits", type=int, default=3000, help="per repository")
    parser.add_argument("--per-repo", type=int, default=600, help="examples per repository")
    parser.add_argument("--validation", default="", help="owner/name,... (default: see above)")
    args = parser.parse_args(argv)
    specs = repository_specs(args)
    if not specs:
        parser.error("no repositories: name GIT_DIR=owner/name pairs or --mirrors")
    mined: list[Mined] = []
    started = time.monotonic()
    for path, name in specs:
        result = mine_repository(path, name, args.max_commits, args.per_repo)
        if isinstance(result, str):
            print(f"{name}: refused ({result})", file=sys.stderr, flush=True)
            continue
        kinds = Counter(example.kind for example in result.examples)
        print(
            f"{name}: {kinds['edit']} edits, {kinds['no_change']} no-change "
            f"({result.language}, {result.licence}) {time.monotonic() - started:.0f} s",
            file=sys.stderr,
            flush=True,
        )
        mined.append(result)
    named = [name for name in args.validation.split(",") if name]
    manifest = write(args.out, mined, validation_repositories(mined, named))
    print(json.dumps({key: manifest[key] for key in ("version", "examples", "no_change_share")}))


if __name__ == "__main__":
    main()
