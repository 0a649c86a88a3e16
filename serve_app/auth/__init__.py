"""Accounts, API keys, rate limits, quotas and the usage ledger. No HTTP, no Ray.

Use from a deployment::

    store = open_store()  # $SERVE_APP_AUTH_DB, else $SERVE_APP_DATA_DIR/auth.sqlite3
    new_key = bootstrap_local(store, os.environ.get("SERVE_APP_API_KEY"))
    if new_key:
        print(f"API key for account 'local': {new_key}")  # shown once, never logged
    auth = Authorizer(store, AuthConfig(model_ids={"my-model"}))
    grant = auth.authorize(token, "my-model", "/v1/chat/completions", estimated_tokens=900)
    ...  # serve it; add grant.headers to the response
    auth.record_usage(grant, Usage("my-model", "/v1/chat/completions", 400, 120, 200))

Layout: ``records`` (accounts, keys, a request's ``Usage``, ledger rows), ``interface``
(``AuthStore``), ``sql`` (the SQL both stores share), ``sqlite`` and ``postgres`` (the
dialects), ``migrations``, ``store`` (``open_store``, ``resolve_auth_db``), ``keys``
(generation, sha256 hashing), ``ratelimit`` (sliding-window arithmetic), ``authorizer``
(``Authorizer``, ``Grant``, ``bootstrap_local``), ``local_key`` (the local key file), ``cli``
(``serve-app-keys``).

Everything that must agree across replicas lives in the store: key status, account limits,
per-account rate windows (5 s buckets, checked and counted in one transaction) and the
quota counter, charged in the same transaction as the ledger row. Each replica only caches
key lookups for ``AuthConfig.cache_ttl`` (0.5 s), which bounds how late it sees a revocation.
"""

from serve_app.auth.authorizer import (
    AccountLimits,
    AuthConfig,
    Authorizer,
    Grant,
    bootstrap_local,
)
from serve_app.auth.interface import AuthStore
from serve_app.auth.records import StoreError, Usage
from serve_app.auth.sqlite import SQLiteAuthStore
from serve_app.auth.store import open_store

__all__ = [
    "AuthConfig",
    "Authorizer",
    "AuthStore",
    "Grant",
    "AccountLimits",
    "SQLiteAuthStore",
    "StoreError",
    "Usage",
    "bootstrap_local",
    "open_store",
]
