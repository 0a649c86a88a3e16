"""The auth store's records: accounts, keys, ledger rows, admissions and usage totals."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Final

from serve_app.auth.ratelimit import Verdict

STATUSES = ("active", "inactive")
PERIODS = ("total", "daily", "monthly")


class Keep:
    """Sentinel for "leave this field as it is" (``None`` already means "unlimited")."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP: Final = Keep()


class StoreError(Exception):
    """An operator-level problem: unknown account, duplicate name, bad value."""


@dataclass(frozen=True)
class Account:
    id: int
    name: str
    status: str  # "active" | "inactive"
    models: tuple[str, ...] | None  # None: every model
    rpm: int | None  # requests per minute; None: unlimited
    tpm: int | None  # tokens per minute; None: unlimited
    quota_tokens: int | None  # token budget per quota period; None: unlimited
    quota_period: str  # "total" | "daily" | "monthly" (UTC calendar periods)
    tokens_used: int  # charged in ``usage_period``
    usage_period: str  # the period key ``tokens_used`` belongs to
    created_at: float

    @property
    def active(self) -> bool:
        return self.status == "active"

    def tokens_used_at(self, now: float) -> int:
        """Tokens charged in the quota period containing ``now`` (0 once a period rolls over)."""
        return self.tokens_used if self.usage_period == period_key(self.quota_period, now) else 0

    def quota_remaining(self, now: float) -> int | None:
        if self.quota_tokens is None:
            return None
        return self.quota_tokens - self.tokens_used_at(now)


@dataclass(frozen=True)
class ApiKey:
    id: int
    account_id: int
    key_hash: str
    hint: str  # "sk-sa-...abcd": safe to show
    created_at: float
    revoked_at: float | None
    last_used_at: float | None

    @property
    def revoked(self) -> bool:
        return self.revoked_at is not None


@dataclass(frozen=True)
class Usage:
    """What one request cost, as its caller reports it (picklable: the router and the model
    deployments send it to the auth deployment). ``request_id`` names the request (the
    router's ``RequestContext.request_id``): the ledger keeps one row per id, the first
    written. ``delivered``: the counts are what reached the client of a stream whose replica
    died (the router's row), so they cap a row the replica wrote first, which may count
    tokens that died with it on their way to the router."""

    model: str | None
    endpoint: str
    input_tokens: int
    output_tokens: int
    status: int
    request_id: str | None = None
    delivered: bool = False

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


@dataclass(frozen=True, kw_only=True)
class UsageRecord(Usage):
    """One ledger row: a request's ``Usage`` and who paid for it, when. The fields it adds
    are keyword-only (``Usage``'s come first, positionally)."""

    account_id: int
    key_id: int | None
    created_at: float
    id: int | None = None


@dataclass(frozen=True)
class Admission:
    """The outcome of ``admit``. ``refused``: None (admitted), "quota", "rate" or
    "concurrency"; ``verdict``: the window check (None when the account has no rate limit)."""

    refused: str | None
    reservation_id: int | None
    verdict: Verdict | None
    quota_used: int = 0


@dataclass(frozen=True)
class UsageTotal:
    model: str | None
    endpoint: str
    requests: int
    input_tokens: int
    output_tokens: int


def period_key(period: str, now: float) -> str:
    """Which quota period ``now`` falls in: usage charged under another key no longer counts."""
    if period == "monthly":
        return time.strftime("%Y-%m", time.gmtime(now))
    if period == "daily":
        return time.strftime("%Y-%m-%d", time.gmtime(now))
    return "total"


def is_limit(value: Any) -> bool:
    return value is None or (type(value) is int and value >= 0)


def check_account_fields(**fields: Any) -> dict[str, Any]:
    """Validate account columns (only those given) and encode them for storage."""
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if name == "name" and not (isinstance(value, str) and value.strip()):
            raise StoreError("account name must be a non-empty string")
        if name == "status" and value not in STATUSES:
            raise StoreError(f"status must be one of {STATUSES}, not {value!r}")
        if name == "quota_period" and value not in PERIODS:
            raise StoreError(f"quota period must be one of {PERIODS}, not {value!r}")
        if name in ("rpm", "tpm", "quota_tokens") and not is_limit(value):
            raise StoreError(f"{name} must be a non-negative integer or None, not {value!r}")
        if name == "models" and value is not None:
            if isinstance(value, str) or not all(isinstance(m, str) and m for m in value):
                raise StoreError("models must be a list of model ids or None (all)")
            value = json.dumps(sorted(set(value)))
        out[name] = value
    return out
