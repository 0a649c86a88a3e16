"""The quota and rate-window counters in SQL: what admission charges, settling adjusts and a
refund gives back. Each function runs inside the caller's transaction, through its
``execute`` (the dialect's respelling of the shared SQL, bound to that transaction)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from serve_app.auth.ratelimit import KEEP_SECONDS, Bucket
from serve_app.auth.records import StoreError, period_key

# (sql, params) -> cursor, inside one transaction.
Execute = Callable[[str, Sequence[Any]], Any]

_UPSERT_WINDOW = (
    "INSERT INTO rate_windows (account_id, bucket, requests, tokens) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (account_id, bucket) DO UPDATE SET "
    "requests = rate_windows.requests + excluded.requests, "
    "tokens = rate_windows.tokens + excluded.tokens"
)


def count_request(execute: Execute, account_id: int, bucket: int, tokens: int) -> None:
    """One request, and its estimated tokens, in the window bucket it was admitted in."""
    execute(_UPSERT_WINDOW, (account_id, bucket, 1, tokens))


def add_to_window(execute: Execute, account_id: int, bucket: int, tokens: int, now: float) -> None:
    """Adjust a token bucket, unless it is already too old to count in any window."""
    if tokens and bucket > now - KEEP_SECONDS:
        execute(_UPSERT_WINDOW, (account_id, bucket, 0, tokens))


def add_to_quota(
    execute: Execute, account_id: int, period: str, tokens: int, *, only_if_current: bool = False
) -> int:
    """Add ``tokens`` (may be negative) to the quota counter of ``period``, restarting the
    counter when the account's stored period is another one."""
    if only_if_current:  # a refund for a period that has rolled over refunds nothing
        rows = execute(
            "UPDATE accounts SET tokens_used = tokens_used + ? "
            "WHERE id = ? AND usage_period = ? RETURNING tokens_used",
            (tokens, account_id, period),
        ).fetchall()
        return rows[0][0] if rows else 0
    return execute(
        "UPDATE accounts SET tokens_used = CASE WHEN usage_period = ? "
        "THEN tokens_used + ? ELSE ? END, usage_period = ? "
        "WHERE id = ? RETURNING tokens_used",
        (period, tokens, tokens, period, account_id),
    ).fetchall()[0][0]


def quota_used(execute: Execute, account_id: int, now: float) -> int:
    """The tokens charged to the account in the quota period of ``now``."""
    row = execute(
        "SELECT quota_period, tokens_used, usage_period FROM accounts WHERE id = ?",
        (account_id,),
    ).fetchone()
    if row is None:
        raise StoreError(f"no account with id {account_id}")
    period, used, used_period = row
    return used if used_period == period_key(period, now) else 0


def window_buckets(execute: Execute, account_id: int, now: float) -> list[Bucket]:
    rows = execute(
        "SELECT bucket, requests, tokens FROM rate_windows WHERE account_id = ? AND bucket > ?",
        (account_id, now - KEEP_SECONDS),
    ).fetchall()
    return [Bucket(*row) for row in rows]


def prune_windows(execute: Execute, account_id: int, now: float) -> None:
    execute(
        "DELETE FROM rate_windows WHERE account_id = ? AND bucket <= ?",
        (account_id, now - KEEP_SECONDS),
    )
