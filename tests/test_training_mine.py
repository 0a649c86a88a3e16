"""The next-edit miner on small repositories built here with git: what it takes, what it
refuses, and the shape, split and provenance of what it writes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from training import mine

MIT = (
    "MIT License\n\nCopyright (c) 2026 Test\n\nPermission is hereby granted, free of charge, "
    "to any person obtaining a copy of this software...\n"
)
GPL = "GNU GENERAL PUBLIC LICENSE\nVersion 3, 29 June 2007\n"

CART_V1 = """\
def total(items):
    return sum(item.price for item in items)


def tax(items):
    return total(items) * 0.2


def receipt(items):
    lines = [item.name for item in items]
    return "\\n".join(lines)
"""
# A rename, then its call site four lines below: two hunks, the second near the first.
CART_V2 = CART_V1.replace("def total(", "def subtotal(").replace(
    "return total(items)", "return subtotal(items)"
)
CART_V3 = CART_V2.replace("[item.name for", "[f'{item.name}: {item.price}' for").replace(
    'return "\\n".join(lines)', 'return "\\n".join(sorted(lines))'
)
MAIN_V1 = """\
package main

func add(a int, b int) int {
\treturn a + b
}

func main() {
\tprintln(add(1, 2))
}
"""
MAIN_V2 = MAIN_V1.replace("func add(", "func sum(").replace("println(add(", "println(sum(")
STATS_V1 = """\
def mean(xs):
    return sum(xs) / len(xs)


def spread(xs):
    middle = mean(xs)
    return max(xs) - middle
"""
STATS_V2 = STATS_V1.replace("def mean(", "def average(").replace("= mean(", "= average(")


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def make_repo(path: Path, licence: str, versions: list[dict[str, str]]) -> Path:
    """A repository whose commits write ``versions`` in turn, after one with the licence."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "t@example.com")
    git(path, "config", "user.name", "t")
    (path / "LICENSE").write_text(licence)
    git(path, "add", "-A")
    git(path, "commit", "-qm", "licence")
    for number, files in enumerate(versions):
        for name, text in files.items():
            (path / name).write_text(text)
        git(path, "add", "-A")
        git(path, "commit", "-qm", f"change {number}")
    return path


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("repos")
    history = [
        {"cart.py": CART_V1, "main.go": MAIN_V1},
        {"cart.py": CART_V2, "main.go": MAIN_V2},
        {"cart.py": CART_V3},
        {"cart.py": CART_V1, "main.go": MAIN_V1},  # back: the same edits reversed
        {"cart.py": CART_V2, "main.go": MAIN_V2},  # and again: the same examples twice
    ]
    return {
        "shop": make_repo(root / "shop", MIT, history),
        "twin": make_repo(root / "twin", MIT, [{"stats.py": STATS_V1}, {"stats.py": STATS_V2}]),
        "gpl": make_repo(root / "gpl", GPL, history),
        "held-out": make_repo(root / "flask", MIT, history),
    }


def run_miner(repos: dict[str, Path], out: Path, *extra: str) -> dict:
    specs = [
        f"{repos['shop']}=acme/shop",
        f"{repos['twin']}=acme/twin",
        f"{repos['gpl']}=acme/gpl",
        f"{repos['held-out']}=pallets/flask",
    ]
    mine.main([*specs, "--out", str(out), *extra])
    return json.loads((out / "manifest.json").read_text())


def examples(out: Path, split: str) -> list[dict]:
    return [json.loads(line) for line in (out / f"{split}.jsonl").read_text().splitlines()]


def test_the_miner_takes_permissive_repositories_only(repos, tmp_path, capsys) -> None:
    manifest = run_miner(repos, tmp_path)
    assert set(manifest["repositories"]) == {"acme/shop", "acme/twin"}
    err = capsys.readouterr().err
    assert "acme/gpl: refused (licence files read as ['copyleft'])" in err
    assert "pallets/flask: refused (held out from this project)" in err
    assert manifest["repositories"]["acme/shop"]["licence"] == "MIT"
    assert mine.refused("Zed-Industries/zed", ["MIT"]) == "held out from this project"
    assert mine.refused("openai/human-eval", ["MIT"]) == "held out from this project"
    assert mine.refused("openai/human-eval-infilling", ["MIT"]) == "held out from this project"
    assert mine.refused("ShishirPatil/gorilla", ["Apache-2.0"]) == "held out from this project"
    # Names are compared lowercased: an entry with a capital would never match.
    assert all(banned == banned.lower() for banned in mine.NEVER_MINED)


def test_examples_have_the_clients_shape_and_their_provenance(repos, tmp_path) -> None:
    run_miner(repos, tmp_path, "--validation", "acme/twin")
    train = examples(tmp_path, "train")
    edits = [e for e in train if e["kind"] == "edit"]
    assert {e["path"] for e in edits} == {"cart.py", "main.go"}
    for example in train:
        assert example["repo"] == "acme/shop" and len(example["commit"]) == 40
        lines = example["file"].split("\n")
        region = "\n".join(lines[example["first_line"] : example["last_line"] + 1])
        assert example["first_line"] <= example["cursor"][0] <= example["last_line"]
        assert all(hunk.startswith("@@ ") for hunk in example["hunks"])
        if example["kind"] == "edit":
            assert example["expected"] != region
        else:
            assert example["expected"] == region
    # The rename is the history; the call site to update is the expected edit.
    rename = next(e for e in edits if "return subtotal(items)" in e["expected"])
    assert "+def subtotal(items):" in rename["hunks"][-1]
    assert "return total(items)" in rename["file"]


def test_the_split_holds_whole_repositories_and_duplicates_go(repos, tmp_path) -> None:
    manifest = run_miner(repos, tmp_path, "--validation", "acme/twin")
    train, validation = examples(tmp_path, "train"), examples(tmp_path, "validation")
    assert {e["repo"] for e in train} == {"acme/shop"}
    assert {e["repo"] for e in validation} == {"acme/twin"}
    assert manifest["repositories"]["acme/twin"]["split"] == "validation"
    assert manifest["examples"]["validation"] == len(validation) > 0
    keys = [json.dumps([e["hunks"], e["file"], e["cursor"], e["expected"]]) for e in train]
    assert len(keys) == len(set(keys))  # the repeated commit added nothing
    counted = manifest["repositories"]["acme/shop"]
    assert counted["edit"] + counted["no_change"] == manifest["examples"]["train"] == len(train)
    assert counted["no_change"] > 0
    quiet = sum(e["kind"] == "no_change" for e in train + validation)
    assert manifest["no_change_share"] == round(quiet / len(train + validation), 3)


def test_the_default_split_keeps_a_repository_per_language_apart(repos, tmp_path) -> None:
    mined = [mine.Mined(name, "0" * 40, "MIT") for name in ("a/one", "b/two", "c/three")]
    for repo, language in zip(mined, ("python", "python", "go"), strict=True):
        repo.examples = [
            mine.EditExample(repo.name, "c", "f", language, "", 0, 0, (0, 0), "", [], [])
        ]
    held = mine.validation_repositories(mined, [])
    assert len(held) == 1 and held <= {"a/one", "b/two"}  # go has one repository: all trained
    assert mine.validation_repositories(mined, ["c/three"]) == {"c/three"}


def test_a_path_that_is_no_repository_is_refused_not_a_traceback(tmp_path, capsys) -> None:
    mine.main([f"{tmp_path / 'nothing'}=a/b", "--out", str(tmp_path / "out")])
    assert "a/b: refused" in capsys.readouterr().err
