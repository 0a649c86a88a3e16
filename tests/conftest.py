"""Shared fixtures: a tiny-model config, the router app in-process, and the real Serve graph.

The in-process app is the real FastAPI router wired to the real deployment classes through
Ray Serve's local testing mode (real handles, no cluster), so contract tests run in seconds.
``tests/test_serve_graph.py`` starts the real graph from configs/local.yaml.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import pytest

from serve_app.config import AppConfig, AuthOptions, HttpLimits, ModelConfig, Roles
from serve_app.engine_config import NO_SPECULATION, EngineConfig, SpeculationConfig

if TYPE_CHECKING:
    from serve_app.models.loader import LoadedModel

TEST_KEY = "sk-sa-test-0123456789abcdefghijklmnop"
TINY_ID = "tiny-qwen2"
AUTH = {"Authorization": f"Bearer {TEST_KEY}"}

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules that use the session's ``graph`` run last, in their own order: the graph
    starts with the first of them, not with the suite's first module, and is no longer up
    beside every other test (an idle graph takes ~14% of two cores) nor beside the graphs
    that test_autoscale and test_cluster start of their own. tests/test_soak.py, which kills
    each of its deployments, stays last of them."""
    on_graph = {item.module for item in items if "graph" in item.fixturenames}
    items.sort(key=lambda item: item.module in on_graph)  # stable: the rest keep their order


# A FIM request still running seconds after it starts, for tests of what a deadline, a client
# that leaves or a dying replica does to work in flight. Greedy from "x" with a small presence
# penalty, the tiny random model repeats one token ("self" or "class", by CPU) and never samples
# eos, so it writes all of the schema's 8,192 tokens: one a step with FIM speculation off (the
# test graph's setting), ~5 s on a fast AVX-512 CPU, ~13 s on the AVX2 box. With speculation
# on, prompt lookup accepts nearly every draft and it runs ~3x faster. Needs a context of
# LONG_CONTEXT.
LONG_FIM = {
    "prompt": "x",
    "temperature": 0.0,
    "presence_penalty": 0.2,
    "stop": [],
    "max_tokens": 8192,
}
LONG_CONTEXT = 16384


@pytest.fixture(scope="session")
def tiny_source(tmp_path_factory: pytest.TempPathFactory) -> str:
    from serve_app.models.tiny import build_tiny_model

    return "tiny:" + str(build_tiny_model(tmp_path_factory.mktemp("tiny-model")))


def tiny_config(
    tiny_source: str, data_dir: Path, *, context_length: int = 4096, **overrides
) -> AppConfig:
    """The whole service on the tiny model: small context so limits are cheap to reach."""
    fields = {
        "models": [
            ModelConfig(
                id=TINY_ID,
                source=tiny_source,
                name="Tiny Qwen2 (random weights)",
                description="A tiny random model for tests.",
                context_length=context_length,
                max_output_length=8192,
                openrouter_slug="test/tiny-qwen2",
                datacenters=["US", "DE"],
                aliases=["mercury-coder"],  # as configs/local.yaml: Zed's hard-coded id
            )
        ],
        "roles": Roles(fim=TINY_ID, edit=TINY_ID, decisions=TINY_ID),
        "engine": EngineConfig(torch_threads=1, max_batch_size=4, prefill_chunk_tokens=64),
        "limits": HttpLimits(max_body_bytes=1_000_000, max_questions=32),
        # As configs/local.yaml: the test key bootstraps a local account; docs open.
        "auth": AuthOptions(bootstrap_local_key=True, docs="open"),
        "data_dir": str(data_dir),
    }
    return AppConfig(**{**fields, **overrides})


@pytest.fixture(scope="session")
def app_config(tiny_source: str, tmp_path_factory: pytest.TempPathFactory) -> AppConfig:
    return tiny_config(tiny_source, tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session")
def client(app_config: AppConfig) -> Iterator:
    from fastapi.testclient import TestClient

    from serve_app.testing import local_router_app

    os.environ["SERVE_APP_API_KEY"] = TEST_KEY
    with TestClient(local_router_app(app_config), raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.fixture(scope="session")
def graph(tiny_source: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """The real Serve graph from configs/local.yaml (tiny model), shared by the e2e tests."""
    from tests.graph import start_graph

    yield from start_graph(tiny_source, tmp_path_factory.mktemp("graph"))


def engine_config(**overrides) -> EngineConfig:
    """The engine on the model's own numbers (dense fp32 weights everywhere, no speculation),
    the baseline that engine tests compare against, with ``overrides``. fp32 pinned: ``auto``
    reads prompts in bf16 on CPUs that compute it natively (AVX512-BF16, AMX)."""
    fields = {
        "weights": "dense",
        "prompt_weights": "dense",
        "prefill_dtype": "float32",
        "small_prefill_tokens": 0,
        "speculation": NO_SPECULATION,
    }
    return EngineConfig(**{**fields, **overrides})


def speculating(max_batch: int = 16, **draft_tokens: int) -> SpeculationConfig:
    """Speculation for the named roles only (``fim=4``), drafting up to ``max_batch`` rows."""
    return SpeculationConfig(
        **{"edit": 0, "fim": 0, "chat": 0, **draft_tokens}, max_batch=max_batch
    )


def redrawn(lm: LoadedModel) -> LoadedModel:
    """``lm`` with its matrices redrawn (std 0.3, seeded) and no eos.

    The tiny model's own initialisation (std 0.02) repeats one token whatever the prompt,
    which would make "same tokens" checks vacuous; redrawn, its outputs depend on the prompt.
    No eos: random text would end at random points (eos has its own test in test_engine).
    """
    import torch

    from serve_app.models.tiny import TOOL_MARKERS

    # The tool-call markers' rows are drawn after everything else, so every other value is
    # the one these tests were written against before the vocabulary had them.
    vocab = lm.model.config.vocab_size
    markers = sum(1 for t in TOOL_MARKERS if t in (lm.tokenizer.get_added_vocab() or {}))
    generator = torch.Generator().manual_seed(0)
    late = []
    with torch.no_grad():
        for param in lm.model.parameters():
            if param.dim() < 2:
                continue
            rows = param.shape[0] - markers if param.shape[0] == vocab else param.shape[0]
            param[:rows].copy_(torch.randn((rows, *param.shape[1:]), generator=generator) * 0.3)
            if rows < param.shape[0]:
                late.append(param)
        for param in late:
            rest = param[param.shape[0] - markers :]
            rest.copy_(torch.randn(rest.shape, generator=generator) * 0.3)
    return dataclasses.replace(lm, eos_token_ids=[])


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """The tiny model ``redrawn``, for the engine's and the runner's tests (one per module)."""
    from serve_app.models.loader import load_model

    return redrawn(load_model("tiny:" + str(tmp_path_factory.mktemp("tiny"))))


EMBEDDED_ID = "qwen2.5-coder-0.5b"


@pytest.fixture(scope="session")
def embedded_config(tmp_path_factory: pytest.TempPathFactory) -> AppConfig:
    """The config of ``embedded_client``."""
    return AppConfig(
        # configs/local.yaml's next-edit prompt for the embedded model.
        models=[
            ModelConfig(
                id=EMBEDDED_ID, source="embedded:qwen2.5-coder-0.5b", edit_prompt="chat_split"
            )
        ],
        roles=Roles(fim=EMBEDDED_ID, edit=EMBEDDED_ID, decisions=EMBEDDED_ID),
        # What configs/local.yaml runs on an AVX2 CPU (the runner, int8 decode and prompts,
        # position 0 on fp32, speculation on edit and FIM), pinned so every CPU runs the same
        # numbers (auto would take int4 and bf16 prompts on AVX512-BF16), with a fixed seed: clients
        # that send no temperature sample at the edit default (0.2), and a test should not
        # pass or fail by the draw.
        engine=EngineConfig(
            torch_threads=2,
            max_batch_size=8,
            prefill_chunk_tokens=128,
            runner="auto",
            weights="int8",
            prompt_weights="decode",
            prefill_dtype="float32",
            seed=0,
        ),
        auth=AuthOptions(bootstrap_local_key=True, docs="open"),
        data_dir=str(tmp_path_factory.mktemp("embedded-data")),
    )


@pytest.fixture(scope="session")
def embedded_client(embedded_config: AppConfig) -> Iterator:
    """The router app on the embedded default model (in-process, real handles)."""
    from fastapi.testclient import TestClient

    from serve_app.testing import local_router_app

    os.environ["SERVE_APP_API_KEY"] = TEST_KEY
    app = local_router_app(embedded_config)
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


@pytest.fixture(scope="session")
def embedded_other_auth(embedded_config: AppConfig, embedded_client) -> dict[str, str]:
    """The headers of a second account on ``embedded_client``'s app."""
    from tests.fixtures.auth import new_account

    key, _ = new_account(embedded_config.auth_db, "other-account")
    return {"Authorization": f"Bearer {key}"}


class ThrowawayPostgres:
    """A PostgreSQL server of the machine's own ``initdb``/``pg_ctl`` (as user ``postgres``
    when run as root) in a folder of its own, listening on a Unix socket only; ``stop`` and
    ``start`` take it away and bring it back (an outage), ``remove`` ends it."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="serve-app-pg-")
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.folder, "postgres")
        self.data = os.path.join(self.folder, "data")
        self.url = f"postgresql://postgres@/postgres?host={self.folder}"
        run = dict(check=True, capture_output=True, timeout=60)
        subprocess.run([*self.as_user, "initdb", "-D", self.data, "-A", "trust", "-U", "postgres"],
                       **run)  # fmt: skip
        self.start()

    def start(self) -> None:
        options = f"-k {self.folder} -c listen_addresses='' -c fsync=off"
        # -l: the server must not inherit our pipes, or run() would wait for it to exit.
        log = os.path.join(self.folder, "log")
        start = [*self.as_user, "pg_ctl", "-D", self.data, "-o", options, "-l", log, "-w", "start"]
        subprocess.run(start, check=True, stdout=subprocess.DEVNULL, timeout=60)

    def stop(self) -> None:
        stop = [*self.as_user, "pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop"]
        subprocess.run(stop, capture_output=True, timeout=60)

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    @classmethod
    def or_skip(cls) -> ThrowawayPostgres:
        if importlib.util.find_spec("psycopg") is None:
            pytest.skip("psycopg is not installed")
        if not (shutil.which("initdb") and shutil.which("pg_ctl")):
            pytest.skip("no PostgreSQL server binaries (initdb, pg_ctl)")
        try:
            return cls()
        except (subprocess.SubprocessError, OSError) as error:
            pytest.skip(f"cannot start a PostgreSQL server: {error}")


@pytest.fixture(scope="session")
def postgres_server():
    """A base ``postgresql://`` URL, or skip: a ``ThrowawayPostgres``, or the server of
    ``SERVE_APP_TEST_POSTGRES_DSN``."""
    if importlib.util.find_spec("psycopg") is None:
        pytest.skip("psycopg is not installed")
    if os.environ.get("SERVE_APP_TEST_POSTGRES_DSN"):
        yield os.environ["SERVE_APP_TEST_POSTGRES_DSN"]
        return
    server = ThrowawayPostgres.or_skip()
    yield server.url
    server.remove()


def new_postgres_schema(server: str) -> str:
    """A PostgreSQL URL on ``server`` whose search_path is a new, empty schema (much cheaper
    than a database per test)."""
    import psycopg

    schema = f"auth_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as connection:
        connection.execute(f"CREATE SCHEMA {schema}")
    parts = urlsplit(server)
    query = "&".join(filter(None, [parts.query, f"options=-csearch_path%3D{schema}"]))
    return parts._replace(query=query).geturl()
