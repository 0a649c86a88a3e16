"""Typing sessions replayed as an IDE sends them: what a user feels per keystroke.

    python -m bench.keystroke --key $KEY [--llama-url http://127.0.0.1:8090] [--sessions 8]

A session is a place in a standard-library module (``bench.fim_cases.stdlib_files``): the
~1,000 tokens before a line (the prefix), the ~300 tokens after it (the suffix, which stays),
and the user typing that line's first characters one keystroke at a time. Each keystroke is
one request in the shape Continue and Zed send (``POST /v1/completions`` with the whole
prefix typed so far and the suffix; one line, at most 16 tokens, greedy), sent when the last
answer came back, a few keystrokes then a pause (the next session). Figures:

- per keystroke, p50 / p90 (every keystroke after a session's first request);
- the session's first request (its prompt cold);
- the same prompt again (the last keystroke's request repeated);
- a new line after a cached prefix (the user finishes the line and presses enter);
- prompt tokens read per keystroke (prompt less cached, from usage);
- keystrokes whose answer completes the line exactly (typed + answer == the line).

With ``--llama-url``, the same sessions go to llama-server's ``/infill`` on the same GGUF
(``input_prefix``, ``input_suffix``, ``cache_prompt``; tokens read from its ``timings``), in
the same run, one engine after the other; the ratio column is this service / llama.cpp (for
times, below 1 is better). Sessions are drawn with ``--seed`` (default: the clock, printed),
so a server that ran this before still sees new text.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp

from bench.common import base_parser, cpu_flags, percentile, session, table
from bench.fim_cases import stdlib_files

PREFIX_CHARS = 4000  # ~1,000 tokens of Python
SUFFIX_CHARS = 1200  # ~300 tokens
MAX_TOKENS = 16


@dataclass(frozen=True)
class TypingSession:
    source: str
    prefix: str  # the file before the line being typed
    line: str
    suffix: str
    keystrokes: int


def typing_sessions(count: int, keystrokes: int, seed: int) -> list[TypingSession]:
    rng = random.Random(seed)
    files = [(p.name, p.read_text(errors="replace")) for p in stdlib_files()]
    sessions: list[TypingSession] = []
    while len(sessions) < count:
        name, text = rng.choice(files)
        starts = [i for i, c in enumerate(text) if c == "\n" and i > PREFIX_CHARS]
        start = rng.choice(starts) + 1
        end = text.find("\n", start)
        line = text[start:end]
        if len(line.strip()) < keystrokes + 8 or line.lstrip().startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        prefix = text[start - PREFIX_CHARS : start] + line[:indent]
        sessions.append(
            TypingSession(
                f"{name}:{text.count(chr(10), 0, start) + 1}",
                prefix,
                line[indent:],
                text[end : end + SUFFIX_CHARS],
                keystrokes,
            )
        )
    return sessions


@dataclass
class Answer:
    seconds: float
    text: str
    read_tokens: int


# One request: (session, prefix, suffix) -> Answer.
Complete = Callable[[aiohttp.ClientSession, str, str], Awaitable[Answer]]


def service(args) -> Complete:
    async def complete(http: aiohttp.ClientSession, prefix: str, suffix: str) -> Answer:
        body = {
            "model": args.model,
            "prompt": prefix,
            "suffix": suffix,
            "max_tokens": MAX_TOKENS,
            "temperature": 0,
            "stop": ["\n"],
        }
        start = time.perf_counter()
        async with http.post(f"{args.url}/v1/completions", json=body) as response:
            response.raise_for_status()
            answer = await response.json()
        usage = answer["usage"]
        read = usage["prompt_tokens"] - usage.get("cached_input_tokens", 0)
        return Answer(time.perf_counter() - start, answer["choices"][0]["text"], read)

    return complete


def llama(args) -> Complete:
    async def complete(http: aiohttp.ClientSession, prefix: str, suffix: str) -> Answer:
        body = {
            "input_prefix": prefix,
            "input_suffix": suffix,
            "n_predict": MAX_TOKENS,
            "temperature": 0,
            "top_k": 1,
            "stop": ["\n"],
            "cache_prompt": True,
        }
        start = time.perf_counter()
        async with http.post(f"{args.llama_url}/infill", json=body) as response:
            response.raise_for_status()
            answer = await response.json()
        read = answer.get("timings", {}).get("prompt_n", 0)
        return Answer(time.perf_counter() - start, answer["content"], read)

    return complete


@dataclass
class Figures:
    keystroke: list[float] = field(default_factory=list)
    cold: list[float] = field(default_factory=list)
    repeat: list[float] = field(default_factory=list)
    new_line: list[float] = field(default_factory=list)
    read: list[int] = field(default_factory=list)
    exact: int = 0


async def replay(complete: Complete, key: str | None, sessions: list[TypingSession]) -> Figures:
    figures = Figures()
    async with session(key) as http:
        for s in sessions:
            first = await complete(http, s.prefix, s.suffix)
            figures.cold.append(first.seconds)
            typed = ""
            for c in s.line[: s.keystrokes]:
                typed += c
                answer = await complete(http, s.prefix + typed, s.suffix)
                figures.keystroke.append(answer.seconds)
                figures.read.append(answer.read_tokens)
                figures.exact += (typed + answer.text).rstrip() == s.line.rstrip()
            figures.repeat.append((await complete(http, s.prefix + typed, s.suffix)).seconds)
            # The user finishes the line and presses enter: a new last line, the same suffix.
            enter = await complete(http, s.prefix + s.line + "\n", s.suffix)
            figures.new_line.append(enter.seconds)
    return figures


def rows_for(results: dict[str, Figures]) -> list[list[str]]:
    def p50(values: list[float]) -> float:
        return statistics.median(values)

    measures: list[tuple[str, Callable[[Figures], float], str]] = [
        ("per keystroke, p50 (s)", lambda f: p50(f.keystroke), "{:.3f}"),
        ("per keystroke, p90 (s)", lambda f: percentile(f.keystroke, 90), "{:.3f}"),
        ("first request of a session, cold, p50 (s)", lambda f: p50(f.cold), "{:.3f}"),
        ("the same prompt again, p50 (s)", lambda f: p50(f.repeat), "{:.3f}"),
        ("a new line after a cached prefix, p50 (s)", lambda f: p50(f.new_line), "{:.3f}"),
        ("prompt tokens read per keystroke, mean", lambda f: statistics.mean(f.read), "{:.1f}"),
        ("keystrokes completing the line exactly", lambda f: f.exact, "{:.0f}"),
    ]
    engines = list(results)
    head = ["measure", *engines]
    if len(engines) == 2:
        head.append(f"{engines[0]} / {engines[1]}")
    rows = [head]
    for name, measure, fmt in measures:
        values = [measure(results[e]) for e in engines]
        row = [name, *(fmt.format(v) for v in values)]
        if len(engines) == 2:
            row.append(f"{values[0] / values[1]:.2f}" if values[1] else "-")
        rows.append(row)
    return rows


def main() -> None:
    parser = base_parser(__doc__.split("\n")[0], "fim")
    parser.add_argument("--llama-url", default=None)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--keystrokes", type=int, default=4)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else time.time_ns() % 1_000_000
    sessions = typing_sessions(args.sessions, args.keystrokes, seed)
    engines: dict[str, tuple[Complete, str | None]] = {"service": (service(args), args.key)}
    if args.llama_url:
        engines["llama.cpp"] = (llama(args), None)
    results = {
        name: asyncio.run(replay(complete, key, sessions))
        for name, (complete, key) in engines.items()
    }
    keystrokes = sum(s.keystrokes for s in sessions)
    print(
        f"{len(sessions)} typing sessions ({keystrokes} keystrokes), seed {seed}; "
        f"one line of <= {MAX_TOKENS} tokens per request; CPU: {cpu_flags()}"
    )
    print(table(rows_for(results)))


if __name__ == "__main__":
    main()
