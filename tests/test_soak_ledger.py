"""bench.soak's ledger check on rows of the real record type, without a graph: each kind
of call finds its one row, a row nobody accounts for is doubled, a call without its row is
missing."""

from __future__ import annotations

from bench.soak.calls import Call
from bench.soak.ledger import check_ledger
from serve_app.auth.records import UsageRecord

T0 = 1_800_000_000.0


def row(endpoint: str, tokens: tuple[int, int], status: int, at: float) -> UsageRecord:
    return UsageRecord(
        "m", endpoint, *tokens, status, f"r{at}", account_id=1, key_id=1, created_at=T0 + at
    )


def call(path: str, at: float, **fields) -> Call:
    fields = {"status": 200, "seconds": 1.0, **fields}
    return Call("a", "fim", path, bool(fields.pop("stream", False)), T0 + at, **fields)


FIM, CHAT = "/v1/fim/completions", "/v1/chat/completions"


def test_every_kind_of_call_finds_its_one_row() -> None:
    calls = [
        call(FIM, 0, usage=(10, 4)),  # a whole answer
        call(CHAT, 1, stream=True, usage=(8, 30), error_event=True, code="service_unavailable"),
        call(CHAT, 2, stream=True, usage=(8, 60), error_event=True, code="service_unavailable"),
        call(FIM, 3, stream=True, cancelled=True, text_events=1),  # the client left
        call(FIM, 4, status=500, code="text: 'Internal Server Error'"),  # its router died
        call(FIM, 5, status=429, code="rate_limit_reached"),  # refused: no row
        call(CHAT, 6, stream=True, error_event=True, code="timeout"),  # past its deadline
    ]
    rows = [
        row("fim.completions", (10, 4), 200, 0.5),
        row("chat.completions", (8, 30), 503, 2.0),  # the router's delivered row
        row("chat.completions", (8, 60), 200, 2.5),  # the replica billed all that got through
        row("fim.completions", (12, 9), 499, 3.2),
        row("fim.completions", (12, 16), 200, 9.0),  # the model side finished it
        row("chat.completions", (8, 90), 504, 36.0),
    ]
    check = check_ledger(calls, {"a": rows})
    assert check.clean and check.matched == 6, (check.missing, check.doubled)
    assert [r.output_tokens for r in check.unanswered] == [16]


def test_a_row_nobody_accounts_for_is_doubled_and_a_lost_one_missing() -> None:
    calls = [call(FIM, 0, usage=(10, 4)), call(FIM, 10, usage=(10, 5))]
    rows = [
        row("fim.completions", (10, 4), 200, 0.5),
        row("fim.completions", (10, 4), 200, 0.6),  # billed twice
        row("fim.completions", (10, 6), 200, 10.5),  # not what the client was told
    ]
    check = check_ledger(calls, {"a": rows})
    assert [c.usage for c in check.missing] == [(10, 5)]
    assert sorted(d[4] for d in check.doubled) == [4, 6]
