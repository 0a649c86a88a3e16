"""models.embedded.pieces: a model file cut into pieces that fit a GPU machine's 64 MiB
calls, put together there only if every piece and the whole are the ones sent."""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pytest

from serve_app.models.embedded.pieces import MANIFEST, join_pieces, split_files


def write_pieces(tmp_path: Path, piece_bytes: int) -> tuple[bytes, Path]:
    """Two source files (as the PyPI parts are) cut into pieces, and their manifest."""
    rng = random.Random(0)
    parts = [bytes(rng.randrange(256) for _ in range(n)) for n in (1000, 537)]
    sources = []
    for index, data in enumerate(parts):
        sources.append(tmp_path / f"part{index}")
        sources[-1].write_bytes(data)
    out = tmp_path / "out"
    out.mkdir()
    pieces = split_files(sources, out, piece_bytes)
    whole = b"".join(parts)
    manifest = {"file": "model.gguf", "sha256": hashlib.sha256(whole).hexdigest()}
    (out / MANIFEST).write_text(json.dumps(manifest | {"pieces": pieces}))
    return whole, out


def test_pieces_cross_the_parts_boundaries_and_join_to_the_whole(tmp_path: Path) -> None:
    whole, out = write_pieces(tmp_path, 300)
    names = sorted(p.name for p in out.glob("piece-*"))
    assert names == [f"piece-0{i}" for i in range(1, 7)]
    assert [len((out / n).read_bytes()) for n in names] == [300] * 5 + [37]
    assert join_pieces(out).read_bytes() == whole


def test_a_piece_that_changed_on_the_way_is_named(tmp_path: Path) -> None:
    _, out = write_pieces(tmp_path, 300)
    damaged = bytearray((out / "piece-03").read_bytes())
    damaged[7] ^= 1
    (out / "piece-03").write_bytes(bytes(damaged))
    with pytest.raises(ValueError, match="piece-03"):
        join_pieces(out)


def test_the_whole_file_must_be_the_published_one(tmp_path: Path) -> None:
    _, out = write_pieces(tmp_path, 300)
    manifest = json.loads((out / MANIFEST).read_text())
    (out / MANIFEST).write_text(json.dumps(manifest | {"sha256": "0" * 64}))
    with pytest.raises(ValueError, match="published"):
        join_pieces(out)
    assert not (out / "model.gguf").exists()
