"""Structured output: generated schemas through the API, and what a mask costs a decode step.

    python -m bench.structured_output --schemas 2000 [--data data/bfcl]

1. Robustness. ``--schemas`` JSON schemas drawn from the tests' strategies
   (tests/fixtures/schemas.py: valid ones, wrong types in keyword slots, unknown types, deep
   nesting, huge enums, contradictions, references to nowhere, remote or looping) are sent to
   the real router app in this process (the tiny model behind it), each as
   ``response_format`` and as a tool's ``parameters``. Counted: statuses (the contract: no
   5xx), and answers that ended under a schema, each checked by jsonschema (the contract:
   all valid).
2. Cost. The function schemas of BFCL's ``simple`` and ``multiple`` sets (public; see
   bench/tools.py for the folder), or the strategies' valid schemas without ``--data``, are
   compiled for the embedded model's tokenizer (151,936 ids); each is walked by sampling
   from its masks for up to 64 tokens, timing every mask as the engine applies it (the
   bitmask filled and turned into a logits mask). Beside it, in the same run: one decode step
   of the embedded 0.5B as the engine runs it (configs/local.yaml's engine, one stream).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from bench.common import cpu_flags, percentile, table

WALK_TOKENS = 64


def fuzz(count: int) -> tuple[Counter, int, int]:
    """Statuses over ``count`` schemas in both modes, finished answers, and how many failed
    validation."""
    import os
    import tempfile

    import jsonschema
    from fastapi.testclient import TestClient
    from hypothesis import HealthCheck, given, settings

    from serve_app.models.tiny import build_tiny_model
    from serve_app.testing import local_router_app
    from tests.conftest import AUTH, TEST_KEY, TINY_ID, tiny_config
    from tests.fixtures.schemas import SCHEMAS, chat_under_schema

    statuses: Counter = Counter()
    finished = invalid = 0
    root = Path(tempfile.mkdtemp())
    config = tiny_config("tiny:" + str(build_tiny_model(root / "tiny")), root / "data")
    os.environ["SERVE_APP_API_KEY"] = TEST_KEY
    with TestClient(local_router_app(config), raise_server_exceptions=False) as client:

        @settings(max_examples=count, deadline=None, suppress_health_check=list(HealthCheck))
        @given(schema=SCHEMAS)
        def run(schema: Any) -> None:
            nonlocal finished, invalid
            for mode in ("response_format", "tools"):
                body = json.dumps(chat_under_schema(TINY_ID, schema, mode))  # NaN as is
                headers = {**AUTH, "Content-Type": "application/json"}
                response = client.post("/v1/chat/completions", content=body, headers=headers)
                statuses[response.status_code] += 1
                if response.status_code != 200:
                    continue
                (choice,) = response.json()["choices"]
                answers = [
                    call["function"]["arguments"]
                    for call in choice["message"].get("tool_calls") or []
                ]
                if mode == "response_format" and choice["finish_reason"] == "stop":
                    answers.append(choice["message"]["content"])
                for answer in answers:
                    finished += 1
                    try:
                        jsonschema.validate(json.loads(answer), schema)
                    except (ValueError, jsonschema.ValidationError):
                        invalid += 1

        run()
    return statuses, finished, invalid


def cost_schemas(data: Path | None, count: int) -> list[Any]:
    if data is not None and (data / "BFCL_v4_simple_python.json").exists():
        from bench.tools import CATEGORIES, load_cases

        schemas = []
        for category in CATEGORIES:
            for case in load_cases(data, category, count):
                schemas += [tool["function"]["parameters"] for tool in case["tools"]]
        return schemas[: 2 * count]
    from hypothesis import HealthCheck, given, settings

    from tests.fixtures.schemas import VALID

    found: list[Any] = []

    @settings(max_examples=count, deadline=None, suppress_health_check=list(HealthCheck))
    @given(schema=VALID)
    def collect(schema: Any) -> None:
        found.append(schema)

    collect()
    return found


def mask_costs(schemas: list[Any], tokenizer: Any, eos: list[int]) -> tuple[list[float], int]:
    """Seconds per mask over random walks of each schema's grammar, and schemas refused."""
    from serve_app.engine.constraints import GrammarConstraint
    from serve_app.engine.sampling import TokenHistory
    from serve_app.grammar.matcher import GrammarTokenizer
    from serve_app.grammar.schema import SchemaError, compile_schema

    tokens = GrammarTokenizer.for_tokenizer(tokenizer, eos)
    size = len(tokenizer)
    generator = torch.Generator().manual_seed(0)
    seconds, refused = [], 0
    for schema in schemas:
        try:
            constraint = GrammarConstraint(compile_schema(schema, "schema"), tokens, eos)
        except SchemaError:
            refused += 1
            continue
        history = TokenHistory(prompt_ids=[0])
        for _ in range(WALK_TOKENS):
            logits = torch.randn(size, generator=generator)
            start = time.perf_counter()
            masked = constraint(logits, history)
            seconds.append(time.perf_counter() - start)
            token = int(torch.multinomial(torch.softmax(masked, -1), 1, generator=generator))
            if token in eos:
                break
            history.append(token)
    return seconds, refused


def decode_step_seconds() -> tuple[float, Any]:
    """One decode step of the embedded 0.5B, configs/local.yaml's engine, one stream: the
    median of the steps after the first token of up to 64 greedy tokens, over three prompts;
    and the loaded model."""
    import asyncio
    import sysconfig

    from serve_app.config import serve_file_configs
    from serve_app.engine.engine import LLMEngine
    from serve_app.engine.protocol import GenerationRequest, SamplingParams
    from serve_app.models.loader import load_model

    (config,) = serve_file_configs(Path(__file__).resolve().parents[1] / "configs/local.yaml")
    model = config.model(config.roles.edit)
    loaded = load_model(model.source)
    engine = LLMEngine(loaded, config.engine)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    steps = []

    async def one(prompt: list[int]) -> None:
        params = SamplingParams(max_tokens=64, temperature=0)
        times = []
        async for _ in engine.generate(
            GenerationRequest(f"r{len(steps)}", prompt, params, "bench")
        ):
            times.append(time.perf_counter())
        steps.extend(b - a for a, b in zip(times[1:], times[2:], strict=False))

    try:
        for name in ("csv.py", "json/decoder.py", "textwrap.py"):
            prompt = loaded.tokenizer.encode((stdlib / name).read_text()[:1500])
            asyncio.run(one(prompt))
    finally:
        engine.shutdown()
    return statistics.median(steps), loaded


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schemas", type=int, default=2000, help="generated, per mode")
    parser.add_argument("--cost-schemas", type=int, default=30, help="per BFCL category")
    parser.add_argument("--data", type=Path, default=Path("data/bfcl"))
    parser.add_argument("--skip-fuzz", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"CPU: {cpu_flags()}")
    if not args.skip_fuzz:
        started = time.monotonic()
        statuses, finished, invalid = fuzz(args.schemas)
        server_errors = sum(n for status, n in statuses.items() if status >= 500)
        print(
            f"fuzz: {args.schemas} schemas x 2 modes in {time.monotonic() - started:.0f}s; "
            f"statuses {dict(sorted(statuses.items()))}; 5xx: {server_errors}; "
            f"finished answers {finished}, invalid {invalid}"
        )
    step, loaded = decode_step_seconds()
    eos = sorted(loaded.eos_token_ids)
    schemas = cost_schemas(args.data, args.cost_schemas)
    seconds, refused = mask_costs(schemas, loaded.tokenizer, eos)
    rows = [["", "p50 ms", "p99 ms", "max ms", "p50 / decode step", "p99 / decode step"]]
    p50, p99 = percentile(seconds, 50), percentile(seconds, 99)
    rows.append([
        f"mask ({len(seconds)} tokens, {len(schemas) - refused} schemas)",
        f"{p50 * 1e3:.2f}", f"{p99 * 1e3:.2f}", f"{max(seconds) * 1e3:.2f}",
        f"{p50 / step:.1%}", f"{p99 / step:.1%}",
    ])  # fmt: skip
    rows.append(["decode step, 0.5B", f"{step * 1e3:.1f}", "", "", "", ""])
    print(f"schemas refused: {refused} of {len(schemas)}")
    print(table(rows))


if __name__ == "__main__":
    main()
