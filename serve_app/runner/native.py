"""The runner's C kernels (``kernels/*.c``): built once per machine, loaded through ctypes.

Why C: a CPU decode step is bound by bytes of weights read and per-call overhead, which torch's
CPU kernels for few rows leave on the table (``weights_q4``, ``kernels/attention.c``), as
llama.cpp's hand-written kernels show. The system C compiler (``$CC``, else ``cc``: what a
package with a C extension needs) builds one shared library in the user's cache, named by a
digest of sources and compiler, under a file lock so replicas starting together build it once.
Paths are chosen at run time from the CPU (``isa``), never by compile flags, so the library runs
on any CPU it was built on: AVX512-VNNI, AVX2 (with FMA and F16C), or portable C (``isa`` 0:
any CPU, an ARM laptop included; correct, and what the SIMD paths are tested against, but slower
than torch's kernels, so the runner uses the kernels only where ``unavailable_reason`` is None).
ctypes releases the GIL for a call. Without a compiler ``load`` raises ``KernelUnavailable``.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

logger = logging.getLogger(__name__)

KERNELS = Path(__file__).with_name("kernels")
SOURCES = sorted(KERNELS.glob("*.c"))
HEADERS = sorted(KERNELS.glob("*.h"))  # in the digest: a changed header is a new library
ISA_NAMES = {0: "scalar", 1: "avx2", 2: "avx512-vnni"}
ISA_CAP_VARIABLE = "RUNNER_KERNEL_ISA"
_P, _I64, _INT, _FLOAT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
SIGNATURES = {
    "q4_isa": ([], _INT),
    "q4_matmul": ([_P, _I64, _I64, _P, _I64, _P, _INT, _INT], _INT),
    "q8_matmul": ([_P, _I64, _I64, _P, _I64, _P, _INT, _INT], _INT),
    "attend_one": ([_P, _I64, _I64, _I64, _P, _P, _I64, _I64, _FLOAT, _P], _INT),
}


class KernelUnavailable(RuntimeError):
    """The C kernels cannot run here, or not faster than torch's (no compiler, no AVX2)."""


class Native:
    """The loaded library and the best path this CPU runs (``isa``: 0 portable C, 1 AVX2,
    2 AVX512-VNNI)."""

    def __init__(self, library: ctypes.CDLL, isa: int) -> None:
        self.library = library
        self.isa = isa


def default_build_dir() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(cache, "serve-app", "kernels")


def load(build_dir: str | None = None) -> Native:
    """The library, built into ``build_dir`` on first use; ``KernelUnavailable`` if it can't.
    Its ``isa`` may be 0 (portable C): ``unavailable_reason`` says whether to use it.
    ``$RUNNER_KERNEL_ISA`` (``scalar``, ``avx2``) caps the path, to measure an AVX2-only CPU's
    kernels on an AVX-512 one."""
    native = _load(build_dir or default_build_dir(), os.environ.get("CC", "cc"))
    cap = os.environ.get(ISA_CAP_VARIABLE)
    if cap is None:
        return native
    names = {name: isa for isa, name in ISA_NAMES.items()}
    if cap not in names:
        raise KernelUnavailable(f"${ISA_CAP_VARIABLE}={cap!r}: use one of {sorted(names)}")
    return Native(native.library, min(native.isa, names[cap]))


def library_reason(build_dir: str | None = None) -> str | None:
    """None where the library builds and loads here (any path, portable C included), else why
    not: what the kernels' own tests need, not whether a runner uses them."""
    try:
        load(build_dir)
    except KernelUnavailable as e:
        return str(e)
    return None


def unavailable_reason(build_dir: str | None = None) -> str | None:
    """None where the kernels run here on SIMD (faster than torch's), else why not."""
    reason = library_reason(build_dir)
    if reason is None and load(build_dir).isa == 0:
        return "the CPU lacks AVX2, FMA or F16C: the kernels' portable C path only"
    return reason


@functools.cache
def _load(build_dir: str, compiler: str) -> Native:
    if shutil.which(compiler) is None:
        raise KernelUnavailable(f"no C compiler ({compiler!r}) to build the runner's kernels")
    digest = hashlib.sha256(compiler.encode())
    for source in SOURCES + HEADERS:
        digest.update(source.name.encode() + source.read_bytes())
    path = Path(build_dir) / f"runner-kernels-{digest.hexdigest()[:16]}.so"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f"{path.name}.lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            _build(compiler, path)
    library = ctypes.CDLL(str(path))
    for name, (arguments, result) in SIGNATURES.items():
        function = getattr(library, name)
        function.argtypes, function.restype = arguments, result
    return Native(library, library.q4_isa())


def _build(compiler: str, path: Path) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    command = [
        compiler,
        "-O3",
        "-shared",
        "-fPIC",
        "-pthread",
        "-o",
        str(tmp),
        *map(str, SOURCES),
        "-lm",
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise KernelUnavailable(f"{' '.join(command)} failed: {done.stderr[-2000:]}")
    os.replace(tmp, path)
    logger.info("runner: built its C kernels at %s", path)
