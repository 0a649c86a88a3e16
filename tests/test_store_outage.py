"""The auth store goes away under a running request, through the real router app on the tiny
model (SQLite, held locked by another connection, as a stuck writer holds it):

- a new request fails closed: 503 with Retry-After, no model work;
- a request admitted before finishes, its answer delivered in full;
- its ledger row, kept in the replica's spool meanwhile, is written once the store is back,
  once, with the usage its client was told.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from serve_app.auth.sqlite import SQLiteAuthStore
from serve_app.serving import billing
from tests.conftest import AUTH, TEST_KEY, TINY_ID, tiny_config


def test_admitted_requests_finish_and_are_billed_once_the_store_is_back(
    tiny_source: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient

    from serve_app.testing import local_router_app

    monkeypatch.setattr(billing, "SPOOL_FLUSH_S", 0.5)
    config = tiny_config(tiny_source, tmp_path / "data")
    os.environ["SERVE_APP_API_KEY"] = TEST_KEY
    body = {"model": TINY_ID, "prompt": "def f(", "max_tokens": 64, "stream": True}
    body |= {"stream_options": {"include_usage": True}}
    with TestClient(local_router_app(config), raise_server_exceptions=False) as client:
        warm = client.post("/v1/fim/completions", json={**body, "stream": False}, headers=AUTH)
        assert warm.status_code == 200, warm.text
        store = SQLiteAuthStore(config.auth_db)
        (account,) = store.list_accounts()
        before = len(store.list_usage(account.id))
        with client.stream("POST", "/v1/fim/completions", json=body, headers=AUTH) as stream:
            assert stream.status_code == 200
            lines = stream.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            holder = sqlite3.connect(config.auth_db, isolation_level=None)
            holder.execute("BEGIN EXCLUSIVE")  # the store goes away mid-answer
            try:
                rest = [line for line in lines if line.startswith("data: ")]
                refused = client.post("/v1/fim/completions", json={**body, "stream": False},
                                      headers=AUTH)  # fmt: skip
            finally:
                holder.rollback()
        assert rest[-1] == "data: [DONE]" and json.loads(first[6:])["choices"]
        usage = json.loads(rest[-2][6:])["usage"]
        assert refused.status_code == 503 and "retry-after" in refused.headers
        deadline = time.monotonic() + 30
        while len(store.list_usage(account.id)) == before:
            assert time.monotonic() < deadline, "the spooled row never reached the store"
            time.sleep(0.2)
        time.sleep(1.5)  # flushes go on: the row is not written twice
        (row,) = store.list_usage(account.id)[: len(store.list_usage(account.id)) - before]
        assert (row.status, row.input_tokens, row.output_tokens) == (
            200,
            usage["prompt_tokens"],
            usage["completion_tokens"],
        )
        assert len(store.list_usage(account.id)) == before + 1
        store.close()
