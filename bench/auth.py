"""Measure what auth costs per request: ``python -m bench.auth [--n N] [--db PATH]``.

Runs against a throwaway SQLite file, or ``--db`` (a SQLite path or ``postgresql://`` URL;
its accounts are named ``bench-*``), and prints microseconds per call for the
paths a request can take: cached unlimited key (no store access), cache miss (one indexed
read), rate-limited account (one ``BEGIN IMMEDIATE`` transaction), and ``record_usage``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from serve_app.auth.authorizer import AuthConfig, Authorizer
from serve_app.auth.keys import generate_key, hash_key, key_hint
from serve_app.auth.records import Usage
from serve_app.auth.sqlite import SQLiteAuthStore
from serve_app.auth.store import open_store


def per_call_us(fn: Callable[[], object], n: int) -> float:
    fn()  # warm up (cache fill, statement cache)
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=5000)
    parser.add_argument("--db", default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(args.db) if args.db else SQLiteAuthStore(Path(tmp) / "auth.sqlite3")
        keys = {}
        for name, fields in {
            "open": {},
            "limited": {"rpm": 10**9, "tpm": 10**12, "quota_tokens": 10**12},
        }.items():
            account = store.create_account(f"bench-{name}-{time.time_ns()}", **fields)
            keys[name] = generate_key()
            store.add_key(account.id, hash_key(keys[name]), key_hint(keys[name]))
        config = AuthConfig({"m"})
        cached = Authorizer(store, config)
        uncached = Authorizer(store, AuthConfig({"m"}, cache_ttl=0))
        grant = cached.authorize(keys["limited"], "m", "/v1/chat")
        results = {
            "authorize, unlimited account, cached key": per_call_us(
                lambda: cached.authorize(keys["open"], "m", "/v1/chat"), args.n
            ),
            "authorize, unlimited account, cache miss": per_call_us(
                lambda: uncached.authorize(keys["open"], "m", "/v1/chat"), args.n
            ),
            "authorize, rpm+tpm+quota account, cached key": per_call_us(
                lambda: cached.authorize(keys["limited"], "m", "/v1/chat", 100), args.n
            ),
            "record_usage": per_call_us(
                lambda: cached.record_usage(grant, Usage("m", "/v1/chat", 10, 10, 200)), args.n
            ),
        }
        store.close()
    for label, micros in results.items():
        print(f"{label:48s} {micros:8.1f} us/call")


if __name__ == "__main__":
    main()
