"""Each sampling rule pinned on hand-made logits and on the tiny model's real logits."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.engine.protocol import SamplingParams
from serve_app.engine.sampling import (
    FrequencyPresencePenalty,
    RepetitionPenalty,
    Sampler,
    Temperature,
    TokenHistory,
    TopK,
    TopP,
    build_processors,
)
from serve_app.models.tiny import build_tiny_model


@pytest.fixture(scope="module")
def tiny_logits(tmp_path_factory: pytest.TempPathFactory) -> torch.Tensor:
    """The tiny model's next-token logits after a short prompt (a real, wide row)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tiny_model(tmp_path_factory.getbasetemp() / "tiny-model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = tokenizer("def fibonacci(n):", return_tensors="pt").input_ids
    with torch.no_grad():
        return model(ids).logits[0, -1].float()


def history(prompt: list[int] = (), output: list[int] = ()) -> TokenHistory:
    h = TokenHistory(prompt_ids=list(prompt))
    for token in output:
        h.append(token)
    return h


def kept(logits: torch.Tensor) -> set[int]:
    return set(torch.isfinite(logits).nonzero().flatten().tolist())


# -- TokenHistory ---------------------------------------------------------------------------


def test_history_counts_are_incremental() -> None:
    h = TokenHistory(prompt_ids=[5, 6], output_ids=[1])
    h.append(1)
    h.append(2)
    assert h.output_ids == [1, 1, 2]
    assert h.output_counts == {1: 2, 2: 1}
    assert h.seen_ids == {1, 2, 5, 6}


# -- Penalties ------------------------------------------------------------------------------


def test_repetition_penalty_divides_positive_and_multiplies_negative() -> None:
    logits = torch.tensor([2.0, -2.0, 1.0, 0.5])
    out = RepetitionPenalty(2.0)(logits, history(prompt=[0], output=[1, 1]))
    assert out.tolist() == [1.0, -4.0, 1.0, 0.5]  # prompt and output tokens, once each
    assert logits.tolist() == [2.0, -2.0, 1.0, 0.5]  # input untouched


def test_repetition_penalty_below_one_favours_seen_tokens() -> None:
    out = RepetitionPenalty(0.5)(torch.tensor([2.0, -2.0, 1.0]), history(prompt=[0, 1]))
    assert out.tolist() == [4.0, -1.0, 1.0]


def test_repetition_penalty_on_real_logits(tiny_logits: torch.Tensor) -> None:
    top, bottom = int(tiny_logits.argmax()), int(tiny_logits.argmin())
    assert tiny_logits[top] > 0 > tiny_logits[bottom]
    out = RepetitionPenalty(1.3)(tiny_logits, history(prompt=[top], output=[bottom]))
    assert out[top] == pytest.approx(tiny_logits[top] / 1.3)
    assert out[bottom] == pytest.approx(tiny_logits[bottom] * 1.3)
    untouched = torch.ones_like(tiny_logits, dtype=torch.bool)
    untouched[[top, bottom]] = False
    assert torch.equal(out[untouched], tiny_logits[untouched])


def test_frequency_presence_arithmetic_over_output_only() -> None:
    logits = torch.zeros(4)
    out = FrequencyPresencePenalty(0.5, 1.0)(logits, history(prompt=[3], output=[1, 1, 2]))
    # token 1: 2 * 0.5 + 1.0; token 2: 1 * 0.5 + 1.0; prompt token 3 untouched.
    assert out.tolist() == [0.0, -2.0, -1.5, 0.0]


def test_negative_frequency_presence_raise_logits() -> None:
    out = FrequencyPresencePenalty(-0.5, -1.0)(torch.zeros(3), history(output=[2]))
    assert out.tolist() == [0.0, 0.0, 1.5]


def test_frequency_penalty_on_real_logits(tiny_logits: torch.Tensor) -> None:
    out = FrequencyPresencePenalty(0.25, 0.0)(tiny_logits, history(output=[7, 7, 7]))
    assert out[7] == pytest.approx(tiny_logits[7] - 0.75)
    assert torch.equal(out[8:], tiny_logits[8:])


# -- Warpers --------------------------------------------------------------------------------


def test_temperature_divides() -> None:
    assert Temperature(0.5)(torch.tensor([1.0, -3.0]), history()).tolist() == [2.0, -6.0]


@pytest.mark.parametrize("k", [1, 2, 5, 40])
def test_top_k_keeps_exactly_k_highest(tiny_logits: torch.Tensor, k: int) -> None:
    out = TopK(k)(tiny_logits, history())
    assert kept(out) == set(torch.topk(tiny_logits, k).indices.tolist())
    assert len(kept(out)) == k
    assert torch.equal(out[list(kept(out))], tiny_logits[list(kept(out))])


def test_top_k_exact_even_with_ties() -> None:
    assert len(kept(TopK(2)(torch.tensor([1.0, 1.0, 1.0, 0.0]), history()))) == 2


def test_top_k_larger_than_vocab_is_a_no_op() -> None:
    logits = torch.tensor([1.0, 2.0])
    assert torch.equal(TopK(5)(logits, history()), logits)


@pytest.mark.parametrize(
    ("top_p", "expected"),
    [(0.3, {0}), (0.6, {0, 1}), (0.79, {0, 1}), (0.81, {0, 1, 2}), (0.99, {0, 1, 2, 3})],
)
def test_top_p_keeps_minimal_nucleus(top_p: float, expected: set[int]) -> None:
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    assert kept(TopP(top_p)(logits, history())) == expected


def test_top_p_always_keeps_the_best_token(tiny_logits: torch.Tensor) -> None:
    assert kept(TopP(1e-9)(tiny_logits, history())) == {int(tiny_logits.argmax())}


def check_minimal_nucleus(logits: torch.Tensor, top_p: float) -> None:
    probs = torch.softmax(logits.double(), dim=-1)
    keep = sorted(kept(TopP(top_p)(logits, history())), key=lambda i: -probs[i])
    mass = float(probs[keep].sum())
    assert mass >= top_p - 1e-5  # enough mass
    assert mass - float(probs[keep[-1]]) < top_p + 1e-5  # and nothing superfluous
    dropped = set(range(logits.numel())) - set(keep)
    if dropped:  # the most likely tokens are the ones kept
        assert max(probs[list(dropped)]) <= probs[keep[-1]] + 1e-7


@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.999])
def test_top_p_minimal_on_real_logits(tiny_logits: torch.Tensor, top_p: float) -> None:
    check_minimal_nucleus(tiny_logits * 20, top_p)  # sharpened: the tiny model is near uniform
    check_minimal_nucleus(tiny_logits, top_p)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(-20, 20, allow_nan=False), min_size=1, max_size=30),
    st.floats(0.01, 0.99),
)
def test_top_p_minimal_property(values: list[float], top_p: float) -> None:
    check_minimal_nucleus(torch.tensor(values), top_p)


@pytest.mark.parametrize(
    "make",
    [
        lambda: RepetitionPenalty(0),
        lambda: FrequencyPresencePenalty(3, 0),
        lambda: FrequencyPresencePenalty(0, -2.5),
        lambda: Temperature(0),
        lambda: TopK(0),
        lambda: TopK(-2),
        lambda: TopP(-0.1),
        lambda: TopP(1.5),
    ],
)
def test_invalid_arguments_rejected(make) -> None:
    with pytest.raises(ValueError):
        make()


def test_top_p_zero_keeps_only_the_most_likely_token() -> None:
    logits = torch.tensor([0.5, 2.0, 1.0])
    kept = TopP(0.0)(logits, TokenHistory([], []))
    assert torch.isfinite(kept).tolist() == [False, True, False]


# -- build_processors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(),
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.0, top_k=5, top_p=0.5),  # greedy ignores warpers
        SamplingParams(temperature=1.0, top_k=-1, top_p=1.0, seed=3),
    ],
)
def test_neutral_params_add_no_processor(params: SamplingParams) -> None:
    assert build_processors(params) == []


def test_active_params_add_processors_in_order() -> None:
    params = SamplingParams(
        temperature=0.7,
        top_k=10,
        top_p=0.9,
        frequency_penalty=0.1,
        repetition_penalty=1.1,
    )
    kinds = [type(p) for p in build_processors(params)]
    assert kinds == [RepetitionPenalty, FrequencyPresencePenalty, Temperature, TopK, TopP]


def test_presence_alone_adds_penalty() -> None:
    kinds = [type(p) for p in build_processors(SamplingParams(presence_penalty=0.5))]
    assert kinds == [FrequencyPresencePenalty]


def test_negative_temperature_rejected() -> None:
    with pytest.raises(ValueError):
        build_processors(SamplingParams(temperature=-1.0))


# -- Sampler --------------------------------------------------------------------------------


def test_temperature_zero_is_argmax(tiny_logits: torch.Tensor) -> None:
    sampler = Sampler(SamplingParams(temperature=0.0))
    assert sampler(tiny_logits, history()) == int(tiny_logits.argmax())


def test_greedy_applies_penalties_first(tiny_logits: torch.Tensor) -> None:
    best = int(tiny_logits.argmax())
    sampler = Sampler(SamplingParams(repetition_penalty=1e6))
    token = sampler(tiny_logits, history(prompt=[best]))
    assert token != best
    expected = tiny_logits.clone()
    expected[best] = -math.inf
    assert token == int(expected.argmax())


def test_greedy_accepts_low_precision_logits(tiny_logits: torch.Tensor) -> None:
    sampler = Sampler(SamplingParams())
    assert sampler(tiny_logits.to(torch.bfloat16), history()) == int(
        tiny_logits.to(torch.bfloat16).float().argmax()
    )


def draws(params: SamplingParams, logits: torch.Tensor, n: int = 20) -> list[int]:
    sampler = Sampler(params)
    return [sampler(logits, history()) for _ in range(n)]


def test_seeded_sampling_is_reproducible(tiny_logits: torch.Tensor) -> None:
    params = SamplingParams(temperature=1.0, seed=1234)
    first = draws(params, tiny_logits)
    assert draws(params, tiny_logits) == first
    assert len(set(first)) > 1  # it really samples
    assert draws(SamplingParams(temperature=1.0, seed=4321), tiny_logits) != first


def test_seeded_sampling_ignores_global_rng(tiny_logits: torch.Tensor) -> None:
    params = SamplingParams(temperature=1.0, seed=7)
    torch.manual_seed(0)
    first = draws(params, tiny_logits, 5)
    torch.manual_seed(99)
    assert draws(params, tiny_logits, 5) == first


def test_sampling_respects_top_k(tiny_logits: torch.Tensor) -> None:
    top2 = set(torch.topk(tiny_logits, 2).indices.tolist())
    tokens = draws(SamplingParams(temperature=2.0, top_k=2, seed=0), tiny_logits, 50)
    assert set(tokens) == top2


def test_sampler_rejects_batched_input(tiny_logits: torch.Tensor) -> None:
    with pytest.raises(ValueError):
        Sampler(SamplingParams())(tiny_logits[None], history())
