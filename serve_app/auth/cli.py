"""Operator CLI for accounts and API keys: ``serve-app-keys`` / ``python -m serve_app.auth.cli``.

The store is ``--db PATH`` (a SQLite file or a ``postgresql://`` DSN), else
``$SERVE_APP_AUTH_DB``, else ``$SERVE_APP_DATA_DIR/auth.sqlite3`` (``resolve_auth_db``; the data
dir defaults to ``~/.local/share/serve-app``, ``make`` sets ``./data``).
Changes reach running replicas within their cache TTL (0.5 s by default): no restart.

A new key is printed once, alone on stdout (so ``KEY=$(serve-app-keys create-key acme)``
works); nothing else ever prints a key, only its hint (``sk-sa-...abcd``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from serve_app.auth.interface import AuthStore
from serve_app.auth.keys import generate_key, hash_key, key_hint
from serve_app.auth.local_key import bootstrap_key_file
from serve_app.auth.records import KEEP, PERIODS, Account, StoreError
from serve_app.auth.store import open_store
from serve_app.config import resolve_auth_db


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    store = open_store(args.db)
    args.db = resolve_auth_db(args.db)
    try:
        return args.handler(store, args)
    except StoreError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    finally:
        store.close()


# -- commands


def _create_account(store: AuthStore, args: argparse.Namespace) -> int:
    account = store.create_account(
        args.name,
        models=args.models,
        rpm=args.rpm,
        tpm=args.tpm,
        quota_tokens=args.quota,
        quota_period=args.quota_period,
        status="inactive" if args.inactive else "active",
    )
    print(f"created account {account.name} (id {account.id})")
    print(_describe(account))
    return 0


def _create_key(store: AuthStore, args: argparse.Namespace) -> int:
    account = _account(store, args.account)
    key = generate_key()
    record = store.add_key(account.id, hash_key(key), key_hint(key))
    print(key)
    print(
        f"created key {record.id} ({record.hint}) for account {account.name}; "
        "it is shown only now, store it safely",
        file=sys.stderr,
    )
    return 0


def _bootstrap(store: AuthStore, args: argparse.Namespace) -> int:
    """An empty store gets account ``local`` and a key, printed here once (and kept in a 0600
    file beside the store); later runs only say where the key is. ``make run`` runs it
    through ``serve_app.prepare`` when its config enables ``auth.bootstrap_local_key``."""
    key, path = bootstrap_key_file(store, args.db, os.environ.get("SERVE_APP_API_KEY"))
    if key is not None:
        rule = "=" * 72
        print(
            f"{rule}\n  Created account 'local' with API key (shown once; also in {path}):\n"
            f"    {key}\n  export SERVE_APP_API_KEY={key}\n{rule}"
        )
    elif path.exists():
        print(f"the local API key is in {path}", file=sys.stderr)
    return 0


def _list(store: AuthStore, args: argparse.Namespace) -> int:
    keys = store.list_keys()
    for account in store.list_accounts():
        print(f"account {account.id} {account.name}: {_describe(account)}")
        for key in (k for k in keys if k.account_id == account.id):
            state = f"revoked {_when(key.revoked_at)}" if key.revoked else "active"
            print(
                f"  key {key.id} {key.hint} {state}, created {_when(key.created_at)}, "
                f"last used {_when(key.last_used_at)}"
            )
    return 0


def _revoke(store: AuthStore, args: argparse.Namespace) -> int:
    if not store.revoke_key(args.key_id):
        print(f"error: no active key with id {args.key_id}", file=sys.stderr)
        return 1
    print(f"revoked key {args.key_id}")
    return 0


def _set_status(store: AuthStore, args: argparse.Namespace) -> int:
    account = store.update_account(_account(store, args.account).id, status=args.status)
    print(f"account {account.name}: {_describe(account)}")
    return 0


def _set_limits(store: AuthStore, args: argparse.Namespace) -> int:
    changes = {
        "rpm": args.rpm,
        "tpm": args.tpm,
        "quota_tokens": args.quota,
        "quota_period": args.quota_period,
        "models": args.models,
    }
    changes = {k: v for k, v in changes.items() if v is not KEEP}
    account = store.update_account(_account(store, args.account).id, **changes)
    print(f"account {account.name}: {_describe(account)}")
    return 0


def _usage(store: AuthStore, args: argparse.Namespace) -> int:
    account = _account(store, args.account)
    now = time.time()
    quota = "unlimited" if account.quota_tokens is None else str(account.quota_tokens)
    print(
        f"account {account.name}: {account.tokens_used_at(now)} tokens used "
        f"({account.quota_period} period), quota {quota}"
    )
    for total in store.usage_totals(account.id):
        print(
            f"  {total.model or '-'} {total.endpoint}: {total.requests} requests, "
            f"{total.input_tokens} input + {total.output_tokens} output tokens"
        )
    return 0


# -- helpers


def _account(store: AuthStore, name: str) -> Account:
    account = store.get_account_by_name(name)
    if account is None:
        raise StoreError(f"no account named {name!r}")
    return account


def _describe(account: Account) -> str:
    models = "all models" if account.models is None else "models " + ",".join(account.models)
    quota = "unlimited" if account.quota_tokens is None else str(account.quota_tokens)
    return (
        f"{account.status}, {models}, rpm {_limit(account.rpm)}, tpm {_limit(account.tpm)}, "
        f"quota {quota} ({account.quota_period}), used {account.tokens_used_at(time.time())}"
    )


def _limit(value: int | None) -> str:
    return "unlimited" if value is None else str(value)


def _when(at: float | None) -> str:
    return "never" if at is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def _limit_arg(text: str) -> int | None:
    """A limit on the command line: a non-negative integer, or none/unlimited."""
    if text.lower() in ("none", "unlimited"):
        return None
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def _models_arg(text: str) -> list[str] | None:
    """``a,b`` -> ["a", "b"]; ``all`` -> None (every model)."""
    if text.lower() == "all":
        return None
    models = [m.strip() for m in text.split(",") if m.strip()]
    if not models:
        raise argparse.ArgumentTypeError("give model ids separated by commas, or 'all'")
    return models


def _parser() -> argparse.ArgumentParser:
    # --db is accepted before or after the command; the subcommand copy must not overwrite
    # the top-level value with its own default, hence SUPPRESS.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--db", default=argparse.SUPPRESS, help="store: SQLite path or DSN")
    parser = argparse.ArgumentParser(prog="serve-app-keys", description=__doc__.split("\n")[0])
    parser.add_argument("--db", default=None, help="store: SQLite path or postgresql:// DSN")
    commands = parser.add_subparsers(dest="command", required=True)

    def command(name: str, handler, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[common], help=help)
        sub.set_defaults(handler=handler)
        return sub

    sub = command("create-account", _create_account, "create an account")
    sub.add_argument("name")
    _limit_options(sub, default=None)
    sub.add_argument("--inactive", action="store_true", help="create it inactive")
    sub = command("create-key", _create_key, "create an API key (printed once)")
    sub.add_argument("account")
    command("list", _list, "list accounts and keys (no secrets)")
    command("bootstrap", _bootstrap, "make an empty store usable locally (prints a key)")
    sub = command("revoke", _revoke, "revoke an API key")
    sub.add_argument("key_id", type=int)
    sub = command("set-status", _set_status, "activate or deactivate an account")
    sub.add_argument("account")
    sub.add_argument("status", choices=["active", "inactive"])
    sub = command("set-limits", _set_limits, "change limits (omitted ones stay)")
    sub.add_argument("account")
    _limit_options(sub, default=KEEP)
    sub = command("usage", _usage, "show an account's token usage")
    sub.add_argument("account")
    return parser


def _limit_options(sub: argparse.ArgumentParser, default: object) -> None:
    period_default = "total" if default is None else default
    sub.add_argument("--models", type=_models_arg, default=default, help="a,b or all")
    sub.add_argument("--rpm", type=_limit_arg, default=default, help="requests/minute or none")
    sub.add_argument("--tpm", type=_limit_arg, default=default, help="tokens/minute or none")
    sub.add_argument("--quota", type=_limit_arg, default=default, help="token budget or none")
    sub.add_argument("--quota-period", choices=PERIODS, default=period_default)


if __name__ == "__main__":
    sys.exit(main())
