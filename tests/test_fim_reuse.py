"""What a keystroke reuses, on the engine's own runner (tiny model): the KV a request leaves
behind (its output included, and a prompt read only in part when the client cancelled),
never across accounts; the suggestion just offered as a draft, exact; cached and cold prompts
answering alike.

The tiny model's matrices are redrawn (std 0.3, seeded) so its greedy output depends on the
prompt, as in test_engine.py.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from serve_app.engine.engine import LLMEngine
from serve_app.engine.protocol import GenerationRequest, SamplingParams, generate_text
from serve_app.grammar.token_bytes import TokenTexts
from serve_app.models.loader import LoadedModel, load_model
from serve_app.runner.builder import build_runner
from serve_app.runner.smoothing import calibration_ids
from tests.conftest import engine_config, speculating

PREFIX = "import os\nimport sys\n\ndef load(path):\n    with open(path) as f:\n        return "


@pytest.fixture
def engines(loaded: LoadedModel):
    made: list[LLMEngine] = []

    def make(**config) -> LLMEngine:
        made.append(LLMEngine(loaded, engine_config(**config)))
        return made[-1]

    yield make
    for engine in made:
        engine.shutdown()


def prompt_ids(loaded: LoadedModel) -> list[int]:
    return loaded.tokenizer.encode(PREFIX * 3)


def complete(engine: LLMEngine, ids: list[int], n: int, salt: str = "account-a", rid: str = ""):
    """Greedy ``n`` tokens; returns (token ids, cached prompt tokens)."""
    request = GenerationRequest(
        rid or f"r{id(ids)}-{n}", ids, SamplingParams(max_tokens=n), salt, route="fim"
    )

    async def main():
        tokens: list[int] = []
        last = None
        async for chunk in engine.generate(request):
            tokens += chunk.token_ids
            last = chunk
        return tokens, last.cached_tokens

    return asyncio.run(asyncio.wait_for(main(), timeout=60))


def test_an_ended_request_leaves_its_prompt_for_the_next_keystroke(loaded, engines) -> None:
    engine = engines()
    prompt = prompt_ids(loaded)
    first, _ = complete(engine, prompt, 16)
    typed = prompt + first[:8]  # the user typed half of what was suggested
    again, cached = complete(engine, typed, 8)
    # The prompt's KV came from the cache; the typed tokens are read (output tokens are kept
    # as ids for drafts, not as KV: decode computes them in other kernels than a prompt).
    assert cached == len(prompt)
    assert again == first[8:16]


def test_a_cancelled_request_leaves_what_it_read(loaded, engines) -> None:
    """An IDE cancels the previous request on each keystroke: what it read still counts."""
    engine = engines(prefill_chunk_tokens=16)
    prompt = prompt_ids(loaded)
    request = GenerationRequest("cancelled", prompt, SamplingParams(max_tokens=200), "account-a")

    async def read_two_chunks_and_leave() -> list[int]:
        tokens: list[int] = []
        stream = engine.generate(request)
        async for chunk in stream:
            tokens += chunk.token_ids
            if len(tokens) >= 2:
                break
        await stream.aclose()
        return tokens

    seen = asyncio.run(asyncio.wait_for(read_two_chunks_and_leave(), timeout=60))
    assert asyncio.run(engine.wait_until_idle(timeout=30))  # the abort lands at the next step
    _, cached = complete(engine, prompt + seen[:1] + [7], 2)
    assert cached == len(prompt)


def test_no_reuse_across_accounts(loaded, engines) -> None:
    engine = engines()
    prompt = prompt_ids(loaded)
    first, _ = complete(engine, prompt, 8, salt="account-a")
    _, cached = complete(engine, prompt + first[:4], 4, salt="account-b")
    assert cached == 0
    _, cached = complete(engine, prompt + first[:4], 4, salt="account-a")
    assert cached == len(prompt)


def test_the_suggestion_just_offered_is_checked_as_a_draft(loaded, engines) -> None:
    """Typing what was suggested: the rest of the suggestion is verified in a few forwards
    instead of decoded token by token, and the tokens are exactly plain decoding's."""
    plain, drafting = engines(), engines(speculation=speculating(fim=2))
    prompt = prompt_ids(loaded)
    suggestion, _ = complete(drafting, prompt, 24)
    assert suggestion == complete(plain, prompt, 24)[0]

    before = drafting.stats()
    typed = prompt + suggestion[:4]
    rest, _ = complete(drafting, typed, 20)
    after = drafting.stats()
    assert rest == suggestion[4:24] == complete(plain, typed, 20)[0]
    accepted = after.accepted_draft_tokens - before.accepted_draft_tokens
    assert accepted >= 16  # the whole suggestion, not 2 prompt-lookup tokens a step
    assert after.steps - before.steps <= 4  # a prefill step and a couple of verify steps


def test_an_answer_prefix_is_spelled_first_and_not_returned(loaded, engines):
    """Token healing: the prompt's last tokens given back, the output spells them again with
    tokens the model picks among those that continue them (exactly greedy under that rule),
    and the client gets only what follows."""
    engine = engines()
    texts = TokenTexts.for_tokenizer(loaded.tokenizer)
    prompt = loaded.tokenizer.encode(PREFIX * 3 + "    def loa")
    answer_prefix = b"".join(texts.token_bytes[i] for i in prompt[-2:]).decode()
    request = GenerationRequest(
        "healed", prompt[:-2], SamplingParams(max_tokens=6), "a", answer_prefix=answer_prefix
    )
    text, last = asyncio.run(asyncio.wait_for(generate_text(engine, request), timeout=60))

    ids, rest = prompt[:-2], answer_prefix.encode()
    with torch.inference_mode():
        for _ in range(6):
            logits = loaded.model(torch.tensor([ids])).logits[0, -1]
            allowed = sorted(texts.ids_continuing(rest)) if rest else list(range(len(logits)))
            token = allowed[int(logits[allowed].argmax())]
            spelled = texts.token_bytes[token]
            rest = b"" if spelled.startswith(rest) else rest[len(spelled) :]
            ids.append(token)
    # As the engine streams text: special tokens (a random model's <|fim_suffix|>) spell nothing.
    expected = loaded.tokenizer.decode(ids[len(prompt) - 2 :], skip_special_tokens=True)
    assert expected.startswith(answer_prefix)
    assert text == expected[len(answer_prefix) :]
    assert (last.prompt_tokens, last.completion_tokens) == (len(prompt) - 2, 6)


def test_typing_along_the_suggestion_is_answered_from_the_cache(loaded, engines):
    """Healed, a keystroke along the suggestion sends the same prompt with a longer answer
    prefix: the stored answer is replayed (no forward pass), and it is the answer a cold
    engine gives; a keystroke that leaves the suggestion is decoded."""
    warm, cold = engines(), engines()

    def ask(engine: LLMEngine, prompt: list[int], answer_prefix: str, rid: str) -> str:
        params = SamplingParams(max_tokens=8)
        request = GenerationRequest(rid, prompt, params, "a", answer_prefix=answer_prefix)
        text, _ = asyncio.run(asyncio.wait_for(generate_text(engine, request), timeout=60))
        return text

    # The random model writes bytes that are not text; take a prompt whose answer starts with
    # two characters a user could type.
    for n in range(40):
        prompt = loaded.tokenizer.encode(PREFIX + f"value_{n} = ")
        suggestion = ask(warm, prompt, "", f"first-{n}")
        typed = suggestion[:2]
        if len(typed) == 2 and typed.isascii() and typed.isprintable():
            break
    else:
        pytest.fail("no answer starts with two printable characters")
    before = warm.stats()
    along = ask(warm, prompt, typed, "along")
    after = warm.stats()
    assert after.answers_replayed == before.answers_replayed + 1
    assert after.prefill_tokens == before.prefill_tokens
    assert after.decode_steps == before.decode_steps
    assert along == suggestion[2:] == ask(cold, prompt, typed, "cold")

    off = typed[0] + ("x" if typed[1] != "x" else "y")
    left = ask(warm, prompt, off, "off")
    assert warm.stats().answers_replayed == after.answers_replayed
    assert left == ask(cold, prompt, off, "cold-off")


@pytest.mark.embedded
def test_a_prompt_reads_the_same_bits_however_it_is_cut() -> None:
    """The embedded model on int8 prompts (what AVX2 CPUs run): cold in 64-token chunks, or a
    cache hit ending anywhere and the rest, the last position's logits are bit for bit the
    same (a prompt chunk's attention does not depend on where the chunk starts or ends, and
    int8 linears work per row). Dense prompts (bf16 on AVX512 CPUs) go through matmul kernels
    whose rows can depend on the chunk's size, so there only tokens are compared (below)."""
    embedded = load_model("embedded:qwen2.5-coder-0.5b", threads=2)
    runner = build_runner(
        embedded.model,
        weights="int8",
        prompt_weights="decode",
        cache_dir=embedded.location,
        calibration=calibration_ids(embedded.tokenizer),  # the int8 weights the service reads
    )
    ids = embedded.tokenizer.encode(PREFIX * 12)
    cache = runner.new_cache(2, 64, 4096)
    n = len(ids)

    def read(slot: int, cuts: list[int]) -> torch.Tensor:
        logits = None
        for start, end in zip([0, *cuts], [*cuts, n], strict=True):
            logits = runner.forward(cache, slot, [ids[start:end]], [start], decode=False)
        return logits

    with torch.inference_mode():
        cold = read(0, list(range(64, n, 64)))
        for cuts in ([n - 5], [n - 1], [37, 100, n - 2]):
            assert torch.equal(read(1, cuts), cold), cuts


@pytest.mark.parametrize(
    "weights",
    [
        {"weights": "dense"},
        {"weights": "int8", "prompt_weights": "decode"},
        {"weights": "int4", "prompt_weights": "dense"},
    ],
    ids=["dense", "int8", "int4"],
)
def test_cached_and_cold_prompts_answer_alike(loaded, engines, weights) -> None:
    """The same request at temperature 0, cold on one engine and after a sibling prompt
    filled the cache on another: the same tokens, whatever the weights."""
    prompt = prompt_ids(loaded)
    cold, cached_cold = complete(engines(**weights), prompt, 16)
    warm_engine = engines(**weights)
    complete(warm_engine, prompt[:-3] + [11, 12], 4)
    warm, cached_warm = complete(warm_engine, prompt, 16)
    assert cached_cold == 0 and cached_warm >= len(prompt) - 3
    assert warm == cold
    # The same prompt again (other parameters, so not the replayed answer): read whole before,
    # its first token comes from the stored last-position logits.
    again, cached_again = complete(warm_engine, prompt, 12, rid="again")
    assert cached_again == len(prompt)
    assert again == cold[:12]
