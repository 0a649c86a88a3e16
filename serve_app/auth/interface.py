"""``AuthStore``: the interface every auth store (SQLite, PostgreSQL) implements."""

from __future__ import annotations

import abc
import time
from collections.abc import Sequence
from typing import Any

from serve_app.auth.records import (
    KEEP,
    Account,
    Admission,
    ApiKey,
    Keep,
    UsageRecord,
    UsageTotal,
    check_account_fields,
)


class AuthStore(abc.ABC):
    """Repository of accounts, keys, the usage ledger and rate windows.

    Implementations must make ``take_request`` and ``record_usage`` atomic across every
    process that shares the store: that is what makes limits hold across replicas.
    """

    # Accounts: the public calls check their fields once, here; a store implements the
    # ``_insert_account`` and ``_update_account`` hooks with fields already checked and encoded.
    def create_account(
        self,
        name: str,
        *,
        models: Sequence[str] | None = None,
        rpm: int | None = None,
        tpm: int | None = None,
        quota_tokens: int | None = None,
        quota_period: str = "total",
        status: str = "active",
        now: float | None = None,
    ) -> Account:
        """A new account (``models=None``: every model; a limit of ``None``: no limit)."""
        fields = check_account_fields(
            name=name,
            status=status,
            models=models,
            rpm=rpm,
            tpm=tpm,
            quota_tokens=quota_tokens,
            quota_period=quota_period,
        )
        fields["created_at"] = time.time() if now is None else now
        return self._insert_account(fields)

    @abc.abstractmethod
    def _insert_account(self, fields: dict[str, Any]) -> Account:
        """Insert the checked columns; ``StoreError`` when the name is taken."""

    @abc.abstractmethod
    def get_account(self, account_id: int) -> Account | None: ...

    @abc.abstractmethod
    def get_account_by_name(self, name: str) -> Account | None: ...

    @abc.abstractmethod
    def list_accounts(self) -> list[Account]: ...

    def update_account(
        self,
        account_id: int,
        *,
        status: str | Keep = KEEP,
        models: Sequence[str] | None | Keep = KEEP,
        rpm: int | None | Keep = KEEP,
        tpm: int | None | Keep = KEEP,
        quota_tokens: int | None | Keep = KEEP,
        quota_period: str | Keep = KEEP,
    ) -> Account:
        """Change the given fields (``KEEP``: leave as is); the account as it is now."""
        changes = {
            "status": status,
            "models": models,
            "rpm": rpm,
            "tpm": tpm,
            "quota_tokens": quota_tokens,
            "quota_period": quota_period,
        }
        fields = check_account_fields(**{k: v for k, v in changes.items() if v is not KEEP})
        return self._update_account(account_id, fields)

    @abc.abstractmethod
    def _update_account(self, account_id: int, fields: dict[str, Any]) -> Account:
        """Set the checked columns (none: no write); ``StoreError`` for an unknown id."""

    @abc.abstractmethod
    def is_empty(self) -> bool:
        """True when no account exists yet (first start)."""

    # Keys
    @abc.abstractmethod
    def add_key(
        self, account_id: int, key_hash: str, hint: str, now: float | None = None
    ) -> ApiKey: ...

    @abc.abstractmethod
    def find_key(self, key_hash: str) -> tuple[ApiKey, Account] | None:
        """The key with this hash and its account, revoked or not, in one consistent read."""

    @abc.abstractmethod
    def list_keys(self, account_id: int | None = None) -> list[ApiKey]: ...

    @abc.abstractmethod
    def revoke_key(self, key_id: int, now: float | None = None) -> bool:
        """Revoke; False when no such key or already revoked."""

    @abc.abstractmethod
    def touch_key(self, key_id: int, now: float, min_interval: float) -> None:
        """Set ``last_used_at`` unless it was set less than ``min_interval`` ago."""

    # Time, admission, rate windows and usage
    @abc.abstractmethod
    def now(self) -> float:
        """The store's clock (epoch seconds): the one every replica's limits are measured on."""

    def admit(
        self,
        account_id: int,
        *,
        estimated_tokens: int,
        max_concurrent: int | None,
        hold_seconds: float | None,
    ) -> Admission:
        """In one transaction: check quota, rate windows and concurrent requests against the
        reservation of ``estimated_tokens``; if everything fits, count the request and hold
        the reservation (charged to quota and token window) for at most ``hold_seconds``.
        ``hold_seconds=None``: a request that costs no tokens (a listing), counted in the
        request window only, with nothing held."""
        estimate = max(0, int(estimated_tokens)) if hold_seconds is not None else 0
        return self._admit(account_id, estimate, max_concurrent, hold_seconds)

    @abc.abstractmethod
    def _admit(
        self, account_id: int, estimate: int, max_concurrent: int | None, hold: float | None
    ) -> Admission:
        """``admit`` with the estimate already clamped (0 when nothing is held)."""

    @abc.abstractmethod
    def record_usage(self, record: UsageRecord, reservation_id: int | None = None) -> int:
        """Append to the ledger and charge the actual tokens in one transaction, settling the
        reservation (charge ``actual - reserved``) when it is still held. ``created_at`` is
        set from the store's clock. A record whose ``request_id`` already has a row is
        dropped and charges nothing (a request is billed once, by its first row), unless it
        is ``delivered`` and counts fewer tokens: then the row is cut to its counts and status
        and the difference refunded. Returns the tokens used in the current quota period."""

    @abc.abstractmethod
    def release(self, reservation_id: int) -> None:
        """Refund a reservation that no ledger row settled (a no-op once settled)."""

    @abc.abstractmethod
    def list_usage(self, account_id: int, limit: int = 100) -> list[UsageRecord]:
        """Newest ledger rows first."""

    @abc.abstractmethod
    def usage_totals(self, account_id: int, since: float | None = None) -> list[UsageTotal]: ...

    def close(self) -> None:  # noqa: B027 - optional hook, most stores need it
        """Release connections."""
