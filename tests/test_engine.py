"""LLMEngine on the tiny model: exact greedy agreement with a plain reference loop, whatever the
batching, chunking or prefix caching, plus the request lifecycle (stop, length, abort, errors).

The tiny model's default initialisation (std 0.02) makes it repeat one token whatever the
prompt, which would make "same tokens" checks vacuous; the ``loaded`` fixture (conftest's
``redrawn``) redraws its matrices with std 0.3 (seeded) so outputs depend on the prompt.
Smallest top-2 logit gaps are then ~1e-2, far above the ~1e-6 float32 differences that
padding or chunking introduce, so token ids are compared exactly.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import defaultdict
from collections.abc import AsyncIterator

import pytest
import torch

from serve_app.engine.engine import LLMEngine
from serve_app.engine.protocol import (
    GenerationChunk,
    GenerationRequest,
    SamplingParams,
    generate_text,
)
from serve_app.engine.requests import RequestState
from serve_app.errors import (
    ContextLengthExceededError,
    InvalidRequestError,
    ServerError,
    UpstreamUnavailableError,
)
from serve_app.models.loader import LoadedModel
from tests.conftest import engine_config


class RecordingEngine(LLMEngine):
    """Records every sampled token id per request as the loop samples it (through the
    engine's output processor, the one place a token becomes output); can be told to fail
    one request there."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.tokens: dict[str, list[int]] = defaultdict(list)
        self.fail_ids: set[str] = set()
        emit = self.output.on_token

        def on_token(state: RequestState, token_id: int) -> None:
            if state.request_id in self.fail_ids:
                raise RuntimeError("boom")
            self.tokens[state.request_id].append(token_id)
            emit(state, token_id)

        self.output.on_token = on_token


@pytest.fixture
def make_engine(loaded: LoadedModel):
    engines: list[LLMEngine] = []

    def make(
        lm: LoadedModel | None = None, context_length: int | None = None, **config
    ) -> RecordingEngine:
        engine = RecordingEngine(lm or loaded, engine_config(**config), context_length)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.shutdown()


def reference(loaded: LoadedModel, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding the plain way: the whole sequence through the model at every step."""
    ids, out = list(prompt), []
    with torch.inference_mode():
        for _ in range(n):
            token = int(loaded.model(torch.tensor([ids])).logits[0, -1].argmax())
            out.append(token)
            ids.append(token)
    return out


def encode(loaded: LoadedModel, text: str) -> list[int]:
    return loaded.tokenizer.encode(text)


PROMPTS = [
    "def add(a, b):",
    "class Point:\n    def __init__(self, x, y):",
    "for i in range(10):\n    print(i)\n" * 3,
    "x",
]


def request(rid: str, prompt: list[int], max_tokens: int = 16, **params) -> GenerationRequest:
    return GenerationRequest(rid, prompt, SamplingParams(max_tokens=max_tokens, **params), "test")


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


async def collect(stream: AsyncIterator[GenerationChunk]) -> list[GenerationChunk]:
    return [chunk async for chunk in stream]


def test_greedy_matches_reference(loaded, make_engine) -> None:
    engine = make_engine()
    for i, text in enumerate(PROMPTS):
        prompt = encode(loaded, text)
        out, last = run(generate_text(engine, request(f"r{i}", prompt)))
        expected = reference(loaded, prompt, 16)
        assert engine.tokens[f"r{i}"] == expected
        assert out == loaded.tokenizer.decode(expected, skip_special_tokens=True)
        assert (last.finish_reason, last.prompt_tokens, last.completion_tokens) == (
            "length",
            len(prompt),
            16,
        )


def test_prompts_read_on_prompt_threads_and_decode_on_the_replicas(loaded, make_engine) -> None:
    """``prompt_threads``: the loop reads prompts on 2 threads and decodes on the replica's 1,
    and the greedy tokens are the reference's."""
    torch.set_num_threads(1)
    engine = make_engine(torch_threads=1, prompt_threads=2)
    seen: dict[str, set[int]] = defaultdict(set)
    for name in ("prefill", "decode"):
        method = getattr(engine.backend, name)

        def counted(*args, _method=method, _name=name, **kwargs):
            seen[_name].add(torch.get_num_threads())
            return _method(*args, **kwargs)

        setattr(engine.backend, name, counted)
    prompt = encode(loaded, PROMPTS[1])
    run(generate_text(engine, request("r", prompt)))
    assert dict(seen) == {"prefill": {2}, "decode": {1}}
    assert engine.tokens["r"] == reference(loaded, prompt, 16)


def test_engine_seed_makes_unseeded_sampling_repeat(loaded, make_engine) -> None:
    """``seed`` in the engine config: a request that sends no seed samples the same text each
    time; without it, each request draws its own."""
    prompt = encode(loaded, PROMPTS[1])

    def twice(engine) -> list[str]:
        sampled = [request(f"s{i}", prompt, max_tokens=24, temperature=1.0) for i in range(2)]
        return [run(generate_text(engine, r))[0] for r in sampled]

    first, second = twice(make_engine(seed=11))
    assert first == second
    assert twice(make_engine(seed=11)) == [first, first]
    fresh = twice(make_engine())
    assert fresh[0] != fresh[1]


def test_concurrent_requests_batch_and_match_solo(loaded, make_engine) -> None:
    engine = make_engine()
    prompts = [encode(loaded, t) for t in PROMPTS]

    async def main():
        reqs = [request(f"r{i}", p, max_tokens=12 + 3 * i) for i, p in enumerate(prompts)]
        return await asyncio.gather(*(generate_text(engine, r) for r in reqs))

    results = run(main())
    for i, prompt in enumerate(prompts):
        assert engine.tokens[f"r{i}"] == reference(loaded, prompt, 12 + 3 * i)
        assert results[i][1].completion_tokens == 12 + 3 * i
    assert engine.stats().peak_decode_batch == len(prompts)
    assert engine.num_running == 0


def test_request_joins_a_running_batch(loaded, make_engine) -> None:
    engine = make_engine()
    long_prompt, short_prompt = encode(loaded, PROMPTS[1]), encode(loaded, PROMPTS[0])

    async def main():
        # Far more than "short" needs on any CPU, however loaded: "long" is still decoding
        # when "short" ends, and is closed then.
        stream = engine.generate(request("long", long_prompt, max_tokens=3000))
        first = await anext(stream)  # "long" is decoding now
        assert first.finish_reason is None
        _, last = await generate_text(engine, request("short", short_prompt, max_tokens=8))
        assert len(engine.tokens["long"]) < 3000  # "short" finished while "long" still runs
        await stream.aclose()
        return last

    short_last = run(main())
    assert engine.stats().peak_decode_batch == 2
    assert engine.tokens["short"] == reference(loaded, short_prompt, 8)
    long = engine.tokens["long"][:200]  # checked as far as the reference is cheap
    assert long == reference(loaded, long_prompt, len(long))
    assert short_last.finish_reason == "length"


def test_eos_finishes_with_stop_and_counts_the_eos(loaded, make_engine) -> None:
    prompt = encode(loaded, PROMPTS[0])
    expected = reference(loaded, prompt, 12)
    eos = expected[5]
    engine = make_engine(dataclasses.replace(loaded, eos_token_ids=[eos]))
    out, last = run(generate_text(engine, request("r", prompt, max_tokens=12)))
    upto = expected[: expected.index(eos)]
    assert last.finish_reason == "stop"
    assert last.completion_tokens == len(upto) + 1
    assert out == loaded.tokenizer.decode(upto, skip_special_tokens=True)


def test_stop_sequence_never_in_output(loaded, make_engine) -> None:
    engine = make_engine()
    prompt = encode(loaded, PROMPTS[2])
    full, _ = run(generate_text(engine, request("full", prompt, max_tokens=24)))
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop and stop in full

    async def main():
        return await collect(
            engine.generate(request("stopped", prompt, max_tokens=24, stop=(stop,)))
        )

    chunks = run(main())
    text = "".join(c.text for c in chunks)
    assert stop not in text
    assert text == full[: full.index(stop)]
    assert chunks[-1].finish_reason == "stop"
    assert all(c.finish_reason is None for c in chunks[:-1])


def test_abort_frees_the_slot_within_a_step(loaded, make_engine) -> None:
    engine = make_engine()
    prompt = encode(loaded, PROMPTS[0])

    async def main():
        stream = engine.generate(request("r", prompt, max_tokens=3000))
        await anext(stream)
        assert engine.num_running == 1
        await stream.aclose()  # what a client disconnect does
        steps_at_abort = engine.stats().steps
        assert await engine.wait_until_idle(timeout=30)
        return engine.stats().steps - steps_at_abort

    assert run(main()) <= 2
    assert engine.stats().requests_aborted == 1
    assert len(engine.tokens["r"]) < 2000


def test_cancelling_the_consumer_aborts(loaded, make_engine) -> None:
    engine = make_engine()
    prompt = encode(loaded, PROMPTS[0])

    async def consume():
        async for _ in engine.generate(request("r", prompt, max_tokens=3000)):
            pass

    async def main():
        task = asyncio.create_task(consume())
        while not engine.tokens["r"]:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await engine.wait_until_idle(timeout=30)

    run(main())
    assert engine.stats().requests_aborted == 1


def test_a_request_whose_event_loop_closed_is_aborted(loaded, make_engine) -> None:
    """A caller's event loop that closes without closing its stream (a worker thread gone)
    cannot take chunks: the engine aborts the request at its next delivery and serves the
    next one."""
    engine = make_engine()
    prompt = encode(loaded, PROMPTS[0])
    stream = engine.generate(request("gone", prompt, max_tokens=3000))
    dying = asyncio.new_event_loop()
    dying.run_until_complete(anext(stream))
    dying.close()  # no shutdown_asyncgens: the stream is never closed

    async def main():
        assert await engine.wait_until_idle(timeout=30)
        return await collect(engine.generate(request("next", prompt, max_tokens=4)))

    assert run(main())[-1].finish_reason == "length"
    assert engine.stats().requests_aborted == 1
    assert len(engine.tokens["gone"]) < 2000
    del stream


def test_abort_by_id_ends_the_stream(loaded, make_engine) -> None:
    engine = make_engine()

    async def main():
        stream = engine.generate(request("r", encode(loaded, PROMPTS[0]), max_tokens=3000))
        await anext(stream)
        engine.abort("r")
        return await collect(stream)

    rest = run(main())
    assert all(c.finish_reason is None for c in rest)  # ends without a finishing chunk
    assert engine.num_running == 0


def test_prefix_cache_hit_gives_same_output(loaded, make_engine) -> None:
    engine = make_engine(prefill_chunk_tokens=32)
    shared = encode(loaded, "import os\nimport sys\n\n" * 6)
    first = shared + encode(loaded, "def add(a, b):")
    second = shared + encode(loaded, "class Point:")

    _, last1 = run(generate_text(engine, request("first", first)))
    _, last2 = run(generate_text(engine, request("second", second)))
    assert last1.cached_tokens == 0
    assert last2.cached_tokens >= len(shared) - 1 > 0
    assert engine.tokens["second"] == reference(loaded, second, 16)
    stats = engine.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (2, 1)

    # The same prompt with other parameters: its KV and last logits come from the cache, and
    # nothing is read.
    read = engine.stats().prefill_tokens
    _, last3 = run(generate_text(engine, request("longer", second, max_tokens=20)))
    assert last3.cached_tokens == len(second)
    assert engine.stats().prefill_tokens == read
    assert engine.tokens["longer"] == reference(loaded, second, 20)


def test_the_same_greedy_request_again_is_its_answer_replayed(loaded, make_engine) -> None:
    engine = make_engine()
    prompt = encode(loaded, PROMPTS[1])
    text, first = run(generate_text(engine, request("first", prompt)))
    before = engine.stats()
    again, last = run(generate_text(engine, request("again", prompt)))
    after = engine.stats()
    assert (again, last.finish_reason) == (text, first.finish_reason)
    assert engine.tokens["again"] == engine.tokens["first"] == reference(loaded, prompt, 16)
    # No forward pass, and usage says the whole prompt came from the cache.
    assert after.prefill_tokens == before.prefill_tokens
    assert after.decode_steps == before.decode_steps
    assert after.answers_replayed == 1
    assert (last.cached_tokens, last.completion_tokens) == (len(prompt), first.completion_tokens)
    # Not for another account, not for sampled requests, not for other parameters.
    other = GenerationRequest("other", prompt, SamplingParams(max_tokens=16), "another-account")
    run(generate_text(engine, other))
    run(generate_text(engine, request("sampled", prompt, temperature=0.8, seed=1)))
    run(generate_text(engine, request("shorter", prompt, max_tokens=8)))
    assert engine.stats().answers_replayed == 1


def test_prefix_cache_disabled(loaded, make_engine) -> None:
    engine = make_engine(prefix_cache_mb=0)
    prompt = encode(loaded, PROMPTS[2])
    run(generate_text(engine, request("a", prompt)))
    _, last = run(generate_text(engine, request("b", prompt)))
    assert last.cached_tokens == 0
    assert engine.tokens["a"] == engine.tokens["b"]


def test_chunked_prefill_matches_one_shot_and_interleaves(loaded, make_engine) -> None:
    long_prompt = encode(loaded, "".join(PROMPTS) * 3)
    assert len(long_prompt) > 100
    one_shot = make_engine(prefill_chunk_tokens=4096, prefix_cache_mb=0)
    chunked = make_engine(prefill_chunk_tokens=16, prefix_cache_mb=0)
    run(generate_text(one_shot, request("r", long_prompt)))

    async def main():
        # A decode is running when the long prompt arrives: it must keep stepping meanwhile.
        stream = chunked.generate(request("bg", encode(loaded, PROMPTS[0]), max_tokens=400))
        await anext(stream)
        tokens_before = len(chunked.tokens["bg"])
        _, last = await generate_text(chunked, request("r", long_prompt))
        tokens_while_prefilling = len(chunked.tokens["bg"]) - tokens_before
        await stream.aclose()
        return last, tokens_while_prefilling

    last, bg_tokens = run(main())
    assert chunked.tokens["r"] == one_shot.tokens["r"] == reference(loaded, long_prompt, 16)
    # ceil(len / 16) prefill steps, each of which also decoded a "bg" token.
    assert bg_tokens >= -(-len(long_prompt) // 16)
    assert last.prompt_tokens == len(long_prompt)


def test_context_length_error(loaded, make_engine) -> None:
    engine = make_engine(context_length=64)
    prompt = encode(loaded, "".join(PROMPTS) * 2)[:60]
    assert len(prompt) == 60

    with pytest.raises(ContextLengthExceededError) as info:
        run(generate_text(engine, request("r", prompt, max_tokens=5)))
    assert info.value.param == "messages"
    assert "maximum context length for this model of 64" in info.value.message
    with pytest.raises(ContextLengthExceededError) as info:
        run(generate_text(engine, request("r", prompt, max_tokens=5), context_param="prompt"))
    assert info.value.param == "prompt"
    _, last = run(generate_text(engine, request("ok", prompt, max_tokens=4)))
    assert last.completion_tokens == 4


def test_invalid_requests(loaded, make_engine) -> None:
    engine = make_engine()
    with pytest.raises(InvalidRequestError):
        run(generate_text(engine, request("r", [], max_tokens=4)))
    with pytest.raises(InvalidRequestError):
        run(generate_text(engine, request("r", [1, 2], max_tokens=0)))
    with pytest.raises(InvalidRequestError):
        run(generate_text(engine, request("r", [1, 2], max_tokens=4, temperature=-1.0)))


def test_queue_full_is_back_pressure(loaded, make_engine) -> None:
    engine = make_engine(max_batch_size=1, max_waiting=1)
    prompt = encode(loaded, PROMPTS[0])

    async def main():
        running = engine.generate(request("a", prompt, max_tokens=3000))
        await anext(running)
        queued = asyncio.create_task(generate_text(engine, request("b", prompt, max_tokens=4)))
        while engine.num_waiting == 0:
            await asyncio.sleep(0.001)
        with pytest.raises(UpstreamUnavailableError):
            await generate_text(engine, request("c", prompt, max_tokens=4))
        await running.aclose()  # frees the slot: "b" runs
        return await queued

    _, last = run(main())
    assert last.finish_reason == "length"
    assert engine.tokens["b"] == reference(loaded, prompt, 4)


def test_request_error_does_not_stop_the_loop(loaded, make_engine) -> None:
    engine = make_engine()
    engine.fail_ids.add("bad")
    prompt = encode(loaded, PROMPTS[0])

    async def main():
        ok = asyncio.create_task(generate_text(engine, request("ok", prompt, max_tokens=20)))
        with pytest.raises(ServerError):
            await generate_text(engine, request("bad", prompt))
        return await ok

    _, last = run(main())
    assert last.completion_tokens == 20
    engine.check_health()
    assert engine.stats().requests_failed == 1
    _, last = run(generate_text(engine, request("after", prompt, max_tokens=3)))
    assert last.finish_reason == "length"


def test_shutdown(loaded, make_engine) -> None:
    engine = make_engine()
    engine.check_health()
    engine.shutdown()
    with pytest.raises(UpstreamUnavailableError):
        engine.check_health()
    with pytest.raises(UpstreamUnavailableError):
        run(generate_text(engine, request("r", [1, 2, 3])))
