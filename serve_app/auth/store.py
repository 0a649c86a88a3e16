"""Where accounts, keys, usage and rate windows live: the ``AuthStore`` interface and SQLite.

SQLite is the default: one file under the data dir, shared by every replica process on the
node. WAL mode lets readers run while one process writes; ``busy_timeout`` makes a writer
wait for the lock instead of failing; every read-modify-write runs in ``BEGIN IMMEDIATE``,
which takes the write lock up front, so two processes can never both pass a rate check
that only one of them should. The PostgreSQL store (``postgres.py``) implements the same
interface with the same tables for a multi-node cluster.

Times are epoch seconds (``float``) on the *store's* clock: every rate window, quota period
and ledger time is read inside the transaction that uses it, from one source (SQLite: the
node's clock, the one every process sharing the file has; PostgreSQL: the server's ``now()``),
never from each replica's own clock. Tests pass ``clock=`` to drive it.

Admission reserves before work: ``admit`` checks quota, windows and the concurrency cap and,
in the same transaction, charges the request's estimate (prompt + max output) to the quota and
the token window and holds a ``reservations`` row; ``record_usage`` settles it to the actual
count, ``release`` refunds it. So concurrent requests cannot all pass a check that only some
of them fit, and a reservation whose owner died expires (its charge stays: over-, never
under-billing).
"""

from __future__ import annotations

import abc
import dataclasses
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from serve_app.auth import ratelimit
from serve_app.auth.ratelimit import Bucket, Verdict

logger = logging.getLogger(__name__)

STATUSES = ("active", "inactive")
PERIODS = ("total", "daily", "monthly")
DB_FILENAME = "auth.sqlite3"


class _Keep:
    """Sentinel for "leave this field as it is" (``None`` already means "unlimited")."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP: Final = _Keep()


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
class UsageRecord:
    """One ledger row: a completed (or failed) request and what it cost."""

    account_id: int
    key_id: int | None
    model: str | None
    endpoint: str
    input_tokens: int
    output_tokens: int
    status: int
    created_at: float
    id: int | None = None

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


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


def default_data_dir() -> Path:
    """``$SERVE_APP_DATA_DIR``, else ``~/.local/share/serve-app``; absolute, because replicas
    do not run in the directory ``serve run`` was started from."""
    configured = os.environ.get("SERVE_APP_DATA_DIR")
    base = Path(configured) if configured else Path.home() / ".local" / "share" / "serve-app"
    return base.expanduser().resolve()


def resolve_auth_db(db: str | Path | None = None, data_dir: str | Path | None = None) -> str:
    """The one answer to "which auth store": ``db``, else ``$SERVE_APP_AUTH_DB``, else
    ``<data_dir>/auth.sqlite3`` (``data_dir`` defaults to ``default_data_dir()``)."""
    configured = db or os.environ.get("SERVE_APP_AUTH_DB")
    return str(configured or Path(data_dir or default_data_dir()) / DB_FILENAME)


def open_store(
    db: str | Path | None = None, *, clock: Callable[[], float] | None = None
) -> AuthStore:
    """Open the configured store: a ``postgresql://`` DSN selects PostgreSQL, else SQLite.
    ``clock`` replaces the store's clock (tests only)."""
    target = resolve_auth_db(db)
    if target.startswith(("postgres://", "postgresql://")):
        from serve_app.auth.postgres import PostgresAuthStore

        return PostgresAuthStore(target, clock=clock)
    return SQLiteAuthStore(target, clock=clock)


class AuthStore(abc.ABC):
    """Repository of accounts, keys, the usage ledger and rate windows.

    Implementations must make ``take_request`` and ``record_usage`` atomic across every
    process that shares the store: that is what makes limits hold across replicas.
    """

    # Accounts
    @abc.abstractmethod
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
    ) -> Account: ...

    @abc.abstractmethod
    def get_account(self, account_id: int) -> Account | None: ...

    @abc.abstractmethod
    def get_account_by_name(self, name: str) -> Account | None: ...

    @abc.abstractmethod
    def list_accounts(self) -> list[Account]: ...

    @abc.abstractmethod
    def update_account(
        self,
        account_id: int,
        *,
        status: str | _Keep = KEEP,
        models: Sequence[str] | None | _Keep = KEEP,
        rpm: int | None | _Keep = KEEP,
        tpm: int | None | _Keep = KEEP,
        quota_tokens: int | None | _Keep = KEEP,
        quota_period: str | _Keep = KEEP,
    ) -> Account: ...

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

    @abc.abstractmethod
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

    @abc.abstractmethod
    def record_usage(self, record: UsageRecord, reservation_id: int | None = None) -> int:
        """Append to the ledger and charge the actual tokens in one transaction, settling the
        reservation (charge ``actual - reserved``) when it is still held. ``created_at`` is
        set from the store's clock. Returns the tokens used in the current quota period."""

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


# --- SQL stores ---------------------------------------------------------------------------

# Each migration is a list of statements applied in one transaction; never edit a released one,
# append a new version instead. Written in the SQL that SQLite and PostgreSQL share;
# ``SqlAuthStore._ddl`` lets a dialect respell types (postgres.py: BIGINT, identity columns).
MIGRATIONS: dict[int, list[str]] = {
    1: [
        """CREATE TABLE accounts (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            name TEXT NOT NULL UNIQUE,
            status TEXT NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'inactive')),
            models TEXT,
            rpm INTEGER,
            tpm INTEGER,
            quota_tokens INTEGER,
            quota_period TEXT NOT NULL DEFAULT 'total',
            tokens_used INTEGER NOT NULL DEFAULT 0,
            usage_period TEXT NOT NULL DEFAULT '',
            created_at REAL NOT NULL
        )""",
        """CREATE TABLE api_keys (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            account_id INTEGER NOT NULL REFERENCES accounts (id),
            key_hash TEXT NOT NULL UNIQUE,
            hint TEXT NOT NULL,
            created_at REAL NOT NULL,
            revoked_at REAL,
            last_used_at REAL
        )""",
        "CREATE INDEX api_keys_account ON api_keys (account_id)",
        """CREATE TABLE usage_ledger (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            account_id INTEGER NOT NULL REFERENCES accounts (id),
            key_id INTEGER REFERENCES api_keys (id),
            model TEXT,
            endpoint TEXT NOT NULL,
            input_tokens INTEGER NOT NULL,
            output_tokens INTEGER NOT NULL,
            status INTEGER NOT NULL,
            created_at REAL NOT NULL
        )""",
        "CREATE INDEX usage_ledger_account_time ON usage_ledger (account_id, created_at)",
        """CREATE TABLE rate_windows (
            account_id INTEGER NOT NULL REFERENCES accounts (id),
            bucket INTEGER NOT NULL,
            requests INTEGER NOT NULL DEFAULT 0,
            tokens INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (account_id, bucket)
        )""",
    ],
    # Admission reservations: tokens charged before work, settled by the ledger row.
    2: [
        """CREATE TABLE reservations (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            account_id INTEGER NOT NULL REFERENCES accounts (id),
            tokens INTEGER NOT NULL,
            bucket INTEGER NOT NULL,
            usage_period TEXT NOT NULL,
            expires_at REAL NOT NULL
        )""",
        "CREATE INDEX reservations_account ON reservations (account_id, expires_at)",
    ],
}

_ACCOUNT_COLUMNS = (
    "id, name, status, models, rpm, tpm, quota_tokens, quota_period, tokens_used, "
    "usage_period, created_at"
)
_KEY_COLUMNS = "id, account_id, key_hash, hint, created_at, revoked_at, last_used_at"
_UPSERT_WINDOW = (
    "INSERT INTO rate_windows (account_id, bucket, requests, tokens) VALUES (?, ?, ?, ?) "
    "ON CONFLICT (account_id, bucket) DO UPDATE SET "
    "requests = rate_windows.requests + excluded.requests, "
    "tokens = rate_windows.tokens + excluded.tokens"
)


class SqlAuthStore(AuthStore):
    """Everything but the connection: shared by the SQLite and PostgreSQL stores.

    SQL is written once with ``?`` placeholders; a dialect overrides the class attributes
    and hooks below. One connection per store object, guarded by a lock so a replica may
    call it from a thread pool; writes are short transactions (tens of microseconds).
    """

    begin_write = "BEGIN"  # how a read-modify-write transaction starts
    integrity_errors: tuple[type[Exception], ...] = ()
    placeholder = "?"

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._lock = threading.RLock()
        self._conn: Any = None
        self._clock = clock

    # -- dialect hooks

    def _ddl(self, statement: str) -> str:
        return statement

    def _lock_migrations(self, db: Any) -> None:
        """Serialize schema changes between processes starting at once."""

    def _lock_account(self, db: Any, account_id: int) -> None:
        """Serialize rate checks of one account (SQLite's BEGIN IMMEDIATE already does)."""

    def _relax_durability(self, db: Any) -> None:
        """This transaction only touches counters that may lose their last milliseconds in
        a crash (rate windows, last-used times): let it commit without waiting for disk."""

    def _connection(self) -> Any:
        return self._conn

    # -- plumbing

    def _execute(self, db: Any, sql: str, params: Sequence[Any] = ()) -> Any:
        if self.placeholder != "?":
            sql = sql.replace("?", self.placeholder)
        return db.execute(sql, tuple(params))

    @contextmanager
    def _write(self) -> Iterator[Any]:
        """A transaction that holds the write lock(s) it needs from its first statement."""
        with self._lock:
            db = self._connection()
            db.execute(self.begin_write)
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        with self._lock:
            return self._execute(self._connection(), sql, params).fetchall()

    def _migrate(self) -> None:
        """Apply missing migrations; safe when several processes start at once."""
        with self._write() as db:
            self._lock_migrations(db)
            self._execute(
                db,
                self._ddl(
                    "CREATE TABLE IF NOT EXISTS schema_version "
                    "(version INTEGER NOT NULL, applied_at REAL NOT NULL)"
                ),
            )
            current = self._execute(db, "SELECT max(version) FROM schema_version").fetchall()[0][0]
            current = current or 0
            if current > max(MIGRATIONS):
                raise StoreError(f"{self} has schema {current}, newer than this code")
            for version in sorted(v for v in MIGRATIONS if v > current):
                for statement in MIGRATIONS[version]:
                    self._execute(db, self._ddl(statement))
                self._execute(
                    db, "INSERT INTO schema_version VALUES (?, ?)", (version, time.time())
                )
                logger.info("auth store %s migrated to schema %d", self, version)

    def schema_version(self) -> int:
        return self._query("SELECT max(version) FROM schema_version")[0][0]

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # -- accounts

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
        fields = _check_account_fields(
            name=name,
            status=status,
            models=models,
            rpm=rpm,
            tpm=tpm,
            quota_tokens=quota_tokens,
            quota_period=quota_period,
        )
        fields["created_at"] = time.time() if now is None else now
        columns = ", ".join(fields)
        marks = ", ".join("?" for _ in fields)
        try:
            with self._write() as db:
                account_id = self._execute(
                    db,
                    f"INSERT INTO accounts ({columns}) VALUES ({marks}) RETURNING id",
                    tuple(fields.values()),
                ).fetchall()[0][0]
        except self.integrity_errors as error:
            raise StoreError(f"account {name!r} already exists") from error
        return self._require_account(account_id)

    def get_account(self, account_id: int) -> Account | None:
        rows = self._query(f"SELECT {_ACCOUNT_COLUMNS} FROM accounts WHERE id = ?", (account_id,))
        return _account(rows[0]) if rows else None

    def get_account_by_name(self, name: str) -> Account | None:
        rows = self._query(f"SELECT {_ACCOUNT_COLUMNS} FROM accounts WHERE name = ?", (name,))
        return _account(rows[0]) if rows else None

    def list_accounts(self) -> list[Account]:
        rows = self._query(f"SELECT {_ACCOUNT_COLUMNS} FROM accounts ORDER BY id")
        return [_account(row) for row in rows]

    def update_account(
        self,
        account_id: int,
        *,
        status: str | _Keep = KEEP,
        models: Sequence[str] | None | _Keep = KEEP,
        rpm: int | None | _Keep = KEEP,
        tpm: int | None | _Keep = KEEP,
        quota_tokens: int | None | _Keep = KEEP,
        quota_period: str | _Keep = KEEP,
    ) -> Account:
        changes = {
            "status": status,
            "models": models,
            "rpm": rpm,
            "tpm": tpm,
            "quota_tokens": quota_tokens,
            "quota_period": quota_period,
        }
        fields = _check_account_fields(**{k: v for k, v in changes.items() if v is not KEEP})
        if fields:
            assignments = ", ".join(f"{column} = ?" for column in fields)
            with self._write() as db:
                self._execute(
                    db,
                    f"UPDATE accounts SET {assignments} WHERE id = ?",
                    (*fields.values(), account_id),
                )
        return self._require_account(account_id)

    def is_empty(self) -> bool:
        return not self._query("SELECT 1 FROM accounts LIMIT 1")

    def _require_account(self, account_id: int) -> Account:
        account = self.get_account(account_id)
        if account is None:
            raise StoreError(f"no account with id {account_id}")
        return account

    # -- keys

    def add_key(
        self, account_id: int, key_hash: str, hint: str, now: float | None = None
    ) -> ApiKey:
        created = time.time() if now is None else now
        try:
            with self._write() as db:
                key_id = self._execute(
                    db,
                    "INSERT INTO api_keys (account_id, key_hash, hint, created_at) "
                    "VALUES (?, ?, ?, ?) RETURNING id",
                    (account_id, key_hash, hint, created),
                ).fetchall()[0][0]
        except self.integrity_errors as error:
            # Unknown account or a duplicate hash; the message must never include a key.
            raise StoreError(f"cannot add this key to account {account_id}") from error
        return ApiKey(key_id, account_id, key_hash, hint, created, None, None)

    def find_key(self, key_hash: str) -> tuple[ApiKey, Account] | None:
        key_columns = ", ".join(f"k.{c.strip()}" for c in _KEY_COLUMNS.split(","))
        account_columns = ", ".join(f"a.{c.strip()}" for c in _ACCOUNT_COLUMNS.split(","))
        rows = self._query(
            f"SELECT {key_columns}, {account_columns} FROM api_keys k "
            "JOIN accounts a ON a.id = k.account_id WHERE k.key_hash = ?",
            (key_hash,),
        )
        if not rows:
            return None
        row = rows[0]
        return ApiKey(*row[:7]), _account(row[7:])

    def list_keys(self, account_id: int | None = None) -> list[ApiKey]:
        if account_id is None:
            rows = self._query(f"SELECT {_KEY_COLUMNS} FROM api_keys ORDER BY id")
        else:
            rows = self._query(
                f"SELECT {_KEY_COLUMNS} FROM api_keys WHERE account_id = ? ORDER BY id",
                (account_id,),
            )
        return [ApiKey(*row) for row in rows]

    def revoke_key(self, key_id: int, now: float | None = None) -> bool:
        with self._write() as db:
            cursor = self._execute(
                db,
                "UPDATE api_keys SET revoked_at = ? WHERE id = ? AND revoked_at IS NULL",
                (time.time() if now is None else now, key_id),
            )
            return cursor.rowcount == 1

    def touch_key(self, key_id: int, now: float, min_interval: float) -> None:
        with self._write() as db:
            self._relax_durability(db)
            self._execute(
                db,
                "UPDATE api_keys SET last_used_at = ? "
                "WHERE id = ? AND (last_used_at IS NULL OR last_used_at <= ?)",
                (now, key_id, now - min_interval),
            )

    # -- time, admission, rate windows and usage

    def now(self) -> float:
        with self._lock:
            return self._now(self._connection())

    def _now(self, db: Any) -> float:
        """The store's clock, read inside the caller's transaction (see the module docstring)."""
        return self._clock() if self._clock is not None else self._server_now(db)

    def _server_now(self, db: Any) -> float:
        return time.time()

    def admit(
        self,
        account_id: int,
        *,
        estimated_tokens: int,
        max_concurrent: int | None,
        hold_seconds: float | None,
    ) -> Admission:
        estimate = max(0, int(estimated_tokens)) if hold_seconds is not None else 0
        with self._write() as db:
            self._lock_account(db, account_id)
            now = self._now(db)
            row = self._execute(
                db,
                "SELECT rpm, tpm, quota_tokens, quota_period, tokens_used, usage_period "
                "FROM accounts WHERE id = ?",
                (account_id,),
            ).fetchone()
            if row is None:
                raise StoreError(f"no account with id {account_id}")
            rpm, tpm, quota, period, used, used_period = row
            period_now = period_key(period, now)
            used = used if used_period == period_now else 0
            if quota is not None and (used >= quota or used + estimate > quota):
                return Admission("quota", None, None, used)
            self._execute(
                db,
                "DELETE FROM reservations WHERE account_id = ? AND expires_at <= ?",
                (account_id, now),
            )
            if max_concurrent is not None and hold_seconds is not None:
                held = self._execute(
                    db, "SELECT count(*) FROM reservations WHERE account_id = ?", (account_id,)
                ).fetchone()[0]
                if held >= max_concurrent:
                    return Admission("concurrency", None, None, used)
            verdict = None
            if rpm is not None or tpm is not None:
                self._prune(db, account_id, now)
                buckets = self._buckets(db, account_id, now)
                verdict = ratelimit.evaluate(
                    buckets, now, rpm=rpm, tpm=tpm, estimated_tokens=estimate
                )
                if not verdict.allowed:
                    return Admission("rate", None, verdict, used)
            bucket = ratelimit.bucket_start(now)
            self._execute(db, _UPSERT_WINDOW, (account_id, bucket, 1, estimate))
            if hold_seconds is None:
                return Admission(None, None, verdict, used)
            used = self._add_to_quota(db, account_id, period_now, estimate)
            reservation_id = self._execute(
                db,
                "INSERT INTO reservations (account_id, tokens, bucket, usage_period, expires_at) "
                "VALUES (?, ?, ?, ?, ?) RETURNING id",
                (account_id, estimate, bucket, period_now, now + hold_seconds),
            ).fetchall()[0][0]
        return Admission(None, reservation_id, verdict, used)

    def record_usage(self, record: UsageRecord, reservation_id: int | None = None) -> int:
        with self._write() as db:
            record = dataclasses.replace(record, created_at=self._now(db))
            self._execute(
                db,
                "INSERT INTO usage_ledger (account_id, key_id, model, endpoint, input_tokens, "
                "output_tokens, status, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.account_id,
                    record.key_id,
                    record.model,
                    record.endpoint,
                    record.input_tokens,
                    record.output_tokens,
                    record.status,
                    record.created_at,
                ),
            )
            held = self._take_reservation(db, reservation_id)
            used = self._charge(db, record, held)
            self._prune(db, record.account_id, record.created_at)
        return used

    def release(self, reservation_id: int) -> None:
        with self._write() as db:
            held = self._take_reservation(db, reservation_id)
            if held is not None:
                account_id, tokens, bucket, period = held
                self._add_to_quota(db, account_id, period, -tokens, only_if_current=True)
                self._add_to_window(db, account_id, bucket, -tokens, self._now(db))

    def _take_reservation(self, db: Any, reservation_id: int | None) -> tuple | None:
        """Remove a held reservation: (account, tokens, bucket, period), or None if gone."""
        if reservation_id is None:
            return None
        rows = self._execute(
            db,
            "DELETE FROM reservations WHERE id = ? "
            "RETURNING account_id, tokens, bucket, usage_period",
            (reservation_id,),
        ).fetchall()
        return tuple(rows[0]) if rows else None

    def _charge(self, db: Any, record: UsageRecord, held: tuple | None) -> int:
        """Charge the actual tokens: the difference to a held reservation where it was
        charged (same quota period, window bucket still kept), else all of them now."""
        row = self._execute(
            db, "SELECT quota_period FROM accounts WHERE id = ?", (record.account_id,)
        ).fetchone()
        if row is None:
            raise StoreError(f"no account with id {record.account_id}")
        period = period_key(row[0], record.created_at)
        actual = record.total_tokens
        reserved, bucket = 0, ratelimit.bucket_start(record.created_at)
        if held is not None and held[3] == period:
            reserved, bucket = held[1], held[2]
        used = self._add_to_quota(db, record.account_id, period, actual - reserved)
        self._add_to_window(db, record.account_id, bucket, actual - reserved, record.created_at)
        return used

    def _add_to_quota(
        self, db: Any, account_id: int, period: str, tokens: int, *, only_if_current=False
    ) -> int:
        """Add ``tokens`` (may be negative) to the quota counter of ``period``, restarting
        the counter when the account's stored period is another one."""
        if only_if_current:  # a refund for a period that has rolled over refunds nothing
            rows = self._execute(
                db,
                "UPDATE accounts SET tokens_used = tokens_used + ? "
                "WHERE id = ? AND usage_period = ? RETURNING tokens_used",
                (tokens, account_id, period),
            ).fetchall()
            return rows[0][0] if rows else 0
        return self._execute(
            db,
            "UPDATE accounts SET tokens_used = CASE WHEN usage_period = ? "
            "THEN tokens_used + ? ELSE ? END, usage_period = ? "
            "WHERE id = ? RETURNING tokens_used",
            (period, tokens, tokens, period, account_id),
        ).fetchall()[0][0]

    def _add_to_window(self, db: Any, account_id: int, bucket: int, tokens: int, now: float):
        """Adjust a token bucket, unless it is already too old to count in any window."""
        if tokens and bucket > now - ratelimit.KEEP_SECONDS:
            self._execute(db, _UPSERT_WINDOW, (account_id, bucket, 0, tokens))

    def list_usage(self, account_id: int, limit: int = 100) -> list[UsageRecord]:
        rows = self._query(
            "SELECT account_id, key_id, model, endpoint, input_tokens, output_tokens, status, "
            "created_at, id FROM usage_ledger WHERE account_id = ? ORDER BY id DESC LIMIT ?",
            (account_id, limit),
        )
        return [UsageRecord(*row) for row in rows]

    def usage_totals(self, account_id: int, since: float | None = None) -> list[UsageTotal]:
        since_clause, params = ("", [account_id])
        if since is not None:
            since_clause, params = (" AND created_at >= ?", [account_id, since])
        rows = self._query(
            "SELECT model, endpoint, count(*), CAST(sum(input_tokens) AS BIGINT), "
            "CAST(sum(output_tokens) AS BIGINT) FROM usage_ledger "
            f"WHERE account_id = ?{since_clause} GROUP BY model, endpoint ORDER BY model, endpoint",
            params,
        )
        return [UsageTotal(*row) for row in rows]

    def _buckets(self, db: Any, account_id: int, now: float) -> list[Bucket]:
        rows = self._execute(
            db,
            "SELECT bucket, requests, tokens FROM rate_windows WHERE account_id = ? AND bucket > ?",
            (account_id, now - ratelimit.KEEP_SECONDS),
        ).fetchall()
        return [Bucket(*row) for row in rows]

    def _prune(self, db: Any, account_id: int, now: float) -> None:
        self._execute(
            db,
            "DELETE FROM rate_windows WHERE account_id = ? AND bucket <= ?",
            (account_id, now - ratelimit.KEEP_SECONDS),
        )


class SQLiteAuthStore(SqlAuthStore):
    """The default store: a SQLite file in WAL mode, safe for several processes on one node.

    WAL lets readers run while one process writes; ``busy_timeout`` makes a writer wait for
    the lock instead of failing; ``BEGIN IMMEDIATE`` takes the write lock up front, so two
    processes can never both pass a rate check only one of them should (and never deadlock
    upgrading a read lock).
    """

    begin_write = "BEGIN IMMEDIATE"
    integrity_errors = (sqlite3.IntegrityError,)

    def __init__(
        self,
        path: str | Path,
        *,
        busy_timeout_ms: int = 5000,
        synchronous: str = "NORMAL",
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(clock)
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: no implicit transactions; _write issues BEGIN IMMEDIATE.
        self._conn = sqlite3.connect(
            self.path,
            isolation_level=None,
            check_same_thread=False,
            timeout=busy_timeout_ms / 1000,
        )
        self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        self._conn.execute("PRAGMA journal_mode = WAL")
        # NORMAL in WAL mode: a commit survives a process crash; only an OS crash or power
        # loss can drop the last few commits. FULL fsyncs every commit (and every request).
        self._conn.execute(f"PRAGMA synchronous = {_pragma_word(synchronous)}")
        self._conn.execute("PRAGMA foreign_keys = ON")
        self._migrate()

    def __str__(self) -> str:
        return str(self.path)


def _pragma_word(value: str) -> str:
    """PRAGMA values cannot be bound as parameters: allow only plain words."""
    if not value.isalpha():
        raise ValueError(f"bad pragma value {value!r}")
    return value


def _account(row: Sequence[Any]) -> Account:
    values = list(row)
    values[3] = None if values[3] is None else tuple(json.loads(values[3]))
    return Account(*values)


def _is_limit(value: Any) -> bool:
    return value is None or (type(value) is int and value >= 0)


def _check_account_fields(**fields: Any) -> dict[str, Any]:
    """Validate account columns (only those given) and encode them for storage."""
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if name == "name" and not (isinstance(value, str) and value.strip()):
            raise StoreError("account name must be a non-empty string")
        if name == "status" and value not in STATUSES:
            raise StoreError(f"status must be one of {STATUSES}, not {value!r}")
        if name == "quota_period" and value not in PERIODS:
            raise StoreError(f"quota period must be one of {PERIODS}, not {value!r}")
        if name in ("rpm", "tpm", "quota_tokens") and not _is_limit(value):
            raise StoreError(f"{name} must be a non-negative integer or None, not {value!r}")
        if name == "models" and value is not None:
            if isinstance(value, str) or not all(isinstance(m, str) and m for m in value):
                raise StoreError("models must be a list of model ids or None (all)")
            value = json.dumps(sorted(set(value)))
        out[name] = value
    return out
