"""The auth store taken away under the soak's traffic, then given back (issue 50, item 2).

PostgreSQL is stopped (``pg_ctl stop -m immediate``, a crash to its clients) and started
again; SQLite is held by another connection's ``BEGIN EXCLUSIVE``, then let go. What must
hold: a request that came while the store was away is refused (503 with Retry-After, or a
refusal that needs no store) and leaves no ledger row, so no work was done for it, or it
waits on SQLite's lock and is admitted once the store is back; a request admitted before
finishes; every admitted request's row lands once (spooled by its replica
while the store is away); new requests are admitted again within 10 s of the store's return.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from dataclasses import dataclass
from typing import Any

from bench.soak import REFUSED
from bench.soak.calls import Call
from bench.soak.ledger import LedgerCheck, settled_ledger
from bench.soak.run import five_xx
from bench.soak.traffic import Traffic

BACK_WITHIN_S = 10.0
ADMISSION_GRACE_S = 1.0  # a request sent this close to the outage may have been admitted


class SqliteHeld:
    """The SQLite file held by another connection's exclusive transaction: no reader or
    writer gets in until ``start``."""

    def __init__(self, path: str):
        self.path = path
        self.connection: sqlite3.Connection | None = None

    def stop(self) -> None:
        self.connection = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        self.connection.execute("BEGIN EXCLUSIVE")

    def start(self) -> None:
        if self.connection is not None:
            self.connection.execute("ROLLBACK")
            self.connection.close()
            self.connection = None


def refused_in_outage(call: Call) -> bool:
    """Answered without the model: a refusal before admission, or admission's own 503."""
    service_unavailable = call.status == 503 and call.code == "service_unavailable"
    return call.status in REFUSED or (service_unavailable and not call.error_event)


@dataclass
class OutageResult:
    store: str
    away: float  # time.time() the store went away
    back: float  # and came back
    calls: list[Call]
    ledger: LedgerCheck

    def verdict(self) -> dict[str, tuple[bool | None, str]]:
        during = [c for c in self.calls if self.away + ADMISSION_GRACE_S <= c.started < self.back]
        closed = [c for c in during if refused_in_outage(c) and (c.status != 503 or c.retry_after)]
        # SQLite makes a writer wait for the lock (busy_timeout): a request sent late in the
        # outage may be admitted once the store is back. One answered before it was: fail open.
        waited = [c for c in during if (c.ok or c.cancelled) and c.ended >= self.back]
        fail_open = [c for c in during if c.ok and c.ended < self.back]
        admitted = [c for c in self.calls if c.started < self.away <= c.ended]
        finished = [c for c in admitted if c.ok or c.cancelled]
        after = sorted((c for c in self.calls if c.started >= self.back), key=lambda c: c.started)
        first = next((c for c in after if c.ok), None)
        back_s = first.started - self.back if first else float("inf")
        refused_after = [c for c in after if refused_in_outage(c) and c.status == 503]
        last_refusal = max((c.ended - self.back for c in refused_after), default=0.0)
        undesigned = {k: v for k, v in five_xx(self.calls).items() if not k.startswith("503 ")}
        return {
            "fail closed": (
                not fail_open and len(closed) + len(waited) == len(during),
                f"of {len(during)} requests sent while it was away, {len(closed)} refused (503 "
                f"with Retry-After, or 429/402), {len(waited)} admitted after its return, "
                f"{len(fail_open)} answered before it; statuses {outcomes(during)}",
            ),
            "admitted finish": (
                len(finished) == len(admitted),
                f"{len(finished)} of {len(admitted)} in flight at the outage answered in full "
                f"(or closed by their client), statuses {outcomes(admitted)}",
            ),
            "ledger": (self.ledger.clean, self.ledger.line()),
            "back": (
                back_s <= BACK_WITHIN_S,
                f"first request admitted {back_s:.2f} s after the store's return; the last "
                f"503 ended {last_refusal:.2f} s after it",
            ),
            "5xx": (not undesigned, repr(dict(five_xx(self.calls)))),
        }


def outcomes(calls: list[Call]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for call in calls:
        counts[call.outcome] = counts.get(call.outcome, 0) + 1
    return counts


def store_outage(
    started: dict, store: Any, name: str, before_s: float = 60.0, down_s: float = 60.0,
    after_s: float = 60.0, tiny: bool = False,
) -> OutageResult:  # fmt: skip
    """The soak's traffic for ``before_s``, the store away for ``down_s`` (``store.stop``,
    ``store.start``), traffic for ``after_s`` more, then the ledger once it settles."""
    traffic = Traffic(started["url"], started["model"], started["keys"], tiny)
    traffic.start()
    refusals = threading.Thread(target=traffic.refusals, daemon=True)
    refusals.start()
    time.sleep(before_s)
    away = time.time()
    store.stop()
    print(f"{name} away at {time.strftime('%H:%M:%S', time.gmtime(away))}", flush=True)
    time.sleep(down_s)
    store.start()
    back = time.time()
    print(f"{name} back after {back - away:.1f} s", flush=True)
    time.sleep(after_s)
    traffic.finish()
    calls = traffic.snapshot()
    ledger = settled_ledger(started["db"], calls, refused=refused_in_outage)
    return OutageResult(name, away, back, calls, ledger)
