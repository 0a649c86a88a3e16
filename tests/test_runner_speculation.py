"""Speculative decoding on the runner: prompt-lookup drafts, the same tokens with and without
them (greedy and seeded sampling, on every weight kind), the batch limit, JSON constraints.
"""

from __future__ import annotations

import dataclasses

import pytest

from serve_app.engine.protocol import GenerationRequest, SamplingParams
from serve_app.models.loader import LoadedModel, load_model
from serve_app.runner.speculation import propose_draft
from tests.conftest import engine_config, speculating
from tests.runner_support import PROMPTS, encode, generate_all


def test_propose_draft() -> None:
    assert propose_draft([1, 2, 3, 9, 1, 2, 3], 2) == [9, 1]
    assert propose_draft([5, 6, 7, 8], 3) == []  # the last n-gram never occurred before
    assert propose_draft([1, 2, 3, 4, 1, 2], 5) == [3, 4, 1, 2]  # shorter when near the end
    assert propose_draft([1, 2], 0) == []


@pytest.fixture(scope="module")
def repetitive(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """The tiny model as initialised (std 0.02): it repeats itself, so drafts get accepted."""
    lm = load_model("tiny:" + str(tmp_path_factory.mktemp("tiny-plain")))
    return dataclasses.replace(lm, eos_token_ids=[])


# top_k=2 keeps sampled text repetitive enough to draft from on the near-uniform plain model.
@pytest.mark.parametrize("params", [{}, {"temperature": 0.9, "top_k": 2, "seed": 7}])
@pytest.mark.parametrize(
    ("model", "weights"),
    [
        ("loaded", "dense"),
        ("repetitive", "dense"),
        ("repetitive", "int4"),
        ("loaded", "int8"),
        ("repetitive", "int8"),
    ],
)
def test_speculation_gives_the_same_tokens(request, model, weights, params) -> None:
    """Greedy: identical by construction. Seeded sampling: each emitted token is drawn with the
    request's own generator exactly as without speculation, so the text is identical too."""
    lm = request.getfixturevalue(model)
    prompts = [encode(lm, t) for t in PROMPTS]

    def requests(route: str) -> list[GenerationRequest]:
        return [
            GenerationRequest(
                f"r{i}", p, SamplingParams(max_tokens=40, **params), "test", route=route
            )
            for i, p in enumerate(prompts)
        ]

    spec_config = engine_config(weights=weights, speculation=speculating(edit=4))
    plain, _ = generate_all(lm, engine_config(weights=weights), requests("edit"))
    spec, engine = generate_all(lm, spec_config, requests("edit"))
    assert spec == plain
    stats = engine.stats()
    assert stats.accepted_draft_tokens <= stats.draft_tokens
    if model == "repetitive":  # drafts verified, several tokens per step
        assert stats.accepted_draft_tokens > 0
        assert stats.decode_steps < len(prompts) * (40 - 1)
    _, other = generate_all(lm, spec_config, requests("fim"))
    assert other.stats().draft_tokens == 0  # only the configured route speculates


def test_speculation_stops_above_its_batch_limit(repetitive) -> None:
    """Drafts only while the decode batch is at most ``draft_max_batch`` rows: a lone request
    drafts under a limit of 1, and no request drafts under a limit of 0."""
    prompt = encode(repetitive, PROMPTS[0])
    request = GenerationRequest("s", prompt, SamplingParams(max_tokens=24), "test", route="fim")
    drafts = {}
    for limit in (1, 0):
        config = engine_config(speculation=speculating(limit, fim=4))
        (text,), engine = generate_all(repetitive, config, [request])
        drafts[limit] = (engine.stats().draft_tokens, text)
    assert drafts[1][0] > 0 and drafts[0][0] == 0
    assert drafts[1][1] == drafts[0][1]


def test_speculation_keeps_json_constraints(loaded) -> None:
    prompt = encode(loaded, PROMPTS[2])
    params = SamplingParams(max_tokens=40, response_format={"type": "json_object"})
    request = GenerationRequest("j", prompt, params, "test", route="chat")
    (plain,), _ = generate_all(loaded, engine_config(), [request])
    (spec,), _ = generate_all(loaded, engine_config(speculation=speculating(chat=4)), [request])
    assert spec == plain
