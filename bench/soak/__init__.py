"""Soak: mixed client traffic for minutes against the real graph, and each deployment killed.

    .venv/bin/python -m bench.soak --minutes 30 --warmup 3  # embedded 0.5B, configs/local.yaml
    .venv/bin/python -m bench.soak --minutes 3 --tiny       # the tiny random model, a quick check
    .venv/bin/python -m bench.soak --kill [--tiny]          # kill -9 each deployment in turn
    .venv/bin/python -m bench.soak --outage postgres|sqlite # the auth store away a minute
    ... --dump run.json                                     # every call and ledger row, as JSON

Figures and what they showed: docs/operations.md (Reliability).

It starts its own ``serve run`` (tests/graph.py) on configs/local.yaml. Embedded: the models,
roles, engine and deployments as local.yaml declares them, except that every role runs the
0.5B (the 1.5B local.yaml names for FIM and decisions is not installed on the soak box; the
file itself says to name the 0.5B for FIM on an AVX2 CPU). ``--tiny``: tests/graph.py's tiny
random model, two Router and two AuthService replicas.

Traffic (``Traffic``): one closed-loop user per account, three accounts (``soak-a`` sends as
Continue, ``soak-b`` as Zed, ``soak-c`` as Kilo Code/ProxyAI): a keystroke FIM session (the
prefix grows by a character a request, same file, streamed every other request), then one of
next-edit, apply, decisions or chat (streamed); beside them an applier sends applies in a loop,
as Continue and ProxyAI in turn, so apply's p99 rests on hundreds of requests. One stream in
``CANCEL_SHARE`` is closed by the client after its first text. Designed refusals: once an
interval ``soak-rate`` (5 requests a minute) sends short FIM requests until it gets two 429s,
and ``soak-quota``, whose quota is spent, one request (402).

Every interval (``--sample-s``, a minute): each replica's PSS (``/proc/PID/smaps_rollup`` of
the ``ray::ServeReplica:llm:<Deployment>`` processes of this graph), each prefix cache's bytes
(``ray_serve_app_engine_prefix_cache_bytes`` on Ray's Prometheus endpoint), p50/p99 per kind
of request (200s, not cancelled), 5xx by kind (status and code; a stream's error event counts
as its code), the load average. At the end the ledger (usage_ledger) against what every
client was told (``check_ledger``): rows are matched per account to the requests, a whole
answer by (endpoint, status 200, input, output tokens), a cut stream by its usage chunk, a
cancelled stream by one 499 (or 200, when it finished first) row, an error after admission
by one row of its status (or none), a refusal by none, a request whose router died under it
by one row of what the model side processed ("unanswered"). The ledger's request id is the
router's own (not the ``x-request-id`` a client sees), so the match is by these multisets: a
missing row is a request left unmatched, a doubled one a row no request accounts for.

The verdict is issue 50's: p99 per kind over the last 5 intervals at most 1.3x the first 5
after warm-up; no replica's PSS more than 5% over its value at the end of warm-up; 0 ledger
rows missing or doubled; no 5xx but designed 503s; no request past its deadline.

``--kill``: the same traffic runs; each of Router, AuthService, FimModel, EditModel and
DecisionScorer in turn has every replica's OS process killed with SIGKILL while long requests
run on it; printed per deployment: the in-flight requests' outcomes, seconds until Serve runs
the deployment's replicas again (new processes) and a request through it answers 200, and the
ledger check of the requests started in its phase. Request deadlines are 30 s (60 s for
decisions) there, as tests/test_cluster.py's, so a hang shows within a minute.
tests/test_soak.py runs both, short, on the tiny model.

The package: ``calls`` (what a client got), ``traffic``, ``graph`` (the graph, its accounts,
PSS and cache bytes), ``ledger`` (the check), ``run`` (the soak and its verdict), ``kills``,
``outage`` (the store taken away), ``__main__`` (the command). The settings below are
shared by them.
"""

from __future__ import annotations

DEPLOYMENTS = ("Router", "AuthService", "FimModel", "EditModel", "DecisionScorer")
EMBEDDED = "qwen2.5-coder-0.5b"
REPLICA_TITLE = "ray::ServeReplica:llm:"
CACHE_METRIC = "ray_serve_app_engine_prefix_cache_bytes"
CANCEL_SHARE = 0.1
KEYSTROKES = 6
KEYSTROKE_GAP_S = 0.15
APPLY_GAP_S = 1.0  # the applier's pause between applies
WINDOW = 5  # intervals compared at the start and the end
P99_RATIO = 1.3
PSS_GROWTH = 0.05
BACKSTOP_GRACE_S = 5.0  # serve_app.http.app: the router answers this long past a deadline
HANG_MARGIN_S = 15.0  # past deadline + grace: a hang, not a slow answer
KILL_LIMITS = {"request_timeout_s": 30, "decision_timeout_s": 60}
RECOVERY_S = 60.0
REFUSED = (401, 402, 429)  # answered before admission: no ledger row
ACCOUNTS = ("soak-a", "soak-b", "soak-c")
LIMITED = "soak-rate"  # a request rate limit it goes over once an interval
LIMITED_RPM = 5
BROKE = "soak-quota"  # a spent quota
# an error event's code, and the status its ledger row records
CODE_STATUS = {"timeout": 504, "service_unavailable": 503, "bad_gateway": 502}
LEDGER_ENDPOINTS = {
    "/v1/fim/completions": "fim.completions",
    "/v1/completions": "fim.completions",
    "/v1/edit/completions": "edit.completions",
    "/v1/chat/completions": "chat.completions",
    "/v1/apply/completions": "apply.completions",
    "/v1/decisions": "decisions",
}
