"""What the runner's tests share: prompts, the tiny model with outputs that depend on
them, and requests run through a real engine."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path

from serve_app.engine.engine import LLMEngine
from serve_app.engine.protocol import GenerationRequest, SamplingParams, generate_text
from serve_app.engine_config import EngineConfig
from serve_app.models.loader import LoadedModel

PROMPTS = [
    "def add(a, b):",
    "class Point:\n    def __init__(self, x, y):",
    "for i in range(10):\n    print(i)\n" * 3,
    "x",
    "import os\nimport sys\n\nif __name__ == '__main__':\n    main()\n" * 2,
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):",
]


def generate_all(
    loaded: LoadedModel,
    config: EngineConfig,
    requests: list[GenerationRequest],
    draft: LoadedModel | None = None,
    adapters: Mapping[str, Path] | None = None,
) -> tuple[list[str], LLMEngine]:
    """Run requests concurrently on a new engine (with ``draft`` as its draft model and
    ``adapters`` its LoRA adapters): each one's text, and the engine (its stats stay readable
    after shutdown)."""
    engine = LLMEngine(loaded, config, draft=draft, adapters=adapters)
    try:

        async def main():
            return await asyncio.gather(*(generate_text(engine, r) for r in requests))

        results = asyncio.run(asyncio.wait_for(main(), timeout=120))
    finally:
        engine.shutdown()
    return [text for text, _ in results], engine


def encode(loaded: LoadedModel, text: str) -> list[int]:
    return loaded.tokenizer.encode(text)


def greedy(
    rid: str, prompt: list[int], n: int, route: str = "", adapter: str = ""
) -> GenerationRequest:
    return GenerationRequest(
        rid, prompt, SamplingParams(max_tokens=n), "test", route=route, adapter=adapter
    )
