"""The ledger against what every client was told: rows matched per account, request by request."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.soak import BROKE, CODE_STATUS, LIMITED, REFUSED
from bench.soak.calls import Call


@dataclass
class LedgerCheck:
    """Rows against calls: ``missing``, calls that should have a row and have none;
    ``doubled``, rows no call accounts for (account, endpoint, status, input, output tokens,
    created_at); ``matched`` rows, of which ``unanswered`` are of requests whose client got
    no answer (the router died under them): work the model side did and billed."""

    matched: int = 0
    missing: list[Call] = field(default_factory=list)
    doubled: list[tuple] = field(default_factory=list)
    unanswered: list = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.missing and not self.doubled

    def line(self) -> str:
        unanswered = ""
        if self.unanswered:
            tokens = sum(r.input_tokens + r.output_tokens for r in self.unanswered)
            unanswered = f" ({len(self.unanswered)} of unanswered requests, {tokens} tokens)"
        return (
            f"{self.matched} rows matched{unanswered}, {len(self.missing)} missing, "
            f"{len(self.doubled)} doubled"
        )


def ledger_rows(db: str, names: list[str], since: float = 0.0) -> dict[str, list]:
    """Each account's rows written from ``since`` (the store's clock, ``time.time()``)."""
    from serve_app.auth.store import open_store

    store = open_store(db)
    try:
        return {
            name: [
                row
                for row in store.list_usage(store.get_account_by_name(name).id, limit=1_000_000)
                if row.created_at >= since
            ]
            for name in names
        }
    finally:
        store.close()


def refused_before_admission(call: Call) -> bool:
    return call.status in REFUSED


def check_ledger(
    calls: list[Call], rows_by_account: dict[str, list], late_s: float = 360.0,
    refused: Callable[[Call], bool] = refused_before_admission,
) -> LedgerCheck:  # fmt: skip
    """Match every call to at most one row, in order of strictness (module docstring): the
    earliest row that fits, written from the call's start to ``late_s`` after it (a replica
    whose router died goes on to its deadline; a spooled row comes seconds later). A call
    ``refused`` must have no row: one it left is counted doubled."""
    result = LedgerCheck()
    for account, rows in rows_by_account.items():
        left = sorted(rows, key=lambda row: row.created_at)
        mine = sorted((c for c in calls if c.account == account), key=lambda c: c.started)

        def take(
            predicate: Callable[[Any], bool], into: list | None = None, left: list = left
        ) -> bool:
            for index, row in enumerate(left):
                if predicate(row):
                    del left[index]
                    result.matched += 1
                    if into is not None:
                        into.append(row)
                    return True
            return False

        def fits(row: Any, call: Call) -> bool:
            return call.started - 1.0 <= row.created_at <= call.started + late_s

        told = [c for c in mine if c.usage is not None and not c.cancelled and not c.failure]
        for call in told:  # a whole answer (200) or a cut stream (its error's status)

            def same(r: Any, c: Call = call) -> bool:
                counts = (r.endpoint, r.input_tokens, r.output_tokens)
                return counts == (c.endpoint, *c.usage) and fits(r, c)

            found = take(lambda r, c=call: same(r) and (r.status == 200) == (not c.error_event))
            # a cut stream whose replica had billed exactly what got through, then died
            found = found or (call.error_event and take(same))
            if not found:
                result.missing.append(call)
        for call in [c for c in mine if c.cancelled]:  # the client left: 499, or done first
            if not take(
                lambda r, c=call: r.endpoint == c.endpoint and r.status in (499, 200) and fits(r, c)
            ):
                result.missing.append(call)
        told_ids = {id(c) for c in told}
        unknown = [c for c in mine if id(c) not in told_ids and not c.cancelled and not refused(c)]
        for call in unknown:  # admitted errors: a row of what was processed, or none
            if call.failure is None and call.status != 500:
                status = CODE_STATUS.get(call.code or "", 0) if call.error_event else call.status
                take(
                    lambda r, c=call, s=status: (
                        r.endpoint == c.endpoint and r.status in (s, 499) and fits(r, c)
                    )
                )
            # no answer at all (its router died): the model side bills what it processed
            elif take(lambda r, c=call: r.endpoint == c.endpoint and fits(r, c), result.unanswered):
                pass
        result.doubled += [
            (account, r.endpoint, r.status, r.input_tokens, r.output_tokens, r.created_at)
            for r in left
        ]
    return result


def settled_ledger(
    db: str, calls: list[Call], wait_s: float = 45.0,
    refused: Callable[[Call], bool] = refused_before_admission,
) -> LedgerCheck:  # fmt: skip
    """The check once the rows stopped coming (replica spools flush every 5 s)."""
    names = sorted({c.account for c in calls} | {BROKE, LIMITED})
    since = min((c.started for c in calls), default=0.0)  # rows of earlier runs on the graph
    deadline = time.monotonic() + wait_s
    while True:
        check = check_ledger(calls, ledger_rows(db, names, since), refused=refused)
        if check.clean or time.monotonic() > deadline:
            return check
        time.sleep(2)
