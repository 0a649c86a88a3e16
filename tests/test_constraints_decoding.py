"""JSON-constrained decoding, the logits processor: token texts, the mask it applies, and
the tiny model (random weights, so only the constraint makes its output JSON) driven by it,
alone and in the engine."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from serve_app.engine.constraints import (
    JsonConstraint,
    SchemaError,
    TokenTexts,
    attach_constraint,
    constraint_for_response_format,
    validate_output,
)
from serve_app.engine.protocol import SamplingParams
from serve_app.engine.sampling import Sampler, TokenHistory
from serve_app.grammar.nodes import ANY_OBJECT
from tests.fixtures.constraints import FAST, SCHEMA, run_validator

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any, TokenTexts, list[int]]:
    """Tiny model (matrices redrawn with std 0.3 so its output varies), tokenizer, texts, eos."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from serve_app.models.tiny import build_tiny_model

    path = build_tiny_model(tmp_path_factory.getbasetemp() / "tiny-model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() >= 2:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    eos = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    return model, tokenizer, TokenTexts.for_tokenizer(tokenizer), eos


def test_token_texts_are_the_tokens_bytes(tiny) -> None:
    _, tokenizer, texts, eos = tiny
    assert TokenTexts.for_tokenizer(tokenizer) is texts
    assert set(eos) <= texts.special_ids and all(texts.token_bytes[i] == b"" for i in eos)
    assert (
        len({texts.token_bytes[i] for i in range(len(texts)) if len(texts.token_bytes[i]) == 1})
        == 256
    )
    text = 'Déjà vu: {"naïve": "中文🎉"}'
    ids = tokenizer.encode(text)
    assert b"".join(texts.token_bytes[i] for i in ids) == text.encode()


def test_eos_only_when_complete_and_then_forced(tiny) -> None:
    _, _, texts, eos = tiny
    c = JsonConstraint(texts, eos, None)
    h = TokenHistory(prompt_ids=[0])
    logits = torch.zeros(len(texts))
    logits[eos] = 100.0
    out = c(logits, h)
    assert torch.isinf(out[eos]).all() and torch.isfinite(out).any()
    for token in encode_exact(tiny, "{}"):
        h.append(token)
    out = c(logits, h)
    assert set(torch.isfinite(out).nonzero().flatten().tolist()) == set(eos)


def test_without_eos_only_whitespace_follows_a_complete_value(tiny) -> None:
    _, _, texts, _ = tiny
    c = JsonConstraint(texts, [], None)
    h = TokenHistory(prompt_ids=[0])
    for token in encode_exact(tiny, "{}"):
        h.append(token)
    kept = torch.isfinite(c(torch.randn(len(texts)), h)).nonzero().flatten().tolist()
    assert kept and set(kept) <= set(texts.whitespace_ids)


def encode_exact(tiny, text: str) -> list[int]:
    _, tokenizer, texts, _ = tiny
    ids = tokenizer.encode(text)
    assert b"".join(texts.token_bytes[i] for i in ids) == text.encode()
    return ids


@FAST
@given(
    prefix=st.sampled_from(
        ["", '{"', '{"name": "Al', '{"name": "Al", ', '{"address": {"city": "P"']
    ),
    seed=st.integers(0, 2**32 - 1),
    top_k=st.sampled_from([1, 4, 64]),
)
def test_greedy_picks_the_best_valid_token_even_beyond_top_k(
    tiny, prefix: str, seed: int, top_k: int
) -> None:
    """Brute force over the whole vocabulary: argmax after masking == best valid token."""
    _, _, texts, eos = tiny
    c = JsonConstraint(texts, eos, SCHEMA, top_k=top_k)
    h = TokenHistory(prompt_ids=[0])
    for token in encode_exact(tiny, prefix):
        h.append(token)
    logits = torch.randn(len(texts) + 7, generator=torch.Generator().manual_seed(seed))
    out = c(logits, h)
    base = run_validator(prefix, c.grammar.root)
    valid = [
        i
        for i in range(len(texts))
        if texts.token_bytes[i] and base.copy().feed(texts.token_bytes[i])
    ]
    assert int(out.argmax()) == max(valid, key=lambda i: logits[i])
    assert set(torch.isfinite(out).nonzero().flatten().tolist()) <= set(valid)


def generate(
    tiny,
    constraint: JsonConstraint,
    max_tokens: int,
    params: SamplingParams | None = None,
    prompt: str = "Describe a person as JSON:",
) -> tuple[str, list[int]]:
    """Plain KV-cached decoding loop through ``Sampler`` with the constraint attached."""
    model, tokenizer, texts, eos = tiny
    sampler = Sampler(params or SamplingParams(max_tokens=max_tokens))
    attach_constraint(sampler, constraint)
    ids = tokenizer.encode(prompt)
    history = TokenHistory(prompt_ids=ids)
    past, step_ids = None, ids
    with torch.inference_mode():
        for _ in range(max_tokens):
            out = model(input_ids=torch.tensor([step_ids]), past_key_values=past, use_cache=True)
            past = out.past_key_values
            token = sampler(out.logits[0, -1], history)
            history.append(token)
            if token in eos:
                break
            step_ids = [token]
    text = tokenizer.decode(history.output_ids, skip_special_tokens=True)
    return text, history.output_ids


@pytest.mark.parametrize("max_tokens", [20, 23, 40, 120])
def test_tiny_model_output_parses_and_validates_within_max_tokens(tiny, max_tokens: int) -> None:
    """``{"name":"","age":0}`` is 19 bytes: 20 tokens (with eos) is the least that can work."""
    _, _, texts, eos = tiny
    constraint = JsonConstraint(texts, eos, PERSON, max_tokens=max_tokens)
    text, ids = generate(tiny, constraint, max_tokens)
    assert len(ids) <= max_tokens and ids[-1] in eos, text
    jsonschema.validate(json.loads(text), PERSON)


@pytest.mark.parametrize("seed", range(4))
def test_tiny_model_samples_valid_json_for_the_big_schema(tiny, seed: int) -> None:
    _, _, texts, eos = tiny
    params = SamplingParams(
        max_tokens=160, temperature=1.5, top_k=40, top_p=0.95, presence_penalty=0.5, seed=seed
    )
    constraint = JsonConstraint(texts, eos, SCHEMA, max_tokens=params.max_tokens)
    sampler_probe = Sampler(params)
    attach_constraint(sampler_probe, constraint)
    kinds = [type(p).__name__ for p in sampler_probe.processors]
    assert kinds == ["FrequencyPresencePenalty", "JsonConstraint", "Temperature", "TopK", "TopP"]
    constraint = JsonConstraint(texts, eos, SCHEMA, max_tokens=params.max_tokens)
    text, _ = generate(tiny, constraint, params.max_tokens, params)
    jsonschema.validate(json.loads(text), SCHEMA)


def test_tiny_model_json_object_mode(tiny) -> None:
    _, _, texts, eos = tiny
    for max_tokens in (3, 8, 64):
        text, ids = generate(
            tiny, JsonConstraint(texts, eos, None, max_tokens=max_tokens), max_tokens
        )
        assert isinstance(json.loads(text), dict) and ids[-1] in eos, text


def test_budget_too_small_still_never_masks_everything(tiny) -> None:
    _, _, texts, eos = tiny
    constraint = JsonConstraint(texts, eos, PERSON, max_tokens=5)
    text, ids = generate(tiny, constraint, 5)
    assert len(ids) == 5 and not constraint.complete
    assert validate_output(text, PERSON) is not None


def test_response_format_factory(tiny) -> None:
    _, _, texts, eos = tiny
    assert constraint_for_response_format(None, texts, eos) is None
    assert constraint_for_response_format({"type": "text"}, texts, eos) is None
    plain = constraint_for_response_format({"type": "json_object"}, texts, eos)
    assert plain is not None and plain.grammar.root is ANY_OBJECT
    rf = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}}
    schema_constraint = constraint_for_response_format(rf, texts, eos, max_tokens=9)
    assert schema_constraint.max_tokens == 9 and schema_constraint.grammar.fully_enforced
    for bad in ({"type": "json_schema"}, {"type": "xml"}):
        with pytest.raises(SchemaError):
            constraint_for_response_format(bad, texts, eos)


def test_engine_hook(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The engine attaches a request's ``response_format`` constraint to its sampler; the
    engine's eos handling then ends the request as soon as the JSON is done."""
    from serve_app.engine.engine import LLMEngine
    from serve_app.engine.protocol import GenerationRequest, generate_text
    from serve_app.models.loader import load_model

    loaded = load_model("tiny:" + str(tmp_path_factory.getbasetemp() / "tiny-model"))
    response_format = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}}
    engine = LLMEngine(loaded)
    try:
        prompt = loaded.tokenizer.encode("person:")
        params = SamplingParams(max_tokens=30, response_format=response_format)
        request = GenerationRequest("r", prompt, params, "test")
        text, last = asyncio.run(asyncio.wait_for(generate_text(engine, request), 60))
    finally:
        engine.shutdown()
    assert last.finish_reason == "stop"
    jsonschema.validate(json.loads(text), PERSON)
