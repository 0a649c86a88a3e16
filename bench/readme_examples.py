"""README's request examples, run for real: each answer against the one README shows.

    .venv/bin/python -m bench.readme_examples                     # in process, embedded model
    .venv/bin/python -m bench.readme_examples --url http://127.0.0.1:8000 --key $KEY  # `make run`

Every ``curl`` command in README.md's ``bash`` blocks is parsed into a request (method, path,
headers, JSON body) and sent; ``tests/test_readme_examples.py`` sends the same requests to the
tiny random model and checks status and shape, so README and code cannot drift apart. Here the
model is the embedded default one, and the answer is the point: a block marked
``<!-- answer: PATH -->`` right after an example's block holds what README says the example
answers, PATH naming the field (``choices[0].text``, ``data[*].id``, ``answers``), read from
the JSON body or joined over a stream's chunks. This prints each answer and whether it is the
one shown, and exits 1 if any is not.

In process, the app is the router on the real deployment classes (Serve's local testing mode)
with ``configs/local.yaml``'s ``args:`` as they are, so the answers are what ``make run``
serves on this CPU (``engine.weights: auto``: q4 decode steps and int8 prompts wherever
torch has its int8 engine and the runner's C kernels build; int8 without a C compiler; int4
where torch has no int8 engine; answers may differ between them).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
KEY_VARIABLE = "$KEY"
FENCE = re.compile(r"^(`{3,})(\w*)\s*$")
ANSWER_MARK = re.compile(r"^<!-- answer: (\S+) -->$")
PATH_STEP = re.compile(r"\.?([A-Za-z_]\w*)|\[(\d+)\]")


@dataclass(frozen=True)
class Example:
    """One request README shows, as curl would send it, and the answer README says it gets."""

    line: int  # of the curl command in README.md
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any] | None
    answer_path: str | None = None
    answer: str | None = None

    @property
    def stream(self) -> bool:
        return bool(self.body and self.body.get("stream"))

    def send(self, http: httpx.Client, key: str, model: str | None = None) -> httpx.Response:
        """Send it with ``key`` for ``$KEY`` (and ``model`` for the body's, if given)."""
        headers = {name: value.replace(KEY_VARIABLE, key) for name, value in self.headers.items()}
        body = self.body if model is None or self.body is None else {**self.body, "model": model}
        return http.request(self.method, self.path, headers=headers, json=body)


def fenced_blocks(text: str) -> Iterator[tuple[int, str, list[str]]]:
    """(line number of the first line, info string, lines) of each fenced block."""
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence = opening.group(1)  # closed by a line of as many backticks, or more
        end = next(
            i
            for i in range(index + 1, len(lines))
            if lines[i].startswith(fence) and not lines[i].strip("`").strip()
        )
        yield index + 2, opening.group(2), lines[index + 1 : end]
        index = end + 1


def shell_commands(block: list[str], first_line: int) -> Iterator[tuple[int, str, str | None]]:
    """(line, command, here-document) of each command in a bash block: continuation lines
    and quoted newlines joined, comments dropped, a ``<<'EOF'`` document read up to its
    ``EOF``."""
    index = 0
    while index < len(block):
        start = index
        command = block[index]
        while command.endswith("\\") or not quotes_closed(command):
            index += 1
            if command.endswith("\\"):
                command = command[:-1] + block[index]
            else:  # a newline inside quotes is part of the word
                command += "\n" + block[index]
        index += 1
        document = None
        heredoc = re.search(r"<<'(\w+)'\s*$", command)
        if heredoc:
            end = block.index(heredoc.group(1), index)
            document = "\n".join(block[index:end])
            command = command[: heredoc.start()]
            index = end + 1
        if command.strip() and not command.lstrip().startswith("#"):
            yield first_line + start, command, document


def quotes_closed(command: str) -> bool:
    try:
        shlex.split(command, comments=True)
    except ValueError:  # "No closing quotation": the quoted text goes on on the next line
        return False
    return True


def parse_curl(line: int, command: str, document: str | None) -> Example | None:
    """The request a ``curl`` command sends to the local service (None: not one)."""
    words = shlex.split(command, comments=True)
    if not words or words[0] != "curl":
        return None
    headers: dict[str, str] = {}
    data = url = None
    options = iter(words[1:])
    for word in options:
        if word in ("-H", "--header"):
            name, value = next(options).split(":", 1)
            headers[name.strip()] = value.strip()
        elif word in ("-d", "--data"):
            data = next(options)
        elif not word.startswith("-"):
            url = word
    if url is None or not url.startswith("localhost:8000/"):
        return None
    if data == "@-":
        data = document
    body = None if data is None else json.loads(data)
    path = url.removeprefix("localhost:8000")
    return Example(line, "GET" if body is None else "POST", path, headers, body)


def readme_examples(text: str) -> list[Example]:
    """Every curl request in ``text``'s bash blocks, each with the answer README shows for it
    (the ``<!-- answer: PATH -->`` block before the next bash block; it holds for each
    request of the block)."""
    examples: list[Example] = []
    blocks = list(fenced_blocks(text))
    lines = text.splitlines()
    for number, (first, info, block) in enumerate(blocks):
        if info != "bash":
            continue
        found = [
            example
            for line, command, document in shell_commands(block, first)
            if (example := parse_curl(line, command, document)) is not None
        ]
        answer_path, answer = shown_answer(lines, blocks[number + 1 :])
        examples += [
            Example(**{**vars(example), "answer_path": answer_path, "answer": answer})
            for example in found
        ]
    return examples


def shown_answer(
    lines: list[str], later: list[tuple[int, str, list[str]]]
) -> tuple[str | None, str | None]:
    """The marked answer block among ``later`` blocks, up to the next bash block."""
    for first, info, block in later:
        if info == "bash":
            break
        mark = ANSWER_MARK.match(lines[first - 3]) if first >= 3 else None
        if mark is not None:
            return mark.group(1), "\n".join(block)
    return None, None


def read_path(value: Any, path: str) -> Any:
    """``choices[0].message.content``-style path into JSON (None where it leads nowhere);
    ``[*]`` maps the rest of the path over a list."""
    if "[*]" in path:
        head, rest = path.split("[*]", 1)
        items = read_path(value, head) if head else value
        rest = rest.removeprefix(".")
        return [read_path(item, rest) if rest else item for item in items or []]
    for name, index in PATH_STEP.findall(path):
        if name:
            value = value.get(name) if isinstance(value, dict) else None
        else:
            value = value[int(index)] if isinstance(value, list) and value else None
        if value is None:
            return None
    return value


def stream_chunks(response: httpx.Response) -> list[dict]:
    """The JSON chunks of an SSE answer (``data: [DONE]`` ends it)."""
    data = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    if not data or data[-1] != "[DONE]":
        raise ValueError("the stream does not end with data: [DONE]")
    return [json.loads(item) for item in data[:-1]]


def answer_of(example: Example, response: httpx.Response) -> str:
    """The answer at ``example.answer_path``, rendered as README shows it: text as is, a list
    one item a line, decision answers one question a line."""
    path = example.answer_path or ""
    if example.stream:
        parts = [read_path(chunk, path) for chunk in stream_chunks(response)]
        return "".join(part for part in parts if isinstance(part, str))
    value = read_path(response.json(), path)
    if path == "answers":
        return "\n".join(f"{name}: {decided(answer)}" for name, answer in value.items())
    if isinstance(value, list):
        return "\n".join(str(item) for item in value)
    return str(value)


def decided(answer: dict) -> str:
    """A decision as a reader takes it: yes/no on the side of 0.5, the chosen label, the
    nearest score level's criterion."""
    if answer["type"] == "noul":
        return "yes" if answer["noul"] > 0.5 else "no"
    if answer["type"] == "choice":
        return answer["choice"]
    return answer["legend"][str(round(answer["score"]))]


@contextmanager
def in_process_client(only_model: str | None = None) -> Iterator[tuple[httpx.Client, str]]:
    """The router app on the embedded model with configs/local.yaml's args (a fresh store);
    ``only_model``: that model alone, serving every role (a benchmark of one model)."""
    import ray
    from fastapi.testclient import TestClient

    from serve_app.config import AppConfig
    from serve_app.testing import local_router_app

    # A Ray of its own, in a folder of its own: the replicas ask Ray for their CPU allotment,
    # which would otherwise join (or become) the cluster others on this machine find.
    document = yaml.safe_load((ROOT / "configs" / "local.yaml").read_text())
    args = document["applications"][0]["args"]
    if only_model is not None:
        models = [model for model in args["models"] if model["id"] == only_model]
        roles = {role: only_model for role in args["roles"]}
        args = {**args, "models": models, "roles": roles}
    key = "sk-sa-readme-0123456789abcdefghijklmn"
    os.environ["SERVE_APP_API_KEY"] = key  # the local account's key on an empty store
    with tempfile.TemporaryDirectory(dir="/tmp", ignore_cleanup_errors=True) as scratch:
        ray.init(address="local", include_dashboard=False, log_to_driver=False, _temp_dir=scratch)
        try:
            config = AppConfig.model_validate({**args, "data_dir": scratch})
            with TestClient(local_router_app(config), raise_server_exceptions=False) as client:
                yield client, key
        finally:
            ray.shutdown()


def run(http: httpx.Client, key: str, examples: list[Example]) -> int:
    """Send each example, print its answer against README's; the number that differ."""
    wrong = 0
    for example in examples:
        response = example.send(http, key)
        print(f"README.md:{example.line} {example.method} {example.path}: {response.status_code}")
        if response.status_code != 200:
            print(response.text[:2000])
            wrong += 1
            continue
        if example.answer_path is None:
            print("  README shows no answer for it")
            wrong += 1
            continue
        answer = answer_of(example, response)
        same = answer == example.answer
        wrong += not same
        print(f"  {example.answer_path} {'== README' if same else '!= README'}:")
        print("    " + repr(answer))
        if not same:
            print("  README shows:\n    " + repr(example.answer))
    return wrong


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running service (default: the app in this process)")
    parser.add_argument("--key", default=os.environ.get("SERVE_APP_API_KEY"))
    parser.add_argument("--readme", type=Path, default=README)
    parser.add_argument("--only", help="run only the examples whose path contains this")
    args = parser.parse_args()
    examples = readme_examples(args.readme.read_text())
    if args.only:
        examples = [example for example in examples if args.only in example.path]
    if args.url:
        with httpx.Client(base_url=args.url, timeout=600) as http:
            wrong = run(http, args.key, examples)
    else:
        with in_process_client() as (http, key):
            wrong = run(http, key, examples)
    print(f"{len(examples) - wrong} of {len(examples)} examples answer as README shows")
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
