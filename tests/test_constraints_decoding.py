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
    GrammarConstraint,
    SchemaError,
    TokenTexts,
    attach_constraint,
    compile_schema,
    constraint_for_response_format,
    validate_output,
)
from serve_app.engine.protocol import SamplingParams
from serve_app.engine.sampling import Sampler, TokenHistory
from serve_app.grammar.matcher import GrammarTokenizer
from serve_app.grammar.schema import ANY_OBJECT_SCHEMA
from tests.fixtures.constraints import FAST, SCHEMA

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
# An answer the tiny model (random weights) finishes in a few tokens: the grammar forces all
# but one choice among three.
SHORT = {
    "type": "object",
    "properties": {"mood": {"enum": ["calm", "busy", "away"]}},
    "required": ["mood"],
    "additionalProperties": False,
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


def constraint(tiny, schema: Any = None) -> GrammarConstraint:
    _, tokenizer, _, eos = tiny
    tokens = GrammarTokenizer.for_tokenizer(tokenizer, eos)
    grammar = compile_schema(schema or ANY_OBJECT_SCHEMA, "response_format.json_schema.schema")
    return GrammarConstraint(grammar, tokens, eos)


def test_eos_only_when_complete_and_then_forced(tiny) -> None:
    _, _, texts, eos = tiny
    c = constraint(tiny)
    h = TokenHistory(prompt_ids=[0])
    logits = torch.zeros(len(texts))
    logits[eos] = 100.0
    out = c(logits, h)
    assert torch.isinf(out[eos]).all() and torch.isfinite(out).any()
    for token in encode_exact(tiny, "{}"):
        h.append(token)
    out = c(logits, h)
    assert set(torch.isfinite(out).nonzero().flatten().tolist()) == set(eos)


def encode_exact(tiny, text: str) -> list[int]:
    _, tokenizer, texts, _ = tiny
    ids = tokenizer.encode(text)
    assert b"".join(texts.token_bytes[i] for i in ids) == text.encode()
    return ids


@FAST
@given(
    prefix=st.sampled_from(
        [
            "",
            '{"',
            '{"name": "Al',
            '{"name": "Al", "age": 3',
            '{"name": "", "age": 1, "address": {"',
        ]
    ),
    seed=st.integers(0, 2**32 - 1),
)
def test_every_token_the_mask_keeps_continues_the_grammar(tiny, prefix: str, seed: int) -> None:
    """Brute force over the whole vocabulary: each finite logit is a token the grammar takes
    there, greedy picks one, and ids past the vocabulary are never kept."""
    _, _, texts, eos = tiny
    c = constraint(tiny, SCHEMA)
    h = TokenHistory(prompt_ids=[0])
    for token in encode_exact(tiny, prefix):
        h.append(token)
    logits = torch.randn(len(texts) + 7, generator=torch.Generator().manual_seed(seed))
    out = c(logits, h)
    kept = torch.isfinite(out).nonzero().flatten().tolist()
    assert kept and int(out.argmax()) in kept and max(kept) < len(texts)
    for token in kept:
        trial = c.matcher.deep_copy()
        assert token in eos or trial.consume_token(token), texts.token_bytes[token]


def generate(
    tiny,
    constraint: GrammarConstraint,
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


def test_tiny_model_output_parses_and_validates(tiny) -> None:
    _, _, _, eos = tiny
    text, ids = generate(tiny, constraint(tiny, SHORT), 120)
    assert ids[-1] in eos, text
    jsonschema.validate(json.loads(text), SHORT)


@pytest.mark.parametrize("seed", range(4))
def test_tiny_model_samples_valid_json_for_the_big_schema(tiny, seed: int) -> None:
    _, _, _, eos = tiny
    params = SamplingParams(
        max_tokens=400, temperature=1.5, top_k=40, top_p=0.95, presence_penalty=0.5, seed=seed
    )
    sampler_probe = Sampler(params)
    attach_constraint(sampler_probe, constraint(tiny, SCHEMA))
    kinds = [type(p).__name__ for p in sampler_probe.processors]
    assert kinds == ["FrequencyPresencePenalty", "GrammarConstraint", "Temperature", "TopK", "TopP"]
    text, ids = generate(tiny, constraint(tiny, SCHEMA), params.max_tokens, params)
    if ids[-1] in eos:  # ended by the grammar, not cut by max_tokens
        jsonschema.validate(json.loads(text), SCHEMA)


def test_tiny_model_json_object_mode(tiny) -> None:
    _, _, _, eos = tiny
    ended = 0
    for seed in range(4):
        params = SamplingParams(max_tokens=200, temperature=1.0, seed=seed)
        text, ids = generate(tiny, constraint(tiny), params.max_tokens, params)
        if ids[-1] in eos:
            ended += 1
            assert isinstance(json.loads(text), dict), text
    assert ended


def test_an_answer_cut_by_max_tokens_is_reported_unfinished(tiny) -> None:
    c = constraint(tiny, PERSON)
    text, ids = generate(tiny, c, 5)
    assert len(ids) == 5 and not c.complete
    assert validate_output(text, PERSON) is not None


def test_response_format_factory(tiny) -> None:
    _, tokenizer, _, eos = tiny
    tokens = GrammarTokenizer.for_tokenizer(tokenizer, eos)
    assert constraint_for_response_format(None, tokens, eos) is None
    assert constraint_for_response_format({"type": "text"}, tokens, eos) is None
    plain = constraint_for_response_format({"type": "json_object"}, tokens, eos)
    assert isinstance(plain, GrammarConstraint)
    rf = {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON, "strict": True}}
    assert isinstance(constraint_for_response_format(rf, tokens, eos), GrammarConstraint)
    for bad in ({"type": "json_schema"}, {"type": "xml"}):
        with pytest.raises(SchemaError):
            constraint_for_response_format(bad, tokens, eos)


def test_engine_hook(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The engine attaches a request's ``response_format`` constraint to its sampler; the
    engine's eos handling then ends the request as soon as the JSON is done."""
    from serve_app.engine.engine import LLMEngine
    from serve_app.engine.protocol import GenerationRequest, generate_text
    from serve_app.models.loader import load_model

    loaded = load_model("tiny:" + str(tmp_path_factory.getbasetemp() / "tiny-model"))
    response_format = {"type": "json_schema", "json_schema": {"name": "p", "schema": SHORT}}
    engine = LLMEngine(loaded)
    try:
        prompt = loaded.tokenizer.encode("person:")
        params = SamplingParams(max_tokens=30, response_format=response_format)
        request = GenerationRequest("r", prompt, params, "test")
        text, last = asyncio.run(asyncio.wait_for(generate_text(engine, request), 60))
    finally:
        engine.shutdown()
    assert last.finish_reason == "stop"
    jsonschema.validate(json.loads(text), SHORT)
