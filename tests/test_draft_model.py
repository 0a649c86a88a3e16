"""Draft-model speculation on the runner: a second, smaller model proposes tokens the target
checks in one forward. The target's text must not change (greedy and seeded sampling), with
drafts mostly kept, mostly rejected, and from a model of another size; rows come and go.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses

import pytest
import torch

from serve_app.config import AppConfig, ModelConfig
from serve_app.engine.engine import LLMEngine
from serve_app.engine.protocol import GenerationRequest, SamplingParams, generate_text
from serve_app.engine_config import EngineConfig
from serve_app.models.loader import LoadedModel, load_model
from serve_app.models.tiny import build_tiny_model
from tests.conftest import engine_config, redrawn, speculating
from tests.runner_support import PROMPTS, encode, generate_all

SMALLER = dict(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1)


def perturbed(lm: LoadedModel, scale: float) -> LoadedModel:
    """A copy of ``lm`` with seeded noise on its matrices: it agrees with ``lm`` on most
    tokens, not all, so drafts are kept and rejected in the same run."""
    model = copy.deepcopy(lm.model)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.add_(torch.randn(param.shape, generator=generator) * scale)
    return dataclasses.replace(lm, model=model, location=None)


@pytest.fixture(scope="module")
def smaller(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """A tiny model of another size (one layer, half the width), the same tokenizer."""
    folder = build_tiny_model(
        tmp_path_factory.mktemp("tiny-draft"), seed=3, shape={**SMALLER, "num_hidden_layers": 1}
    )
    return redrawn(load_model(f"tiny:{folder}"))


def drafting(**overrides) -> EngineConfig:
    speculation = speculating(edit=0, fim=0).model_copy(
        update={"draft_model_routes": ["edit"], "draft_model_tokens": 3}
    )
    return engine_config(speculation=speculation, **overrides)


def requests(lm: LoadedModel, route: str = "edit", **params) -> list[GenerationRequest]:
    """Every prompt at once, each with another length, so rows leave the batch at different
    steps and the draft's slots move."""
    return [
        GenerationRequest(
            f"r{i}",
            encode(lm, text),
            SamplingParams(max_tokens=24 + 5 * i, **params),
            "test",
            route=route,
        )
        for i, text in enumerate(PROMPTS)
    ]


@pytest.mark.parametrize("weights", ["dense", "int8"])
@pytest.mark.parametrize("draft_kind", ["perturbed", "smaller"])
def test_a_draft_model_leaves_greedy_text_unchanged(loaded, smaller, weights, draft_kind) -> None:
    draft = perturbed(loaded, 0.05) if draft_kind == "perturbed" else smaller
    plain, _ = generate_all(loaded, engine_config(weights=weights), requests(loaded))
    spec, engine = generate_all(loaded, drafting(weights=weights), requests(loaded), draft=draft)
    assert spec == plain
    stats = engine.stats()
    assert stats.model_draft_tokens > 0
    assert stats.model_draft_tokens == stats.draft_tokens  # lookup is off: every draft its own
    if draft_kind == "perturbed":  # close to the target: kept and rejected in the same run
        assert 0 < stats.accepted_model_draft_tokens < stats.model_draft_tokens


def test_a_draft_model_keeps_seeded_sampling_unchanged(loaded) -> None:
    """Each emitted token is drawn with the request's own generator as without drafts."""
    params = {"temperature": 0.8, "top_k": 3, "seed": 11}
    plain, _ = generate_all(loaded, engine_config(), requests(loaded, **params))
    spec, engine = generate_all(
        loaded, drafting(), requests(loaded, **params), draft=perturbed(loaded, 0.02)
    )
    assert spec == plain
    assert engine.stats().accepted_model_draft_tokens > 0


def test_the_target_as_its_own_draft_keeps_nearly_every_token(loaded) -> None:
    """The upper bound: drafts from the same weights are kept (k grows), and each step emits
    several tokens."""
    reqs = requests(loaded)[:1]
    plain, _ = generate_all(loaded, engine_config(), reqs)
    spec, engine = generate_all(loaded, drafting(), reqs, draft=loaded)
    assert spec == plain
    stats = engine.stats()
    assert stats.accepted_model_draft_tokens >= 0.9 * stats.model_draft_tokens
    assert stats.decode_steps <= (24 - 1) // 3


def test_only_the_configured_routes_and_free_drafts_first(loaded) -> None:
    """A route outside draft_model_routes drafts nothing; a lookup draft, when there is one,
    is used instead of the model's."""
    _, engine = generate_all(loaded, drafting(), requests(loaded, route="fim"), draft=loaded)
    assert engine.stats().draft_tokens == 0
    with_lookup = drafting().model_copy(
        update={"speculation": drafting().speculation.model_copy(update={"edit": 4})}
    )
    repeated = [
        GenerationRequest("x", encode(loaded, PROMPTS[2]), SamplingParams(max_tokens=30), "t")
    ]
    repeated[0] = dataclasses.replace(repeated[0], route="edit")
    plain, _ = generate_all(loaded, engine_config(), repeated)
    spec, engine = generate_all(loaded, with_lookup, repeated, draft=perturbed(loaded, 0.05))
    assert spec == plain
    stats = engine.stats()
    assert stats.draft_tokens >= stats.model_draft_tokens


def test_a_draft_model_of_a_larger_vocabulary_fails_at_start(loaded, tmp_path) -> None:
    """Its ids past the target's would be read as tokens the target does not have."""
    small = load_model(f"tiny:{build_tiny_model(tmp_path / 'v', vocab_size=300)}")
    with pytest.raises(ValueError, match="vocabulary"):
        LLMEngine(small, drafting(), draft=loaded)


def test_tokens_past_a_smaller_draft_vocabulary_are_not_drafted(loaded, tmp_path) -> None:
    """Qwen2.5's 7B has more embedding rows than its 0.5B draft: a row holding an id the
    draft has no row for drafts nothing (it decodes as without a draft), the others still
    draft."""
    small = redrawn(load_model(f"tiny:{build_tiny_model(tmp_path / 'v', vocab_size=300)}"))
    reqs = requests(loaded)
    assert any(max(r.prompt_token_ids) >= 300 for r in reqs)
    plain, _ = generate_all(loaded, engine_config(), reqs)
    spec, engine = generate_all(loaded, drafting(), reqs, draft=small)
    assert spec == plain
    assert engine.stats().model_draft_tokens > 0


def test_the_draft_reuses_its_kv_for_the_same_account_only(loaded) -> None:
    """A request after another of the same account (a keystroke after the last) catches the
    draft up from what the ended request's slot read; another account's request reads its
    whole prompt again. The text is the same either way."""
    prompt = encode(loaded, PROMPTS[4])
    engine = LLMEngine(loaded, drafting(), draft=perturbed(loaded, 0.05))

    def ask(account: str, max_tokens: int) -> tuple[str, int]:
        before = engine.stats().draft_model_read_tokens
        request = GenerationRequest(
            f"{account}{max_tokens}",
            prompt,
            SamplingParams(max_tokens=max_tokens),
            account,
            route="edit",
        )
        text, _ = asyncio.run(generate_text(engine, request))
        return text, engine.stats().draft_model_read_tokens - before

    try:
        first, read_first = ask("alice", 12)
        again, read_again = ask("alice", 16)  # not a replay: another max_tokens
        other, read_other = ask("bob", 16)
    finally:
        engine.shutdown()
    assert read_first >= len(prompt) - 1
    assert read_again < len(prompt) // 2
    assert read_other >= len(prompt) - 1
    assert again == other and again.startswith(first)


def test_draft_model_must_name_another_configured_model() -> None:
    with pytest.raises(ValueError, match="draft_model"):
        AppConfig(models=[ModelConfig(id="a", source="tiny", draft_model="b")])
    with pytest.raises(ValueError, match="draft_model"):
        AppConfig(models=[ModelConfig(id="a", source="tiny", draft_model="a")])
