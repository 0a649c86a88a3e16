"""``SqlAuthStore``: the SQL and migrations SQLite and PostgreSQL share; a dialect supplies
the connection and respells what differs (``sqlite.py``, ``postgres.py``).

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

import dataclasses
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from serve_app.auth.breaker import StoreBreaker
from serve_app.auth.interface import AuthStore
from serve_app.auth.migrations import MIGRATIONS
from serve_app.auth.ratelimit import bucket_start, evaluate
from serve_app.auth.records import (
    Account,
    Admission,
    ApiKey,
    StoreError,
    UsageRecord,
    UsageTotal,
    period_key,
)
from serve_app.auth.sql_counters import (
    Execute,
    add_to_quota,
    add_to_window,
    count_request,
    prune_windows,
    quota_used,
    window_buckets,
)

logger = logging.getLogger(__name__)

_ACCOUNT_COLUMNS = (
    "id, name, status, models, rpm, tpm, quota_tokens, quota_period, tokens_used, "
    "usage_period, created_at"
)
_KEY_COLUMNS = "id, account_id, key_hash, hint, created_at, revoked_at, last_used_at"
# Named, not positional: a ledger row's own fields are keyword-only (``UsageRecord``).
# ``delivered`` says how a row was written, not what it holds: no column
_LEDGER_COLUMNS = tuple(
    column.name for column in dataclasses.fields(UsageRecord) if column.name != "delivered"
)


class SqlAuthStore(AuthStore):
    """Everything but the connection: shared by the SQLite and PostgreSQL stores.

    SQL is written once with ``?`` placeholders; a dialect overrides the class attributes
    and hooks below. One connection per store object, guarded by a lock so a replica may
    call it from a thread pool; writes are short transactions (tens of microseconds).
    """

    begin_write = "BEGIN"  # how a read-modify-write transaction starts
    integrity_errors: tuple[type[Exception], ...] = ()
    unavailable_errors: tuple[type[Exception], ...] = ()  # the store could not be reached
    placeholder = "?"

    def __init__(self, clock: Callable[[], float] | None = None) -> None:
        self._lock = threading.RLock()
        self._conn: Any = None
        self._clock = clock
        self._breaker = StoreBreaker()

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

    def _bound(self, db: Any) -> Execute:
        """``_execute`` inside the transaction ``db``: what the counters (``sql_counters``) run
        their statements through."""
        return functools.partial(self._execute, db)

    @contextmanager
    def _using_store(self, write: bool) -> Iterator[None]:
        """The connection, held; refused at once while the store is away (``breaker``)."""
        self._breaker.enter(write)
        with self._lock:
            self._breaker.enter(write)
            try:
                yield
            except self.unavailable_errors:
                self._breaker.unreachable()
                raise
            except BaseException:
                self._breaker.answered(write)
                raise
            self._breaker.answered(write)

    @contextmanager
    def _write(self) -> Iterator[Any]:
        """A transaction that holds the write lock(s) it needs from its first statement."""
        with self._using_store(write=True):
            db = self._connection()
            db.execute(self.begin_write)
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        with self._using_store(write=False):
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

    def _insert_account(self, fields: dict[str, Any]) -> Account:
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
            raise StoreError(f"account {fields['name']!r} already exists") from error
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

    def _update_account(self, account_id: int, fields: dict[str, Any]) -> Account:
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
        with self._using_store(write=False):
            return self._now(self._connection())

    def _now(self, db: Any) -> float:
        """The store's clock, read inside the caller's transaction (see the module docstring)."""
        return self._clock() if self._clock is not None else self._server_now(db)

    def _server_now(self, db: Any) -> float:
        return time.time()

    def _admit(
        self, account_id: int, estimate: int, max_concurrent: int | None, hold: float | None
    ) -> Admission:
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
            if max_concurrent is not None and hold is not None:
                held = self._execute(
                    db, "SELECT count(*) FROM reservations WHERE account_id = ?", (account_id,)
                ).fetchone()[0]
                if held >= max_concurrent:
                    return Admission("concurrency", None, None, used)
            verdict = None
            if rpm is not None or tpm is not None:
                prune_windows(self._bound(db), account_id, now)
                buckets = window_buckets(self._bound(db), account_id, now)
                verdict = evaluate(buckets, now, rpm=rpm, tpm=tpm, estimated_tokens=estimate)
                if not verdict.allowed:
                    return Admission("rate", None, verdict, used)
            bucket = bucket_start(now)
            count_request(self._bound(db), account_id, bucket, estimate)
            if hold is None:
                return Admission(None, None, verdict, used)
            used = add_to_quota(self._bound(db), account_id, period_now, estimate)
            reservation_id = self._execute(
                db,
                "INSERT INTO reservations (account_id, tokens, bucket, usage_period, expires_at) "
                "VALUES (?, ?, ?, ?, ?) RETURNING id",
                (account_id, estimate, bucket, period_now, now + hold),
            ).fetchall()[0][0]
        return Admission(None, reservation_id, verdict, used)

    def record_usage(self, record: UsageRecord, reservation_id: int | None = None) -> int:
        with self._write() as db:
            record = dataclasses.replace(record, created_at=self._now(db))
            # Insert-if-absent in one statement: two writers of one request (the router and
            # the replica, on different nodes) cannot both pass a check made before it.
            inserted = self._execute(
                db,
                "INSERT INTO usage_ledger (account_id, key_id, model, endpoint, input_tokens, "
                "output_tokens, status, created_at, request_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (request_id) DO NOTHING RETURNING id",
                (
                    record.account_id,
                    record.key_id,
                    record.model,
                    record.endpoint,
                    record.input_tokens,
                    record.output_tokens,
                    record.status,
                    record.created_at,
                    record.request_id,
                ),
            ).fetchall()
            if not inserted:  # the request's row is there: it settled the reservation
                if record.delivered:
                    self._cap_to_delivered(db, record)
                return quota_used(self._bound(db), record.account_id, record.created_at)
            held = self._take_reservation(db, reservation_id)
            used = self._charge(db, record, held)
            prune_windows(self._bound(db), record.account_id, record.created_at)
        return used

    def _cap_to_delivered(self, db: Any, record: UsageRecord) -> None:
        """Cut the request's row to ``record``'s counts where they are fewer, and refund the
        difference (in the row's quota period and window bucket). A replica that generated a
        whole stream wrote its row for all of it, then died with chunks still on their way to
        the router; the router's ``delivered`` row counts what reached the client. The update
        is a compare-and-set on the counts read, so two writers cannot refund twice."""
        row = self._execute(
            db,
            "SELECT input_tokens, output_tokens, created_at FROM usage_ledger WHERE request_id = ?",
            (record.request_id,),
        ).fetchone()
        if row is None:
            return
        old_in, old_out, created_at = row
        new_in, new_out = min(old_in, record.input_tokens), min(old_out, record.output_tokens)
        refund = old_in + old_out - new_in - new_out
        if refund <= 0:
            return
        updated = self._execute(
            db,
            "UPDATE usage_ledger SET input_tokens = ?, output_tokens = ?, status = ? "
            "WHERE request_id = ? AND input_tokens = ? AND output_tokens = ? RETURNING id",
            (new_in, new_out, record.status, record.request_id, old_in, old_out),
        ).fetchall()
        if not updated:
            return
        account = self._execute(
            db, "SELECT quota_period FROM accounts WHERE id = ?", (record.account_id,)
        ).fetchone()
        period = period_key(account[0], created_at)
        add_to_quota(self._bound(db), record.account_id, period, -refund, only_if_current=True)
        bucket = bucket_start(created_at)
        add_to_window(self._bound(db), record.account_id, bucket, -refund, record.created_at)

    def release(self, reservation_id: int) -> None:
        with self._write() as db:
            held = self._take_reservation(db, reservation_id)
            if held is not None:
                account_id, tokens, bucket, period = held
                add_to_quota(self._bound(db), account_id, period, -tokens, only_if_current=True)
                add_to_window(self._bound(db), account_id, bucket, -tokens, self._now(db))

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
        reserved, bucket = 0, bucket_start(record.created_at)
        if held is not None and held[3] == period:
            reserved, bucket = held[1], held[2]
        execute, tokens = self._bound(db), actual - reserved
        used = add_to_quota(execute, record.account_id, period, tokens)
        add_to_window(execute, record.account_id, bucket, tokens, record.created_at)
        return used

    def list_usage(self, account_id: int, limit: int = 100) -> list[UsageRecord]:
        rows = self._query(
            f"SELECT {', '.join(_LEDGER_COLUMNS)} FROM usage_ledger WHERE account_id = ? "
            "ORDER BY id DESC LIMIT ?",
            (account_id, limit),
        )
        return [UsageRecord(**dict(zip(_LEDGER_COLUMNS, row, strict=True))) for row in rows]

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


def _account(row: Sequence[Any]) -> Account:
    values = list(row)
    values[3] = None if values[3] is None else tuple(json.loads(values[3]))
    return Account(*values)
