"""Train next-edit adapters on a lent GPU machine (the ``device`` tool): what travels there,
what runs there, and what comes back.

Such a machine takes at most 64 MiB a call (the working tree included), reaches no package
index, has torch, transformers and peft but neither pydantic nor ray, and keeps what a command
left outside the tree only while it stays warm (30 s idle). So the embedded model's GGUF goes
in pieces (``models.embedded.pieces``), each run's pairs go encoded (``train --encode-only``,
so the machine needs neither the tokenizer's time nor the 47 MB of examples), and the runs
share the one GPU side by side, each ending by a deadline (``train --minutes``)::

    # here: pieces, pairs and the runs' arguments under .gpu; then the gguf wheel that
    # transformers reads the GGUF's tokenizer with
    python -m training.lease pack --out .gpu \\
        --run "span --style chat_span" --run "split --style chat_split --change-weight 4"
    python -m pip download --no-deps --only-binary=:all: -d .gpu/whl gguf==0.19.0
    # there: one call a piece (carry .gpu/piece-NN), each moving it out of the tree
    mkdir -p /tmp/pieces && mv .gpu/piece-NN /tmp/pieces/
    # and the last call, carrying the last piece and the rest of .gpu (not the pieces sent):
    python3 -m training.lease train --pack .gpu --pieces /tmp/pieces --seconds 560
    # here again: each run's exported adapter and log, from the files that came back
    python -m training.lease unpack FILES_AT --out data/adapters

Each run's adapter comes back exported (``training.export``: bf16, its base and record beside
it) in a tar cut into files of 15 MiB, under what a call brings back (16 MiB a file).
"""

from __future__ import annotations

import argparse
import io
import json
import lzma
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from training.train import PAIRS_FILE

RUNS_FILE = "runs.json"
# What every run on the GPU shares; a run's own arguments come after and win.
GPU_ARGUMENTS = [
    "--max-tokens", "2048", "--eval-examples", "64", "--batch", "32", "--micro", "8",
    "--eval-every", "40", "--save-every", "20", "--warmup", "10", "--steps", "5000",
]  # fmt: skip
BACK_BYTES = 15 << 20  # a file a call brings back holds at most 16 MiB
MARGIN_SECONDS = 45  # after the runs' deadline: exports, tars, the call's own end


# --- here, before ---------------------------------------------------------------------------


def pack(out: Path, data: Path, runs: dict[str, list[str]], piece_bytes: int) -> None:
    """The model's pieces, the data's manifest, and each run's encoded pairs (xz) under ``out``."""
    from serve_app.models.embedded.pieces import split_model
    from training import train

    out.mkdir(parents=True, exist_ok=True)
    manifest = split_model(out, piece_bytes)
    log(f"{len(manifest['pieces'])} pieces of {manifest['file']} in {out}")
    (out / "data").mkdir(exist_ok=True)
    shutil.copy(data / "manifest.json", out / "data" / "manifest.json")
    for name, arguments in runs.items():
        folder = out / name
        train.main([*GPU_ARGUMENTS, *arguments, "--data", str(data), "--out", str(folder),
                    "--encode-only"])  # fmt: skip
        with open(folder / PAIRS_FILE, "rb") as source, lzma.open(xz(folder), "wb") as target:
            shutil.copyfileobj(source, target)
        (folder / PAIRS_FILE).unlink()  # 30 MB that must not travel by mistake
    (out / RUNS_FILE).write_text(json.dumps(runs, indent=1) + "\n")


def xz(folder: Path) -> Path:
    return folder / (PAIRS_FILE + ".xz")


# --- there ------------------------------------------------------------------------------------


def train_there(pack_dir: Path, pieces: Path, seconds: float, out: Path, work: Path) -> None:
    """Install the model from ``pieces``, train ``pack_dir``'s runs side by side until
    ``seconds`` after the start (less a margin), and leave each run's exported adapter in
    ``out`` as tar pieces, with its log."""
    started = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    install_wheels(pack_dir / "whl", work / "site")
    from serve_app.models.embedded import install_gguf
    from serve_app.models.embedded.pieces import MANIFEST, join_pieces

    shutil.copy(pack_dir / MANIFEST, pieces / MANIFEST)
    gguf = join_pieces(pieces)
    model = json.loads((pieces / MANIFEST).read_text())["model"]
    log(f"{install_gguf(model, gguf)} installed in {time.monotonic() - started:.0f}s")
    minutes = (seconds - (time.monotonic() - started) - MARGIN_SECONDS) / 60
    runs = json.loads((pack_dir / RUNS_FILE).read_text())
    log(f"{len(runs)} runs for {minutes:.2f} minutes")
    running = {}
    for name, arguments in runs.items():
        folder = work / name
        folder.mkdir(parents=True, exist_ok=True)
        with lzma.open(xz(pack_dir / name)) as source, open(folder / PAIRS_FILE, "wb") as target:
            shutil.copyfileobj(source, target)
        command = [sys.executable, "-m", "training.train", *GPU_ARGUMENTS, *arguments,
                   "--data", str(pack_dir / "data"), "--out", str(folder),
                   "--minutes", f"{minutes:.2f}", "--device", "cuda"]  # fmt: skip
        log(shlex.join(command))
        with open(out / f"{name}.log", "wb") as output:
            running[name] = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT)
    for name, process in running.items():
        log(f"{name}: exit {process.wait()}")
        if (work / name / "adapter").exists():
            send_back(work / name, name, out)


def install_wheels(wheels: Path, site: Path) -> None:
    """The carried wheels (none there: no index) into ``site``, ahead on this process's path
    and its children's, before anything imports transformers (which looks for gguf once)."""
    if not wheels.is_dir():
        return
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    subprocess.run([*pip, "--target", str(site), *map(str, wheels.glob("*.whl"))], check=True)
    sys.path.insert(0, str(site))
    paths = [str(site), os.getcwd(), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(path for path in paths if path)


def send_back(trained: Path, name: str, out: Path, piece_bytes: int = BACK_BYTES) -> list[Path]:
    """``trained`` exported, as a tar in files of at most ``piece_bytes``: ``NAME.tar.00``..."""
    from training.export import export

    exported = export(trained, trained.with_name(name + "-export"))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(exported, arcname=name)
    data = buffer.getvalue()
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for index, start in enumerate(range(0, len(data), piece_bytes)):
        files.append(out / f"{name}.tar.{index:02d}")
        files[-1].write_bytes(data[start : start + piece_bytes])
    return files


# --- here, after ------------------------------------------------------------------------------


def unpack(files_at: Path, out: Path) -> list[Path]:
    """Each run's adapter put together from the tar pieces in ``files_at``, into ``out``."""
    names = sorted({path.name.split(".tar.")[0] for path in files_at.glob("*.tar.*")})
    adapters = []
    for name in names:
        data = b"".join(path.read_bytes() for path in sorted(files_at.glob(f"{name}.tar.*")))
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(out, filter="data")
        adapters.append(out / name)
        if (files_at / f"{name}.log").exists():
            shutil.copy(files_at / f"{name}.log", out / name / "train.log")
    return adapters


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    packing = verbs.add_parser("pack", help="here: what travels")
    packing.add_argument("--out", type=Path, default=Path(".gpu"))
    packing.add_argument("--data", type=Path, default=Path("data/next_edit"))
    packing.add_argument(
        "--run",
        action="append",
        required=True,
        help='"NAME TRAIN_ARGUMENTS...", e.g. "a --lr 1e-4"',
    )
    packing.add_argument("--piece-mb", type=int, default=53)
    there = verbs.add_parser("train", help="there: install the model, train, send back")
    there.add_argument("--pack", type=Path, default=Path(".gpu"))
    there.add_argument("--pieces", type=Path, required=True)
    there.add_argument("--seconds", type=float, required=True, help="the whole command's time")
    there.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")))
    there.add_argument("--work", type=Path, default=Path("/tmp/lease"))
    back = verbs.add_parser("unpack", help="here: the adapters that came back")
    back.add_argument("files_at", type=Path)
    back.add_argument("--out", type=Path, default=Path("data/adapters"))
    args = parser.parse_args(argv)
    if args.verb == "pack":
        runs = {name: rest for name, *rest in map(shlex.split, args.run)}
        pack(args.out, args.data, runs, args.piece_mb << 20)
    elif args.verb == "train":
        train_there(args.pack, args.pieces, args.seconds, args.out, args.work)
    else:
        for adapter in unpack(args.files_at, args.out):
            print(adapter)


if __name__ == "__main__":
    main()
