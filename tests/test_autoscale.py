"""Independent autoscaling on the real graph, read from Serve's own status.

A graph of its own (``serve run`` on configs/local.yaml with the tiny model, FimModel scaling
1..3 at one ongoing request per replica on seconds-long delays: ``bench.autoscale``): a burst
of FIM requests, half of them streamed, takes FimModel to 3 RUNNING replicas; one client at a
time afterwards lets it scale back to 1 while requests still run. The Router, AuthService,
EditModel and DecisionScorer keep their replica counts throughout, and every request, during
scale-up and scale-down alike, answers 200 with its whole answer.
``python -m bench.autoscale`` runs the same scenario and prints the timeline.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from bench.autoscale import FIM, autoscaling_fim, report, run_scenario
from tests.conftest import TEST_KEY
from tests.graph import MODEL, start_graph
from tests.ray_admin import RayAdmin

pytestmark = pytest.mark.ray

FIXED = {"Router": 2, "AuthService": 2, "EditModel": 1, "DecisionScorer": 1}


@pytest.fixture(scope="module")
def scaling_graph(tiny_source: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    workdir = tmp_path_factory.mktemp("autoscale")
    yield from start_graph(tiny_source, workdir, autoscaling_fim)


def test_fim_scales_to_three_and_back_while_the_rest_keep_their_replicas(scaling_graph):
    admin = RayAdmin(scaling_graph["ray_address"])
    try:
        wait_for_counts(admin, {**FIXED, FIM: 1})
        scenario = run_scenario(scaling_graph["url"], TEST_KEY, MODEL, admin.replica_counts)
    finally:
        admin.close()
    report("autoscaling test", scenario)  # shown with -s, and on failure

    fim = scenario.counts(FIM)
    assert max(fim) == 3, scenario.changes()
    assert fim[-1] == 1, scenario.changes()
    peak = fim.index(3)
    assert 1 in fim[peak:], "FimModel did not return to 1 replica"
    for name, count in FIXED.items():
        assert set(scenario.counts(name)) == {count}, (name, scenario.changes())

    burst = [o for o in scenario.outcomes if o.phase == "burst"]
    trickle = [o for o in scenario.outcomes if o.phase == "trickle"]
    assert burst and trickle and any(o.streamed for o in burst)
    # no request failed or came back cut short while replicas started or stopped
    failed = [o for o in scenario.outcomes if o.status != 200 or o.error or o.tokens == 0]
    assert not failed, failed[:5]
    # the burst stopped with replicas to spare: the scale-down happened under requests (the
    # burst's last ones, then the trickle's), however long the last burst requests took
    stopped = scenario.burst_stopped_s
    after_burst = [counts.get(FIM, 0) for at, counts in scenario.samples if at >= stopped]
    assert after_burst[0] > 1, scenario.changes()


def wait_for_counts(admin: RayAdmin, expected: dict[str, int], timeout_s: float = 120) -> None:
    """The graph answers once one replica of each serves; the others may still be starting."""
    deadline = time.monotonic() + timeout_s
    while (counts := admin.replica_counts()) != expected and time.monotonic() < deadline:
        time.sleep(0.5)
    assert counts == expected
