"""The decision scorer on the engine's runner: the same probabilities as on the HF model.

Both scorers are built the way ``deployments/scorer.py`` builds them: a scoring engine on the
generating deployments' engine options (``runner: auto`` or ``hf``), with dense weights.
Weights are redrawn with std 0.3 (as in test_runner) so that answers depend on the prompt and
a wrong position, mask or KV column shows up in the probabilities.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
import torch

from serve_app.engine_config import EngineConfig
from serve_app.models.loader import LoadedModel, load_model
from serve_app.runner.builder import build_runner, configured_runner
from serve_app.runner.qwen2 import Qwen2Runner
from serve_app.serving.scoring import DecisionQuestion, LikelihoodScorer

STATE = {"ticket": "Login fails after the deploy", "customer": {"plan": "pro", "seats": 12}}
TOLERANCE = 1e-4
INT8_TOLERANCE = 0.2


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    lm = load_model("tiny:" + str(tmp_path_factory.mktemp("tiny")), threads=1)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in lm.model.parameters():
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return dataclasses.replace(lm)


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def scorer(loaded: LoadedModel, runner: str, **kwargs) -> LikelihoodScorer:
    """As the scorer deployment builds it from ``config.engine``."""
    # int4 decode weights: prompts stay dense (prompt_weights auto), so the scorer runs dense;
    # in fp32, the HF scorer's numbers (auto would read bf16 on AVX512-BF16/AMX CPUs).
    options = EngineConfig(runner=runner, weights="int4", prefill_dtype="float32")
    return LikelihoodScorer.for_model(loaded, options, 16384, **kwargs)


def questions() -> list[DecisionQuestion]:
    """noul, a fast choice (distinct first tokens), multi-token labels sharing prefixes, 255
    labels, and a score: every path of the trie layout."""
    return [
        DecisionQuestion("bug", "noul", "The ticket reports a defect.", {"true": "a bug"}),
        DecisionQuestion("fast", "choice", "Pick one.", {"A": "one", "B": "two"}),
        DecisionQuestion("slow", "choice", None, {"label1": None, "label2": "x", "lab": {"k": 1}}),
        DecisionQuestion("many", "choice", "Pick.", {f"opt{i}": None for i in range(255)}),
        DecisionQuestion("severity", "score", "How bad?", ["minor", "major", "critical"]),
    ]


def assert_same(got, want) -> float:
    """Every probability within TOLERANCE; returns the largest difference."""
    worst = 0.0
    assert list(got.outcomes) == list(want.outcomes)
    for name, outcome in want.outcomes.items():
        assert list(got.outcomes[name].probabilities) == list(outcome.probabilities)
        for option, p in outcome.probabilities.items():
            diff = abs(got.outcomes[name].probabilities[option] - p)
            assert diff <= TOLERANCE, (name, option, diff)
            worst = max(worst, diff)
    return worst


def test_runner_is_used_where_the_engine_uses_it(loaded: LoadedModel) -> None:
    """One decision for the engine and the scorer: hf falls back, auto runs the runner, and
    the scorer reads prompts on the weights the engine reads them on."""
    assert configured_runner(loaded, EngineConfig(runner="hf").for_scoring(0), "scorer") is None
    options = EngineConfig(runner="auto", weights="int4")
    runner = configured_runner(loaded, options.for_scoring(0), "scorer")
    assert isinstance(runner, Qwen2Runner) and not runner.quantized_prompts
    assert all(layer.qkv.int4 is None for layer in runner.layers)  # dense: nothing packed
    options = EngineConfig(runner="auto", weights="int8", prompt_weights="auto")
    runner = configured_runner(loaded, options.for_scoring(0), "scorer")
    assert runner.quantized_prompts and runner.decode_weights == "int8"
    options = EngineConfig(runner="auto", weights="int8", prompt_weights="dense")
    assert configured_runner(loaded, options.for_scoring(0), "scorer").decode_weights == "dense"


def test_scorer_on_int8_prompts_stays_near_the_dense_answers(loaded: LoadedModel) -> None:
    """int8 prompt weights (what ``auto`` picks on AVX2): every probability near the HF
    scorer's, usage identical, and a prefix-cache hit answers as the cold run did."""
    options = EngineConfig(runner="auto", weights="int8", prompt_weights="decode")
    quantized = LikelihoodScorer.for_model(loaded, options, 16384)
    want = run(scorer(loaded, "hf").score(STATE, questions(), cache_salt="test"))
    cold = run(quantized.score(STATE, questions(), cache_salt="test"))
    assert (cold.input_tokens, cold.output_tokens) == (want.input_tokens, want.output_tokens)
    worst = max(
        abs(cold.outcomes[name].probabilities[option] - p)
        for name, outcome in want.outcomes.items()
        for option, p in outcome.probabilities.items()
    )
    assert worst < INT8_TOLERANCE, worst  # measured 0.10; 0.50 with position 0's KV x1.5
    assert all(cold.outcomes[name].best == outcome.best for name, outcome in want.outcomes.items())
    warm = run(quantized.score(STATE, questions(), cache_salt="test"))
    assert warm.cached_tokens > 0
    assert_same(warm, cold)


@pytest.mark.parametrize("pack_tokens", [2048, 48])
def test_runner_scorer_matches_hf_scorer(loaded: LoadedModel, pack_tokens: int) -> None:
    """Cold, then a whole-state prefix-cache hit, then another state (only the fixed system
    turn cached; long enough to take several prefill forwards): the same probabilities and
    usage on both. ``pack_tokens`` 48 runs the questions in several passes over the slot."""
    hf = scorer(loaded, "hf", pack_tokens=pack_tokens)
    runner = scorer(loaded, "auto", pack_tokens=pack_tokens)
    worst, cached = 0.0, []
    for state in (STATE, STATE, {"log": "line " * 800}):
        want = run(hf.score(state, questions(), cache_salt="a"))
        got = run(runner.score(state, questions(), cache_salt="a"))
        worst = max(worst, assert_same(got, want))
        usage = (got.input_tokens, got.output_tokens, got.cached_tokens)
        assert usage == (want.input_tokens, want.output_tokens, want.cached_tokens)
        cached.append(got.cached_tokens)
    assert cached[0] == 0 and cached[1] > cached[2] > 0  # cold, whole state, system turn
    print(f"runner vs HF scorer, pack_tokens={pack_tokens}: max |dp| = {worst:.2e}")


def test_prefix_cache_entries_are_shared_between_the_two_forwards(loaded: LoadedModel) -> None:
    """A state cached by the runner scorer answers as a cold run does (its KV in the prefix
    cache is the runner's slot, copied out): the copy is not the live slot that later rows
    overwrite."""
    runner = scorer(loaded, "auto")
    cold = run(scorer(loaded, "hf").score(STATE, questions(), cache_salt="test"))
    run(
        runner.score(STATE, questions()[:1], cache_salt="test")
    )  # caches the state, then overwrites the slot's rows
    run(
        runner.score({"other": 1}, questions()[:2], cache_salt="test")
    )  # and another state over the same slot
    warm = run(runner.score(STATE, questions(), cache_salt="test"))
    assert warm.cached_tokens > 0
    assert_same(warm, cold)


def test_tree_forward_checks_before_every_layer(loaded: LoadedModel) -> None:
    """Cancellation stops a pass within one decoder layer: ``check`` runs before each."""
    runner = build_runner(loaded.model, weights="dense")
    cache = runner.new_cache(1, 16, 64)
    calls = []

    class Stop(Exception):
        pass

    def check() -> None:
        calls.append(1)
        if len(calls) == 2:
            raise Stop

    tokens = [1, 2, 3]
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    with torch.inference_mode(), pytest.raises(Stop):
        runner.forward_tree(cache, 0, 0, tokens, torch.arange(3), mask, check)
    assert len(calls) == 2  # the first layer ran, the second never started
    calls.clear()
    with torch.inference_mode():
        runner.forward_tree(cache, 0, 0, tokens, torch.arange(3), mask, lambda: calls.append(1))
    assert len(calls) == len(runner.layers)
