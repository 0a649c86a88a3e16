"""The runner's ``madvise`` and ``malloc_trim`` calls, no-ops where missing (not Linux, not
glibc, older kernels). Tried and left out: 2 MB pages for fbgemm's packed weights
(``MADV_HUGEPAGE`` + ``MADV_COLLAPSE``). The packs live mostly in the heap; collapsed there,
one-row decode steps gained little, 8-row steps nothing, and prompt chunks lost a little: the
mark spreads to where the heap grows, and faulting huge pages in for a chunk's temporaries
waits on compaction (as ``glibc.malloc.hugetlb=1`` did for all of them).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import mmap
from collections.abc import Callable, Iterable

import torch

logger = logging.getLogger(__name__)

MADV_PAGEOUT = 21  # Linux 5.4+


def page_out(tensors: Iterable[torch.Tensor]) -> None:
    """Ask the kernel to reclaim the resident pages of ``tensors`` (``MADV_PAGEOUT``): for the
    mapped model file, what a first start read to quantize and will not read again (the
    1.5B's dense weights otherwise stayed in RSS and PSS until memory ran short); a later read
    faults them back. It never loses data: written (anonymous) pages need swap to be paged
    out and stay where there is none, and pages another process maps are skipped."""
    madvise = _madvise()
    if madvise is None:
        return
    for t in tensors:
        start = _round_up(t.data_ptr(), mmap.PAGESIZE)
        end = _round_down(t.data_ptr() + t.numel() * t.element_size(), mmap.PAGESIZE)
        if end > start:
            madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_PAGEOUT)


def return_freed_memory() -> None:
    """Hand the heap's free pages back to the OS (glibc's ``malloc_trim``).

    glibc serves blocks below its mmap threshold from the heap, and the threshold rises to the
    largest mmapped block freed: after a grown cache is dropped the next growth comes from the
    heap and stays resident when freed (hundreds of MB in a FIM replica after long prompts).
    A fixed low threshold (``MALLOC_MMAP_THRESHOLD_``) avoided that but made every large
    temporary of a prompt chunk a fresh mapping, slowing prompts markedly. So the heap keeps
    its adaptive threshold and is trimmed whenever the engine goes idle (even a short request
    leaves freed temporaries there).
    """
    trim = _libc_function("malloc_trim")
    if trim is not None:
        trim(0)


def _madvise() -> Callable[..., int] | None:
    madvise = _libc_function("madvise")
    if madvise is not None:
        madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return madvise


@functools.cache
def _libc_function(name: str) -> Callable[..., int] | None:
    try:
        return getattr(ctypes.CDLL(None), name)
    except (AttributeError, OSError):
        logger.debug("no %s in this C library: its memory advice is skipped", name)
        return None


def _round_up(address: int, size: int) -> int:
    return -(-address // size) * size


def _round_down(address: int, size: int) -> int:
    return address // size * size
