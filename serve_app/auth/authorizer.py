"""``Authorizer``: who is calling, may they, and what did it cost. No HTTP, no Ray.

A Ray deployment (or the router) constructs one per replica from a store and an
``AuthConfig`` and calls ``authorize`` before a request and ``record_usage`` after it. All
state that must agree across replicas (keys, account status, rate windows, quota) lives in
the store; the only per-process state is a short-lived cache of key lookups.

Checks run in a fixed order so clients see the most fundamental problem first:
key (401) -> account status and quota (402) -> model (404) -> rate limits and the
concurrency cap (429). Quota, windows and the cap are then checked once more, atomically, in
the store transaction that reserves the request's estimated tokens (``AuthStore.admit``):
``record_usage`` settles that reservation to the actual count, ``release`` refunds it.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from dataclasses import dataclass, field

from serve_app.auth.interface import AuthStore
from serve_app.auth.keys import (
    generate_key,
    hash_key,
    hashes_match,
    is_plausible_key,
    key_hint,
)
from serve_app.auth.ratelimit import Verdict
from serve_app.auth.records import (
    Account,
    ApiKey,
    StoreError,
    Usage,
    UsageRecord,
    period_key,
)
from serve_app.errors import AccountError, AuthenticationError, ModelNotFoundError, RateLimitError

logger = logging.getLogger(__name__)

LOCAL_ACCOUNT = "local"
MISSING_KEY_MESSAGE = (
    "You didn't provide an API key. Pass your key as 'Authorization: Bearer <API_KEY>'."
)


@dataclass(frozen=True)
class AuthConfig:
    """``model_ids``: every model the server serves. ``cache_ttl``: how long (seconds) a
    replica trusts a cached key lookup; it bounds how late a revocation or status change is
    seen, so keep it under 1 s. ``touch_interval``: at most one ``last_used_at`` write per key
    per replica per this many seconds."""

    model_ids: frozenset[str] = frozenset()
    cache_ttl: float = 0.5
    touch_interval: float = 60.0
    # Requests one account may have in flight at once (None: no cap), and how long a
    # reservation is held at most (past the longest request timeout) before it expires.
    max_concurrent: int | None = None
    reservation_ttl: float = 600.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "model_ids", frozenset(self.model_ids))


@dataclass(frozen=True)
class AccountLimits:
    """An account's own limits as a grant carries them (not the server's HTTP limits)."""

    rpm: int | None
    tpm: int | None
    quota_tokens: int | None
    quota_period: str


@dataclass(frozen=True)
class Grant:
    """Permission for one request; pass it back to ``record_usage``. Picklable."""

    account_id: int
    key_id: int
    account_name: str
    limits: AccountLimits
    models: tuple[str, ...] | None  # the account's allow-list; None: every model
    headers: dict[str, str] = field(default_factory=dict)  # x-ratelimit-* for set limits
    reservation_id: int | None = None  # tokens reserved at admission, settled by the ledger


@dataclass(frozen=True)
class _Entry:
    key: ApiKey
    account: Account
    expires: float  # time.monotonic()


class Authorizer:
    """Authorization, rate limiting and usage accounting over an ``AuthStore``."""

    def __init__(self, store: AuthStore, config: AuthConfig | None = None) -> None:
        self.store = store
        self.config = config or AuthConfig()
        self._cache: dict[str, _Entry] = {}
        self._touched: dict[int, float] = {}
        self._lock = threading.Lock()

    # -- public API

    def authorize(
        self,
        api_key: str | None,
        model: str | None,
        endpoint: str,
        estimated_tokens: int = 0,
    ) -> Grant:
        """Admit one request or raise the first applicable typed error.

        ``model=None`` is a listing endpoint: no model check, counted against the request
        window but nothing reserved.
        ``estimated_tokens`` (prompt plus max output) is reserved against the quota and the
        tokens-per-minute window; the grant carries the reservation to ``record_usage``.
        """
        now = self.store.now()
        entry = self._lookup(api_key)
        account = entry.account
        self._check_account(account, now)
        self._check_model(account, model)
        estimated = max(0, int(estimated_tokens))
        verdict, reservation_id = self._admit(account, estimated, hold=model is not None)
        self._touch(entry.key, now)
        logger.debug("authorized account %d key %d for %s", account.id, entry.key.id, endpoint)
        return Grant(
            account_id=account.id,
            key_id=entry.key.id,
            account_name=account.name,
            limits=AccountLimits(
                account.rpm, account.tpm, account.quota_tokens, account.quota_period
            ),
            models=account.models,
            headers=verdict.headers if verdict else {},
            reservation_id=reservation_id,
        )

    def authenticate(self, api_key: str | None) -> None:
        """The checks that need only the key and the cached account: a known, unrevoked key
        (401) of an active account (402). No store write, no clock read: quota and limits
        are ``authorize``'s, once the body says what the request will cost."""
        if not self._lookup(api_key).account.active:
            raise AccountError("This account is inactive. Contact the server operator.")

    def record_usage(self, grant: Grant, usage: Usage) -> None:
        """Append to the ledger and charge quota and TPM window in one store transaction,
        settling the grant's reservation to the actual count.

        Call it for every admitted request, failed ones included (with the tokens actually
        spent, often 0), so the ledger is a complete record. With ``usage.request_id``, a
        second call for the same request is a no-op: the first row stands.
        """
        record = UsageRecord(
            account_id=grant.account_id,
            key_id=grant.key_id,
            model=usage.model,
            endpoint=usage.endpoint,
            input_tokens=max(0, int(usage.input_tokens)),
            output_tokens=max(0, int(usage.output_tokens)),
            status=int(usage.status),
            created_at=0.0,  # the store sets it from its own clock
            request_id=usage.request_id,
            delivered=usage.delivered,
        )
        used = self.store.record_usage(record, grant.reservation_id)
        self._update_cached_usage(grant.account_id, used, self.store.now())

    def release(self, grant: Grant) -> None:
        """Refund the grant's reservation if no ledger row settled it (idempotent)."""
        if grant.reservation_id is not None:
            self.store.release(grant.reservation_id)

    def clear_cache(self) -> None:
        with self._lock:
            self._cache.clear()

    # -- steps of authorize

    def _lookup(self, api_key: str | None) -> _Entry:
        """Key -> (key, account), from the cache when fresh. Raises AuthenticationError."""
        if not api_key:
            raise AuthenticationError(MISSING_KEY_MESSAGE)
        if not is_plausible_key(api_key):
            raise AuthenticationError()
        digest = hash_key(api_key)
        mono = time.monotonic()
        entry = self._cache.get(digest)
        if entry is None or entry.expires <= mono:
            # The store matches on the hash (a unique index), never on key bytes.
            found = self.store.find_key(digest)
            if found is None:
                logger.debug("rejected an unknown API key")
                raise AuthenticationError()
            entry = _Entry(*found, expires=mono + self.config.cache_ttl)
            with self._lock:
                self._cache[digest] = entry
        if not hashes_match(entry.key.key_hash, digest):  # defence in depth; always equal
            raise AuthenticationError()
        if entry.key.revoked:
            logger.debug("rejected revoked key %d", entry.key.id)
            raise AuthenticationError()
        return entry

    @staticmethod
    def _check_account(account: Account, now: float) -> None:
        """The cheap early answer from the cached account: inactive, or quota spent. The
        binding check is ``_admit``'s, which refuses a request whose reservation (prompt +
        max_tokens) does not fit what is left, so concurrent requests cannot overdraw."""
        if not account.active:
            raise AccountError("This account is inactive. Contact the server operator.")
        remaining = account.quota_remaining(now)
        if remaining is not None and remaining <= 0:
            period = "" if account.quota_period == "total" else f" {account.quota_period}"
            raise AccountError(
                f"You exceeded your{period} token quota ({account.quota_tokens} tokens)."
            )

    def _check_model(self, account: Account, model: str | None) -> None:
        """Unknown and not-allowed look the same, so the error reveals nothing extra."""
        if model is None:
            return
        known = model in self.config.model_ids
        if not known or (account.models is not None and model not in account.models):
            raise ModelNotFoundError(model)

    def _admit(
        self, account: Account, estimated: int, *, hold: bool
    ) -> tuple[Verdict | None, int | None]:
        """Reserve ``estimated`` tokens, or raise 402 (quota) / 429 (window or cap).
        ``hold=False`` (listings): only counted against the request window."""
        limited = (account.rpm, account.tpm)
        if hold:
            limited += (account.quota_tokens, self.config.max_concurrent)
        if all(limit is None for limit in limited):
            return None, None  # nothing to count: no store write at all
        admission = self.store.admit(
            account.id,
            estimated_tokens=estimated,
            max_concurrent=self.config.max_concurrent,
            hold_seconds=self.config.reservation_ttl if hold else None,
        )
        if admission.refused == "quota":
            self._update_cached_usage(account.id, admission.quota_used, self.store.now())
            raise AccountError(_quota_message(account, estimated))
        if admission.refused == "concurrency":
            raise RateLimitError(
                f"Too many concurrent requests (limit {self.config.max_concurrent} per "
                "account). Retry when one of them has finished."
            )
        verdict = admission.verdict
        if admission.refused == "rate" and verdict is not None:
            raise RateLimitError(
                _rate_message(account, verdict, estimated),
                headers={"Retry-After": str(verdict.retry_after), **verdict.headers},
            )
        return verdict, admission.reservation_id

    def _touch(self, key: ApiKey, now: float) -> None:
        """Record last use, at most once per ``touch_interval`` per key and replica."""
        last = self._touched.get(key.id, key.last_used_at or -math.inf)
        if now - last < self.config.touch_interval:
            return
        self._touched[key.id] = now
        try:
            self.store.touch_key(key.id, now, self.config.touch_interval)
        except Exception:  # bookkeeping only: never fail a request over it
            logger.warning("could not record last use of key %d", key.id, exc_info=True)

    def _update_cached_usage(self, account_id: int, used: int, at: float) -> None:
        """Let this replica see its own charges at once (others within ``cache_ttl``)."""
        with self._lock:
            for digest, entry in self._cache.items():
                if entry.account.id == account_id:
                    account = dataclasses.replace(
                        entry.account,
                        tokens_used=used,
                        usage_period=period_key(entry.account.quota_period, at),
                    )
                    self._cache[digest] = dataclasses.replace(entry, account=account)


def _quota_message(account: Account, estimated: int) -> str:
    period = "" if account.quota_period == "total" else f" {account.quota_period}"
    return (
        f"This request (about {estimated} tokens with max_tokens) does not fit in what is "
        f"left of your{period} token quota ({account.quota_tokens} tokens)."
    )


def _rate_message(account: Account, verdict: Verdict, estimated: int) -> str:
    if verdict.too_large:
        return (
            f"Request too large: about {estimated} tokens, more than the limit of "
            f"{account.tpm} tokens per minute. Reduce the prompt or max_tokens."
        )
    parts = []
    if "requests" in verdict.exceeded:
        parts.append(f"requests per minute (limit {account.rpm})")
    if "tokens" in verdict.exceeded:
        parts.append(f"tokens per minute (limit {account.tpm})")
    return (
        f"Rate limit reached for {' and '.join(parts)}. "
        f"Please retry after {verdict.retry_after} seconds."
    )


def bootstrap_local(store: AuthStore, key_from_env: str | None) -> str | None:
    """Make a fresh store usable locally; return a generated key to print once, else None.

    - Empty store: create account ``local`` (every model, no limits) with one key: the
      value of ``key_from_env`` (``SERVE_APP_API_KEY``) when given, else a random key,
      which is returned so the caller can show it once.
    - Non-empty store: nothing, except that a ``key_from_env`` the store does not know is
      added to ``local`` (created if missing). Convenient for development; in production
      leave ``SERVE_APP_API_KEY`` unset and manage keys with ``serve-app-keys``.

    Safe when several replicas run it at once on the same store.
    """
    env_key = key_from_env.strip() if key_from_env else None
    if env_key and not is_plausible_key(env_key):
        raise ValueError("SERVE_APP_API_KEY is not a usable API key (empty, spaces or too long)")
    if store.is_empty():
        try:
            account = store.create_account(LOCAL_ACCOUNT)
        except StoreError:  # another replica bootstrapped first
            account = None
        if account is not None:
            key = env_key or generate_key()
            store.add_key(account.id, hash_key(key), key_hint(key))
            logger.info("created account %r with key %s", LOCAL_ACCOUNT, key_hint(key))
            return None if env_key else key
    if env_key and store.find_key(hash_key(env_key)) is None:
        _add_env_key(store, env_key)
    return None


def _add_env_key(store: AuthStore, key: str) -> None:
    account = store.get_account_by_name(LOCAL_ACCOUNT)
    if account is None:
        try:
            account = store.create_account(LOCAL_ACCOUNT)
        except StoreError:
            account = store.get_account_by_name(LOCAL_ACCOUNT)
        if account is None:
            raise StoreError(f"cannot create account {LOCAL_ACCOUNT!r}")
    try:
        store.add_key(account.id, hash_key(key), key_hint(key))
    except StoreError:  # another replica added it first
        return
    logger.warning(
        "added SERVE_APP_API_KEY (%s) to account %r; unset it in production",
        key_hint(key),
        LOCAL_ACCOUNT,
    )
