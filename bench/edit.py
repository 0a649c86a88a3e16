"""Next-edit benchmark: latency of a typical IDE request, and what speculation buys.

    .venv/bin/python bench/edit.py --key $SERVE_APP_API_KEY     # against a running service
    .venv/bin/python -m bench.edit --in-process --threads 1      # engines in this process

The prompt is ``EXAMPLE_EDIT_CONTENT``: a ~40-line file, 3 recently viewed snippets and 3 diffs.
The first request is cold; the repeats show what the prefix cache saves for an IDE that
re-sends the same context.

``--in-process`` builds the prompt as the edit service does and runs it, in one run, on the HF
backend (today's engine), on the runner without speculation and on the runner with
prompt-lookup speculation (``--draft-tokens``), printing latencies, the speedups and the
acceptance rate. The greedy outputs of all three are compared (speculation must not change
them; int4 weights may).
"""

from __future__ import annotations

import asyncio
import time

from bench.common import base_parser, percentile, session, table
from tests.fixtures.edit import EXAMPLE_EDIT_CONTENT


async def run(args) -> list[list[str]]:
    """The first request reads the whole prompt (cold); the repeats are what an IDE sees
    while the user keeps typing: the same context, mostly served from the prefix cache."""
    rows = [["case", "requests", "p50 s", "p95 s", "prompt tok", "cached tok", "output tok"]]
    body = {
        "model": args.model,
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "messages": [{"role": "user", "content": EXAMPLE_EDIT_CONTENT}],
    }
    samples: list[tuple[float, dict]] = []
    async with session(args.key) as http:
        for _ in range(args.repeats + 1):
            start = time.perf_counter()
            async with http.post(f"{args.url}/v1/edit/completions", json=body) as response:
                response.raise_for_status()
                usage = (await response.json())["usage"]
            samples.append((time.perf_counter() - start, usage))
    for case, group in (("cold (first)", samples[:1]), ("repeat", samples[1:])):
        latencies = [seconds for seconds, _ in group]
        usage = group[-1][1]
        rows.append(
            [
                case,
                str(len(group)),
                f"{percentile(latencies, 50):.2f}",
                f"{percentile(latencies, 95):.2f}",
                str(usage["prompt_tokens"]),
                str(usage["cached_input_tokens"]),
                str(usage["completion_tokens"]),
            ]
        )
    return rows


def main() -> None:
    parser = base_parser(__doc__, "edit")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--in-process", action="store_true")
    parser.add_argument("--source", default="embedded:qwen2.5-coder-0.5b")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--weights", default="int4", choices=["int4", "dense"])
    parser.add_argument("--draft-tokens", type=int, default=6)
    args = parser.parse_args()
    if args.in_process:
        from bench.edit_engine import run_in_process

        print(table(run_in_process(args)))
    else:
        print(table(asyncio.run(run(args))))


if __name__ == "__main__":
    main()
