"""Sliding one-minute windows over small time buckets: pure arithmetic, no storage.

Every store keeps, per account, one row per ``BUCKET_SECONDS`` bucket with the requests
admitted and the tokens recorded in it (``rate_windows``). The usage "in the last minute"
at time ``t`` is the sum of the buckets inside ``(t - 60, t]``, with the one bucket that
straddles the window's start weighted by the share of it still inside (events are assumed
spread evenly over a bucket). That is the sliding-window-counter scheme: O(1) rows per
account (13), no 2x burst at a minute boundary as with fixed windows, and an exact
``Retry-After`` to within a second given the buckets.

The stores call ``evaluate`` inside the transaction that reads the buckets, so the decision
and the increment are atomic across processes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

WINDOW_SECONDS = 60
BUCKET_SECONDS = 5
# Rows older than this can no longer contribute to any window: stores delete them.
KEEP_SECONDS = WINDOW_SECONDS + 2 * BUCKET_SECONDS


@dataclass(frozen=True)
class Bucket:
    start: int  # epoch seconds, a multiple of BUCKET_SECONDS
    requests: int
    tokens: int


@dataclass(frozen=True)
class Verdict:
    """The outcome of one check; header values are for the state *after* admitting it."""

    allowed: bool
    retry_after: int  # whole seconds, >= 1 when not allowed, else 0
    request_headers: dict[str, str]
    token_headers: dict[str, str]
    exceeded: tuple[str, ...] = ()  # "requests" and/or "tokens"
    too_large: bool = False  # the request alone exceeds the TPM limit

    @property
    def headers(self) -> dict[str, str]:
        return {**self.request_headers, **self.token_headers}


def bucket_start(now: float) -> int:
    return int(now // BUCKET_SECONDS) * BUCKET_SECONDS


def usage_at(buckets: Iterable[Bucket], at: float, field: str) -> float:
    """Requests or tokens (``field``) counted in the window ending at ``at``."""
    window_start = at - WINDOW_SECONDS
    total = 0.0
    for bucket in buckets:
        end = bucket.start + BUCKET_SECONDS
        if end <= window_start:
            continue
        share = 1.0 if bucket.start >= window_start else (end - window_start) / BUCKET_SECONDS
        total += getattr(bucket, field) * share
    return total


def seconds_until_fits(buckets: list[Bucket], now: float, field: str, need: int, limit: int) -> int:
    """Whole seconds until ``need`` more fits under ``limit`` if nothing else happens."""
    horizon = WINDOW_SECONDS + BUCKET_SECONDS + 1
    for wait in range(1, horizon + 1):
        if not _over(usage_at(buckets, now + wait, field), need, limit):
            return wait
    return horizon


def seconds_until_reset(buckets: list[Bucket], now: float) -> float:
    """Time until the window is empty again: the newest bucket has slid out."""
    if not buckets:
        return 0.0
    newest_end = max(b.start for b in buckets) + BUCKET_SECONDS
    return max(0.0, newest_end + WINDOW_SECONDS - now)


def format_duration(seconds: float) -> str:
    """OpenAI's ``x-ratelimit-reset-*`` style: ``"0s"``, ``"17s"``, ``"1m5s"``."""
    whole = math.ceil(seconds)
    minutes, rest = divmod(whole, 60)
    return f"{minutes}m{rest}s" if minutes else f"{rest}s"


def evaluate(
    buckets: list[Bucket],
    now: float,
    *,
    rpm: int | None,
    tpm: int | None,
    estimated_tokens: int,
) -> Verdict:
    """Decide one request. Requests count when admitted; tokens when recorded afterwards.

    A request needs one request slot and ``max(estimated_tokens, 1)`` tokens of headroom, so
    a window already at its token limit refuses even requests that estimate nothing.
    """
    waits: list[int] = []
    exceeded: list[str] = []
    too_large = False
    requests_used = usage_at(buckets, now, "requests")
    tokens_used = usage_at(buckets, now, "tokens")
    if rpm is not None and _over(requests_used, 1, rpm):
        waits.append(seconds_until_fits(buckets, now, "requests", 1, rpm))
        exceeded.append("requests")
    need = max(estimated_tokens, 1)
    if tpm is not None and _over(tokens_used, need, tpm):
        too_large = need > tpm
        waits.append(seconds_until_fits(buckets, now, "tokens", min(need, tpm), tpm))
        exceeded.append("tokens")
    allowed = not waits
    # An admitted request lands in the current bucket, which then sets the reset time.
    counted = [*buckets, Bucket(bucket_start(now), 1, 0)] if allowed else buckets
    reset = format_duration(seconds_until_reset(counted, now))
    request_headers: dict[str, str] = {}
    token_headers: dict[str, str] = {}
    if rpm is not None:
        request_headers = _headers("requests", rpm, rpm - requests_used - allowed, reset)
    if tpm is not None:
        token_headers = _headers("tokens", tpm, tpm - tokens_used, reset)
    retry_after = max(waits, default=0)
    return Verdict(allowed, retry_after, request_headers, token_headers, tuple(exceeded), too_large)


def _over(used: float, need: int, limit: int) -> bool:
    """``used + need > limit``, tolerant of the float error in the weighted shares."""
    return used + need > limit + 1e-9


def _headers(kind: str, limit: int, remaining: float, reset: str) -> dict[str, str]:
    remaining = max(0, math.floor(remaining + 1e-9))
    return {
        f"x-ratelimit-limit-{kind}": str(limit),
        f"x-ratelimit-remaining-{kind}": str(remaining),
        f"x-ratelimit-reset-{kind}": reset,
    }
