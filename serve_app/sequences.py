"""Comparing sequences of token ids or characters: the one longest-common-prefix search the
prefix cache, the draft model and next-edit's reading of typed text share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def common_prefix_len(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Longest common prefix length (of token ids or strings): binary search on slices."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
