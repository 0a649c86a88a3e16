"""Decisions on the embedded model over HTTP: calibrated where the answer is plain."""

from __future__ import annotations

import math

import pytest

from tests.conftest import AUTH, EMBEDDED_ID

pytestmark = pytest.mark.embedded

STATE = {
    "ticket": "The login page returns HTTP 500 since this morning's deploy.",
    "reporter": "Dana, support lead",
    "customers_affected": 1200,
}


def decide(client, questions: dict, state=STATE) -> dict:
    body = {"model": EMBEDDED_ID, "state": state, "questions": questions}
    response = client.post("/v1/decisions", json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    return response.json()


def test_plain_statement_and_its_negation(embedded_client):
    answers = decide(
        embedded_client,
        {
            "in_france": {"type": "noul", "instructions": "The city is in France."},
            "not_in_france": {"type": "noul", "instructions": "The city is not in France."},
        },
        state={"city": "Paris", "country": "France", "temperature_celsius": 31},
    )["answers"]
    assert answers["in_france"]["noul"] > 0.5
    assert answers["not_in_france"]["noul"] < 0.5


def test_readme_example_and_its_false_twin_fall_on_either_side(embedded_client):
    """The README's own example (0.30 before calibration, issue 14) and the same claim about
    a ticket that reports no defect."""
    question = {"is_bug": {"type": "noul", "instructions": "The ticket reports a software defect."}}
    defect = {
        "ticket": "Login page returns HTTP 500 after the last deploy",
        "customer": "enterprise",
    }
    request = {"ticket": "Please send me a copy of last year's invoices.", "customer": "enterprise"}
    yes = decide(embedded_client, question, state=defect)["answers"]["is_bug"]["noul"]
    no = decide(embedded_client, question, state=request)["answers"]["is_bug"]["noul"]
    assert yes > 0.5 > no, (yes, no)


def test_an_answer_does_not_move_with_the_other_questions_or_the_cache(embedded_client):
    """The README's example asked alone, with its two other questions (packed into the same
    pass) and again (the state from the prefix cache): one number. Read with one int8
    rounding per activation it was 0.56 alone, 0.45 with both others, 0.70 with the choice."""
    state = {"ticket": "Login page returns HTTP 500 after the last deploy", "id": "moves"}
    is_bug = {"is_bug": {"type": "noul", "instructions": "The ticket reports a software defect."}}
    others = {
        "team": {"type": "choice", "criteria": {"backend": "server-side", "frontend": "UI"}},
        "severity": {"type": "score", "criteria": ["trivial", "minor", "major", "critical"]},
    }
    answers = [
        decide(embedded_client, questions, state=state)["answers"]["is_bug"]["noul"]
        for questions in (is_bug, is_bug | others, {"team": others["team"]} | is_bug, is_bug)
    ]
    assert max(answers) - min(answers) < 0.01, answers


def test_obvious_choice_ranks_first(embedded_client):
    answer = decide(
        embedded_client,
        {
            "status": {
                "type": "choice",
                "instructions": "Which HTTP status does the login page return?",
                "criteria": {"200": "OK", "404": "Not Found", "500": "Server Error"},
            }
        },
    )["answers"]["status"]
    assert answer["choice"] == "500"
    assert math.isclose(sum(answer["probabilities"].values()), 1.0, abs_tol=1e-6)


def test_score_orders_high_and_low(embedded_client):
    levels = ["none", "a few", "hundreds", "thousands"]
    many = decide(
        embedded_client,
        {
            "reach": {
                "type": "score",
                "instructions": "How many customers are affected?",
                "criteria": levels,
            }
        },
    )["answers"]["reach"]
    few = decide(
        embedded_client,
        {
            "reach": {
                "type": "score",
                "instructions": "How many customers are affected?",
                "criteria": levels,
            }
        },
        state={**STATE, "customers_affected": 0},
    )["answers"]["reach"]
    assert many["score"] > few["score"]


def test_ten_questions_share_one_state(embedded_client):
    questions = {
        f"q{i}": {"type": "noul", "instructions": f"More than {i * 200} customers are affected."}
        for i in range(10)
    }
    body = decide(embedded_client, questions, state={"id": "ten", **STATE})
    assert set(body["answers"]) == set(questions)
    single = decide(embedded_client, {"q0": questions["q0"]}, state={"id": "one", **STATE})
    # The shared state is encoded once: ten questions cost far less than ten single requests.
    assert body["usage"]["input_tokens"] < 0.6 * 10 * single["usage"]["input_tokens"]
