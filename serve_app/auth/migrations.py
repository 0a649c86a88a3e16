"""The auth store's schema, as numbered migrations in the SQL SQLite and PostgreSQL share."""

from __future__ import annotations

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
    # One row per request: the request's id, so that a second writer for the same request
    # (the router billing a stream whose replica died, the replica itself) adds nothing.
    # NULL for rows written without one; NULLs never collide.
    3: [
        "ALTER TABLE usage_ledger ADD COLUMN request_id TEXT",
        "CREATE UNIQUE INDEX usage_ledger_request ON usage_ledger (request_id)",
    ],
}
