"""Chat tool calls on a public function-calling set: do the calls parse, fit their schemas,
and pick the right function and arguments? Beside llama.cpp's server on the same GGUF.

    python -m bench.tools --data data/bfcl                      # in process, local.yaml's 0.5B
    python -m bench.tools --data data/bfcl --llama-url http://127.0.0.1:8090   # + llama.cpp
    python -m bench.tools --url http://127.0.0.1:8000 --key $KEY --data data/bfcl

The cases are the Berkeley Function Calling Leaderboard's (gorilla, Apache-2.0) ``simple``
(one function, one expected call) and ``multiple`` (several functions, one expected call)
categories: fetch the repository and copy ``bfcl_eval/data/BFCL_v4_{simple_python,multiple}
.json`` and their ``possible_answer/`` files into one folder; nothing of it is committed. The
first ``--cases`` of each category are sent as OpenAI chat requests, the functions converted as
BFCL's own OpenAI handler converts them (``.`` in names to ``_``; its ``dict``/``float``/
``tuple`` types to JSON schema's ``object``/``number``/``array``), greedy, 256 tokens, with
``tool_choice`` ``auto`` (the model decides, as BFCL asks it) or ``--tool-choice required``.

Per engine and category: how many answers hold a call, how many of the calls parse as JSON
and validate against their function's schema (jsonschema; the contract: all of them), and
how many answers are right by BFCL's AST rule, simplified: exactly one call, the expected
function, every argument one of the possible answers (strings compared lowercased without
spaces and punctuation, numbers by value), no unknown argument, an optional one absent only
where the answers allow it.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema

from bench.common import cpu_flags, table

CATEGORIES = {"simple": "BFCL_v4_simple_python.json", "multiple": "BFCL_v4_multiple.json"}
MODEL = "qwen2.5-coder-0.5b"
TYPES = {"dict": "object", "float": "number", "tuple": "array"}
_NOISE = re.compile(r"[\s,./\-_*^'\"]")


def openai_name(name: str) -> str:
    return name.replace(".", "_")


def openai_schema(schema: Any) -> Any:
    """BFCL's parameter schema as JSON schema, as its OpenAI handler sends it."""
    if isinstance(schema, list):
        return [openai_schema(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: openai_schema(value) for key, value in schema.items()}
    kind = schema.get("type")
    if isinstance(kind, str):
        if kind == "any":
            del out["type"]
        else:
            out["type"] = TYPES.get(kind, kind)
    return out


def load_cases(folder: Path, category: str, count: int) -> list[dict[str, Any]]:
    name = CATEGORIES[category]
    questions = [json.loads(line) for line in (folder / name).read_text().splitlines()]
    answers = {
        row["id"]: row["ground_truth"]
        for row in map(json.loads, (folder / "possible_answer" / name).read_text().splitlines())
    }
    cases = []
    for row in questions[:count]:
        tools = [
            {
                "type": "function",
                "function": {
                    "name": openai_name(f["name"]),
                    "description": f.get("description", ""),
                    "parameters": openai_schema(f["parameters"]),
                },
            }
            for f in row["function"]
        ]
        expected = [
            {openai_name(fn): args for fn, args in call.items()} for call in answers[row["id"]]
        ]
        cases.append({"id": row["id"], "messages": row["question"][0], "tools": tools,
                      "expected": expected})  # fmt: skip
    return cases


def same_value(got: Any, allowed: list[Any]) -> bool:
    for option in allowed:
        if isinstance(option, str) and isinstance(got, str):
            if _NOISE.sub("", option.lower()) == _NOISE.sub("", got.lower()):
                return True
        elif isinstance(option, bool) or isinstance(got, bool):
            if option is got:
                return True
        elif isinstance(option, int | float) and isinstance(got, int | float):
            if float(option) == float(got):
                return True
        elif option == got:
            return True
    return False


def ast_match(calls: list[dict[str, Any]], expected: list[dict[str, Any]], tools: list) -> bool:
    """BFCL's AST rule, simplified (module docstring)."""
    if len(calls) != 1 or len(expected) != 1:
        return False
    ((name, answers),) = expected[0].items()
    call = calls[0]
    if call["name"] != name:
        return False
    arguments = call["arguments"]
    properties = next(
        t["function"]["parameters"].get("properties", {})
        for t in tools
        if t["function"]["name"] == name
    )
    if any(key not in properties for key in arguments):
        return False
    for key, allowed in answers.items():
        if key not in arguments:
            if "" not in allowed:
                return False
        elif not same_value(arguments[key], allowed):
            return False
    return True


def ask(http: httpx.Client, url: str, key: str | None, case: dict, args: argparse.Namespace):
    body = {
        "model": args.model,
        "messages": case["messages"],
        "tools": case["tools"],
        "tool_choice": args.tool_choice,
        "temperature": 0,
        "max_tokens": 256,
    }
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    started = time.perf_counter()
    response = http.post(f"{url}/v1/chat/completions", json=body, headers=headers)
    seconds = time.perf_counter() - started
    if response.status_code != 200:
        return None, seconds, f"{response.status_code}: {response.text[:200]}"
    return response.json()["choices"][0]["message"], seconds, None


def judge(message: dict | None, case: dict) -> dict[str, Any]:
    """Whether the answer called, whether each call parsed and fit, whether it is right."""
    calls = (message or {}).get("tool_calls") or []
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in case["tools"]}
    parsed, valid = [], 0
    for call in calls:
        function = call["function"]
        try:
            arguments = json.loads(function["arguments"])
            jsonschema.validate(arguments, schemas[function["name"]])
        except (ValueError, KeyError, jsonschema.ValidationError, jsonschema.SchemaError):
            continue
        valid += 1
        parsed.append({"name": function["name"], "arguments": arguments})
    right = len(parsed) == len(calls) and ast_match(parsed, case["expected"], case["tools"])
    return {"called": bool(calls), "calls": len(calls), "valid": valid, "right": right}


def run_engine(
    name: str, http: Any, url: str, key: str | None, cases: dict, args: argparse.Namespace
) -> dict[str, list]:
    """Every case through one engine's chat endpoint (``url`` "": the in-process app)."""
    results: dict[str, list] = {}
    for category, rows in cases.items():
        for index, case in enumerate(rows):
            message, seconds, error = ask(http, url, key, case, args)
            verdict = judge(message, case) | {"seconds": seconds, "error": error}
            results.setdefault(category, []).append(verdict)
            if args.show or error:
                print(f"{name} {case['id']}: {verdict} {error or ''}")
                if args.show and message:
                    print(f"    {json.dumps(message)[:300]}")
            print(f"{name} {category} {index + 1}/{len(rows)}", end="\r", flush=True)
    print()
    return results


def report(all_results: dict[str, dict[str, list]]) -> str:
    rows = [["engine", "set", "cases", "answered with calls", "calls valid", "right (AST)",
             "p50 s"]]  # fmt: skip
    for engine, results in all_results.items():
        for category, verdicts in results.items():
            calls = sum(v["calls"] for v in verdicts)
            rows.append([
                engine, category, str(len(verdicts)),
                str(sum(v["called"] for v in verdicts)),
                f"{sum(v['valid'] for v in verdicts)}/{calls}",
                str(sum(v["right"] for v in verdicts)),
                f"{statistics.median(v['seconds'] for v in verdicts):.2f}",
            ])  # fmt: skip
    return table(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("data/bfcl"))
    parser.add_argument("--cases", type=int, default=30, help="per category")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--tool-choice", default="auto", choices=["auto", "required"])
    parser.add_argument("--url", help="a running service (default: the app in this process)")
    parser.add_argument("--key")
    parser.add_argument("--llama-url", help="llama.cpp's server with --jinja, same GGUF")
    parser.add_argument("--show", action="store_true", help="print every answer")
    args = parser.parse_args(argv)
    if not (args.data / CATEGORIES["simple"]).exists():
        parser.error(f"no BFCL data in {args.data}: see this module's docstring")
    cases = {c: load_cases(args.data, c, args.cases) for c in CATEGORIES}
    results = {}
    if args.url:
        with httpx.Client(timeout=600) as http:
            results["service"] = run_engine("service", http, args.url, args.key, cases, args)
    else:
        from bench.readme_examples import in_process_client

        with in_process_client(only_model=args.model) as (http, key):
            results["service"] = run_engine("service", http, "", key, cases, args)
    if args.llama_url:
        with httpx.Client(timeout=600) as http:
            results["llama.cpp"] = run_engine("llama.cpp", http, args.llama_url, None, cases, args)
    print(f"{args.model}, tool_choice {args.tool_choice}, greedy; CPU: {cpu_flags()}")
    print(report(results))


if __name__ == "__main__":
    main()
