"""The soak's traffic: one closed-loop user per account, in the clients' request shapes."""

from __future__ import annotations

import itertools
import random
import threading
import time
from dataclasses import dataclass

import httpx

from bench.soak import (
    ACCOUNTS,
    APPLY_GAP_S,
    BROKE,
    CANCEL_SHARE,
    KEYSTROKE_GAP_S,
    KEYSTROKES,
    LIMITED,
    LIMITED_RPM,
)
from bench.soak.calls import Call, send


@dataclass(frozen=True)
class Material:
    """Code a session works on: a prefix, the line being typed, the rest of the file."""

    path: str
    prefix: str
    line: str
    suffix: str


def materials(count: int, seed: int) -> list[Material]:
    from bench.keystroke import typing_sessions

    sessions = typing_sessions(count, KEYSTROKES, seed)
    return [
        Material(s.source.split(":")[0], s.prefix[-2000:], s.line, s.suffix[:600]) for s in sessions
    ]


class Traffic:
    """The client loops and every ``Call`` they made (``calls``, in order of ending)."""

    def __init__(self, url: str, model: str, keys: dict[str, str], tiny: bool, seed: int = 0):
        self.url = url
        self.model = model
        self.keys = keys
        self.tiny = tiny
        self.seed = seed
        self.calls: list[Call] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.materials = materials(24, seed)
        self.client_timeout = 600.0

    def record(self, call: Call) -> Call:
        with self.lock:
            self.calls.append(call)
        return call

    def snapshot(self) -> list[Call]:
        with self.lock:
            return list(self.calls)

    def start(self) -> None:
        for index, account in enumerate(ACCOUNTS):
            thread = threading.Thread(target=self.user, args=(account, index), daemon=True)
            thread.start()
            self.threads.append(thread)
        applier = threading.Thread(target=self.applier, daemon=True)
        applier.start()
        self.threads.append(applier)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=self.client_timeout)

    def send(
        self, client: httpx.Client, account: str, kind: str, path: str, body: dict,
        cancel: bool = False,
    ) -> Call:  # fmt: skip
        call = send(client, self.url, self.keys[account], account, kind, path, body, cancel)
        return self.record(call)

    def user(self, account: str, index: int) -> None:
        rng = random.Random(self.seed * 100 + index)
        with httpx.Client(timeout=self.client_timeout) as client:
            while not self.stop.is_set():
                material = rng.choice(self.materials)
                self.keystrokes(client, account, material, rng)
                if self.stop.is_set():
                    break
                kind = rng.choice(("next-edit", "apply", "decisions", "chat"))
                path, body = getattr(self, kind.replace("-", "_"))(account, material, rng)
                cancel = bool(body.get("stream")) and rng.random() < CANCEL_SHARE
                self.send(client, account, kind, path, self.long(body) if cancel else body, cancel)

    def applier(self) -> None:
        """Applies in a loop, as Continue (streamed) and ProxyAI (one answer) in turn: apply is
        cheap, so its windows hold the hundreds of requests a p99 needs (the user loops give it
        about 17 in five minutes, and a p99 of 17 is their slowest)."""
        rng = random.Random(self.seed * 100 + len(ACCOUNTS))
        shapes = (ACCOUNTS[0], ACCOUNTS[-1])
        with httpx.Client(timeout=self.client_timeout) as client:
            for turn in itertools.count():
                if self.stop.is_set():
                    return
                account = shapes[turn % 2]
                path, body = self.apply(account, rng.choice(self.materials), rng)
                self.send(client, account, "apply", path, body)
                time.sleep(APPLY_GAP_S)

    def long(self, body: dict) -> dict:
        """A stream the client will close: long enough that it is still running then."""
        return {**body, "max_tokens": 256, "stop": []}

    def keystrokes(
        self, client: httpx.Client, account: str, material: Material, rng: random.Random
    ) -> None:
        """Typing a line: a FIM request a keystroke, the prefix one character longer each."""
        for typed in range(1, KEYSTROKES + 1):
            if self.stop.is_set():
                return
            stream = typed % 2 == 0
            body = {
                "model": self.model,
                "prompt": material.prefix + material.line[:typed],
                "suffix": material.suffix,
                "max_tokens": 16,
                "temperature": 0,
                "stop": ["\n"],
            }
            if stream:
                body |= {"stream": True, "stream_options": {"include_usage": True}}
            cancel = stream and rng.random() < CANCEL_SHARE
            path = "/v1/fim/completions" if stream else "/v1/completions"
            self.send(client, account, "fim", path, self.long(body) if cancel else body, cancel)
            time.sleep(KEYSTROKE_GAP_S)

    def next_edit(self, account: str, material: Material, rng: random.Random) -> tuple[str, dict]:
        from tests.fixtures.edit_clients import (
            EDIT_PATH,
            Scenario,
            continue_call,
            kilo_call,
            zed_call,
        )

        lines = (material.prefix.rsplit("\n", 30)[-30:] if material.prefix else [""])[:-1]
        lines = [*lines, material.line, *material.suffix.split("\n")[:8]]
        row = min(len(lines) - 1, 24)
        changed = f"{lines[row - 2]}  # reviewed"
        hunk = f"@@ -{row - 1},1 +{row - 1},1 @@\n-{lines[row - 2]}\n+{changed}"
        lines[row - 2] = changed
        scenario = Scenario(
            path=material.path, file="\n".join(lines), cursor=(row, 0), first_line=row,
            last_line=min(row + 4, len(lines) - 1), snippets=(), hunks=(hunk,),
        )  # fmt: skip
        build = {"soak-a": continue_call, "soak-b": zed_call}.get(account, kilo_call)
        body = dict(build(scenario, self.model).body)
        if self.tiny:  # random weights write to max_tokens: keep it short
            body["max_tokens"] = 48
        return EDIT_PATH, body

    def apply(self, account: str, material: Material, rng: random.Random) -> tuple[str, dict]:
        from tests.clients import continue_apply_messages, tagged_apply

        lines = material.prefix.split("\n")[-16:]
        at = rng.randrange(len(lines))
        edited = [*lines]
        edited[at] = f"{lines[at]}  # updated"
        snippet = "\n".join(edited[max(0, at - 2) : at + 3])
        original = "\n".join(lines)
        if account == "soak-a":  # Continue: its prompt and prefill, streamed
            body = {"model": self.model, "messages": continue_apply_messages(original, snippet),
                    "temperature": 0.0, "stream": True,
                    "stream_options": {"include_usage": True}}  # fmt: skip
        else:  # ProxyAI: the tagged format, one answer
            content = tagged_apply(original, snippet)
            body = {"model": self.model, "messages": [{"role": "user", "content": content}],
                    "stream": False}  # fmt: skip
        if self.tiny:
            body["max_tokens"] = 64
        return "/v1/apply/completions", body

    def decisions(self, account: str, material: Material, rng: random.Random) -> tuple[str, dict]:
        body = {
            "model": self.model,
            "state": material.prefix[-1200:],
            "questions": {
                "done": {"type": "noul", "instructions": "Is the function complete?"},
                "next": {
                    "type": "choice",
                    "criteria": {"test": "write a test", "refactor": None, "ship": None},
                },
            },
        }
        return "/v1/decisions", body

    def chat(self, account: str, material: Material, rng: random.Random) -> tuple[str, dict]:
        question = f"What does this line do?\n```\n{material.line}\n```"
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 48,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        return "/v1/chat/completions", body

    def refusals(self) -> None:
        """The designed refusals of an interval: the rate-limited account sends short FIM
        requests until two 429s (or 3x its rate), the spent account one request (402)."""
        body = {"model": self.model, "prompt": "x", "max_tokens": 1}
        with httpx.Client(timeout=self.client_timeout) as client:
            limited = 0
            for _ in range(3 * LIMITED_RPM):
                call = self.send(client, LIMITED, "burst", "/v1/fim/completions", body)
                limited += call.status == 429
                if limited == 2 or self.stop.is_set():
                    break
            self.send(client, BROKE, "quota", "/v1/fim/completions", body)
