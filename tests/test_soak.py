"""bench.soak, short, on the tiny model: its traffic billed request by request, and each
deployment killed under load.

The session's graph (conftest's ``graph``: tests/graph.py's config, whose deadlines are the
soak's 30 s) with the soak's accounts, for both; the kills come last of the tests that use it:

- the soak's traffic for 30 s (three accounts' keystroke FIM, next-edit, apply, decisions and
  chat, 10% of streams closed by their client, designed 429s and 402s): every request the
  ledger should bill has exactly one row with the tokens its client was told, no row is
  unaccounted for, no 5xx, none past its deadline; the samples hold every replica's PSS and
  the prefix caches' bytes;
- then Router, AuthService, FimModel, EditModel and DecisionScorer in turn have their replicas'
  processes killed (SIGKILL) while long requests run on them and the traffic goes on: no
  request past its deadline, the ledger as above, each deployment running new replica processes
  within 60 s, and answering through them after that.
"""

from __future__ import annotations

import pytest

from bench.soak import DEPLOYMENTS, KILL_LIMITS, RECOVERY_S
from bench.soak.graph import make_accounts
from bench.soak.kills import kill_each, kill_verdict, print_kills
from bench.soak.run import print_soak, print_verdict, run_soak
from tests.graph import MODEL

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def soak_graph(graph: dict) -> dict:
    return {**graph, "model": MODEL, "keys": make_accounts(graph["db"])}


def test_soak_traffic_is_billed_request_by_request(soak_graph: dict) -> None:
    result = run_soak(soak_graph, minutes=0.5, sample_s=15, warmup=1, tiny=True, limits=KILL_LIMITS)
    print_soak(result)
    calls = result.calls
    assert {c.kind for c in calls} >= {"fim", "burst", "quota"}
    assert any(c.cancelled for c in calls), "no stream was closed by its client"
    assert {c.status for c in calls if c.kind in ("burst", "quota")} >= {429, 402}
    assert result.ledger.clean, (result.ledger.missing, result.ledger.doubled)
    assert result.ledger.matched > 0
    for name in ("ledger", "5xx", "past deadline", "designed 429/402"):
        assert result.verdict[name][0], result.verdict[name]
    last = result.samples[-1]
    assert {name.split("#")[0] for name in last.pss_kb} == set(DEPLOYMENTS), last.pss_kb
    assert {name.split("#")[0] for name in last.cache} >= {"FimModel", "EditModel"}, last.cache


def test_killing_each_deployment_under_load(soak_graph: dict) -> None:
    phases, calls = kill_each(soak_graph, tiny=True)
    print_kills(phases)
    verdict = kill_verdict(phases, calls)
    print_verdict(verdict)
    assert [p.deployment for p in phases] == list(DEPLOYMENTS)
    assert all(p.killed for p in phases), [(p.deployment, p.killed) for p in phases]
    assert any(p.in_flight for p in phases)
    assert all(p.back_s is not None for p in phases), [(p.deployment, p.back_s) for p in phases]
    for name in ("past deadline", f"running again within {RECOVERY_S:.0f} s", "ledger"):
        assert verdict[name][0], verdict[name]
