"""Cancellation and bounded work: a caller that gives up frees the scorer within a second.

The real ``DecisionService`` on the tiny model, driven the way Serve drives it: the request's
asyncio task is cancelled when the caller times out or disconnects.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial

import pytest

from serve_app.api.decisions import DecisionRequest
from serve_app.engine_config import EngineConfig
from serve_app.errors import UnprocessableRequestError
from serve_app.models.loader import LoadedModel, load_model
from serve_app.serving.billing import (
    CLIENT_GONE,
    BilledCall,
    RequestContext,
    UsageMeter,
    UsageRecorder,
)
from serve_app.serving.decisions import DecisionService
from serve_app.serving.scoring import DecisionBudget, DecisionQuestion, LikelihoodScorer

LABELS = {f"l{i}": None for i in range(255)}


@pytest.fixture(scope="module")
def tiny() -> LoadedModel:
    return load_model("tiny", threads=1)


def heavy_body() -> DecisionRequest:
    """64 questions of 40 labels, one row per batch: seconds of work on the tiny model."""
    labels = dict(list(LABELS.items())[:40])
    questions = {
        f"q{i}": {"type": "choice", "instructions": f"Pick {i}.", "criteria": labels}
        for i in range(64)
    }
    return DecisionRequest(model="m", state={"log": "line " * 200}, questions=questions)


def small_body() -> DecisionRequest:
    questions = {"ok": {"type": "noul", "instructions": "The state is small."}}
    return DecisionRequest(model="m", state="small", questions=questions)


@pytest.mark.parametrize("runner", ["hf", "auto"])  # the HF forward, the engine's runner
def test_cancelled_request_frees_the_scorer_within_a_second(tiny: LoadedModel, runner: str) -> None:
    scorer = LikelihoodScorer.for_model(
        tiny,
        EngineConfig(runner=runner),
        8192,
        pack_tokens=1,  # one question per forward pass
        budget=DecisionBudget(max_scored_tokens=10**7, max_input_bytes=10**7),
    )
    engine = scorer.engine
    service = DecisionService(scorer)
    rows: list[tuple[int, int, int]] = []

    async def write(context: RequestContext, input_tokens: int, output_tokens: int, status: int):
        rows.append((input_tokens, output_tokens, status))

    recorder = UsageRecorder(write, timeout_s=600)
    context = RequestContext(grant=None, model="m", endpoint="decisions", cache_salt="account-1")

    async def scenario() -> tuple[int, float]:
        heavy = asyncio.create_task(recorder.run(context, partial(service.decide, heavy_body())))
        while not engine.stats().scored_tokens:
            assert not heavy.done(), heavy.exception()  # it runs, and has run the state
            await asyncio.sleep(0.01)
        assert not heavy.done()  # 64 passes still to go
        steps_at_cancel = engine.stats().steps
        heavy.cancel()
        cancelled_at = time.perf_counter()
        with pytest.raises(asyncio.CancelledError):
            await heavy
        assert await engine.wait_until_idle(timeout=30)
        steps = engine.stats().steps - steps_at_cancel
        answer = await service.decide(small_body(), BilledCall(context, UsageMeter()))
        assert answer.usage.input_tokens > 0
        return steps, time.perf_counter() - cancelled_at

    # Freed within the step under way (its pass stops between layers) and the next, which
    # reaps it: counted in steps, so it holds on any CPU however loaded; the seconds are the
    # same bound for a person, with the room a shared 2-core box needs.
    steps, answered = asyncio.run(scenario())
    assert steps <= 2, steps
    assert answered < 5.0, answered
    # The stopped request's work is billed (499: its caller went away): some ran, and it
    # stopped before reading any answer (a finished request reads at least one per question).
    assert len(rows) == 1
    input_tokens, output_tokens, status = rows[0]
    assert input_tokens > 0 and output_tokens == 0 and status == CLIENT_GONE


def test_scored_token_budget_is_checked_before_any_forward(tiny: LoadedModel) -> None:
    scorer = LikelihoodScorer.for_model(
        tiny, EngineConfig(), 8192, budget=DecisionBudget(max_scored_tokens=500)
    )
    questions = [DecisionQuestion("q", "choice", "Pick one.", LABELS)]
    with pytest.raises(UnprocessableRequestError) as caught:
        asyncio.run(scorer.score("state", questions, cache_salt="test"))
    assert "max_scored_tokens" in caught.value.message and "500" in caught.value.message
    assert scorer.engine.stats().prefill_tokens == 0  # refused before the state ran


def test_input_bytes_are_checked_before_tokenisation(tiny: LoadedModel) -> None:
    scorer = LikelihoodScorer.for_model(
        tiny, EngineConfig(), 8192, budget=DecisionBudget(max_input_bytes=10_000)
    )
    started = time.perf_counter()
    with pytest.raises(UnprocessableRequestError) as caught:
        asyncio.run(
            scorer.score(
                "x" * 3_000_000, [DecisionQuestion("q", "noul", "It is long.")], cache_salt="test"
            )
        )
    assert "max_input_bytes" in caught.value.message and "10000" in caught.value.message
    assert time.perf_counter() - started < 0.5  # 3 MB of tokenisation would take seconds
