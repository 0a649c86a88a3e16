"""LoRA adapters applied per request in the runner (``runner.lora``), on the tiny model.

The reference is peft's own model: the runner's logits with an adapter equal peft's with that
adapter, row by row in a batch that mixes adapted and plain rows. Through the engine, an
adapter of zero weights changes nothing, one of non-zero weights changes the answers of the
requests that name it and of no other. An adapter that does not fit the model fails at start
with an error that names its folder.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from serve_app.engine.engine import LLMEngine
from serve_app.models.loader import LoadedModel, load_model
from serve_app.runner.builder import build_runner
from serve_app.runner.lora import MODULES, AdapterError, load_adapter
from tests.conftest import engine_config, speculating
from tests.runner_support import PROMPTS, encode, generate_all, greedy

pytest.importorskip("peft")


def adapted(loaded: LoadedModel, folder: Path, *, zero: bool, layers: list[int] | None = None):
    """A peft LoRA of ``loaded``'s model saved in ``folder``, and the peft model itself:
    B drawn at random unless ``zero`` (peft's own start, where the adapter changes nothing)."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules=list(MODULES), layers_to_transform=layers)
    model = get_peft_model(copy.deepcopy(loaded.model), config)
    if not zero:
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    model.save_pretrained(folder)
    return folder, model.eval()


@pytest.fixture(scope="module")
def lora(loaded: LoadedModel, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """A non-zero adapter on the last of the tiny model's two blocks (as the shipped one
    adapts only the 0.5B's last blocks)."""
    return adapted(loaded, tmp_path_factory.mktemp("lora"), zero=False, layers=[1])


# The engine on dense weights, and as configs/local.yaml runs the edit role: int8 decode
# weights, prompts on them (position 0 on dense: ``Qwen2Runner.first_token``), drafts checked.
DENSE = {}
AS_SERVED = {"weights": "int8", "prompt_weights": "decode", "speculation": speculating(edit=4)}


def run_with(
    loaded: LoadedModel, requests: list, adapters: dict[str, Path], settings: dict = DENSE
) -> list[str]:
    config = engine_config(max_batch_size=4, prefill_chunk_tokens=8, **settings)
    texts, _ = generate_all(loaded, config, requests, adapters=adapters or None)
    return texts


def test_runner_logits_equal_peft_per_row(loaded: LoadedModel, lora) -> None:
    folder, reference = lora
    runner = build_runner(
        loaded.model,
        weights="dense",
        adapters={"a": load_adapter("a", folder, loaded.model, torch.device("cpu"))},
    )
    prompts = [encode(loaded, text) for text in PROMPTS[:3]]
    names = ["a", "", "a"]
    with torch.inference_mode():
        cache = runner.new_cache(3, 16, 512)
        for slot, (prompt, name) in enumerate(zip(prompts, names, strict=True)):
            runner.forward(cache, slot, [prompt[:-1]], [0], decode=False, adapters=[name])
        # One decode step of the three rows together: the adapter on rows 0 and 2 only.
        logits = runner.forward(
            cache, 0, [p[-1:] for p in prompts], [len(p) - 1 for p in prompts], decode=True,
            adapters=names,
        )  # fmt: skip
        for row, (prompt, name) in enumerate(zip(prompts, names, strict=True)):
            if name:
                expected = reference(torch.tensor([prompt])).logits[0, -1]
            else:
                with reference.disable_adapter():
                    expected = reference(torch.tensor([prompt])).logits[0, -1]
            torch.testing.assert_close(logits[row], expected.float(), rtol=1e-4, atol=1e-4)
        plain = loaded.model(torch.tensor([prompts[0]])).logits[0, -1]
        assert (logits[0] - plain).abs().max() > 1e-2  # the adapter did change row 0


def test_zero_adapter_changes_nothing(loaded: LoadedModel, tmp_path: Path) -> None:
    folder, _ = adapted(loaded, tmp_path / "zero", zero=True)
    prompts = [encode(loaded, text) for text in PROMPTS[:3]]
    plain = [greedy(f"p{i}", p, 12) for i, p in enumerate(prompts)]
    named = [greedy(f"z{i}", p, 12, adapter="zero") for i, p in enumerate(prompts)]
    assert run_with(loaded, named, {"zero": folder}) == run_with(loaded, plain, {})


@pytest.mark.parametrize("settings", [DENSE, AS_SERVED], ids=["dense", "as-served"])
def test_adapter_changes_only_the_requests_that_name_it(
    loaded: LoadedModel, lora, settings: dict
) -> None:
    """The same prompts with and without the adapter, in one engine, at once: the plain ones
    answer as on an engine with no adapter (nothing leaks through the shared batch or the
    prefix cache), the adapted ones otherwise."""
    folder, _ = lora
    prompts = [encode(loaded, text) for text in PROMPTS[:3]]
    plain = [greedy(f"p{i}", p, 12, route="edit") for i, p in enumerate(prompts)]
    alone = run_with(loaded, plain, {}, settings)
    mixed = run_with(
        loaded,
        [greedy(f"a{i}", p, 12, route="edit", adapter="a") for i, p in enumerate(prompts)] + plain,
        {"a": folder},
        settings,
    )
    assert mixed[3:] == alone
    assert mixed[:3] != alone


def test_adapter_matches_peft_greedy(loaded: LoadedModel, lora) -> None:
    """Greedy tokens through the engine (prompt chunks, prefix cache, decode steps) equal
    greedy decoding with peft's model, the whole sequence at every step."""
    folder, reference = lora
    prompt = encode(loaded, PROMPTS[1])
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(10):
            ids.append(int(reference(torch.tensor([ids])).logits[0, -1].argmax()))
    expected = loaded.tokenizer.decode(ids[len(prompt) :], skip_special_tokens=True)
    assert run_with(loaded, [greedy("a", prompt, 10, adapter="a")], {"a": folder}) == [expected]


def test_unknown_adapter_is_refused(loaded: LoadedModel) -> None:
    from serve_app.errors import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="no adapter 'b'"):
        run_with(loaded, [greedy("b", encode(loaded, "x"), 2, adapter="b")], {})


def broken(lora_folder: Path, folder: Path, damage: str) -> Path:
    """A copy of the adapter in ``folder`` with ``damage`` done to it."""
    from safetensors.torch import load_file, save_file

    folder.mkdir()
    config = json.loads((lora_folder / "adapter_config.json").read_text())
    weights = load_file(str(lora_folder / "adapter_model.safetensors"))
    if damage == "config":
        (folder / "adapter_config.json").write_text("{not json")
        save_file(weights, str(folder / "adapter_model.safetensors"))
        return folder
    if damage == "weights":
        (folder / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    elif damage == "dora":
        config["use_dora"] = True
    elif damage == "layer":
        weights = {key.replace("layers.1.", "layers.7."): w for key, w in weights.items()}
    if damage != "weights":
        save_file(weights, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("config", "cannot read adapter_config.json"),
        ("weights", "cannot read adapter_model.safetensors"),
        ("dora", "unsupported LoRA options: use_dora"),
        ("layer", "adapts no layer of the base model"),
        ("missing", "cannot read adapter_config.json"),
    ],
)
def test_a_malformed_adapter_fails_at_start_naming_its_folder(
    loaded: LoadedModel, lora, tmp_path: Path, damage: str, message: str
) -> None:
    folder = (
        tmp_path / "nowhere" if damage == "missing" else broken(lora[0], tmp_path / "b", damage)
    )
    with pytest.raises(AdapterError, match=message) as raised:
        LLMEngine(loaded, engine_config(), adapters={"a": folder})
    assert str(folder) in str(raised.value)


def test_an_adapter_of_another_model_fails_at_start(
    loaded: LoadedModel, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from serve_app.models.tiny import build_tiny_model

    other = load_model("tiny:" + str(build_tiny_model(
        tmp_path_factory.mktemp("wide"), shape={"hidden_size": 96, "intermediate_size": 192}
    )))  # fmt: skip
    folder, _ = adapted(other, tmp_path_factory.mktemp("wide-lora"), zero=False)
    with pytest.raises(AdapterError, match="an adapter of another model") as raised:
        LLMEngine(loaded, engine_config(), adapters={"a": folder})
    assert str(folder) in str(raised.value)


def test_adapters_need_the_runner(loaded: LoadedModel, lora) -> None:
    with pytest.raises(ValueError, match="need the engine's runner"):
        LLMEngine(loaded, engine_config(runner="hf"), adapters={"a": lora[0]})


def test_the_service_answers_next_edit_with_its_adapter_and_chat_without(
    app_config, client, lora, tmp_path: Path
) -> None:
    """A model's ``edit_adapter`` through the whole router app: next-edit answers with it,
    and chat (same engine, same batch) answers exactly as on the app without one."""
    from fastapi.testclient import TestClient

    from serve_app.testing import local_router_app
    from tests.conftest import AUTH, TINY_ID
    from tests.fixtures.edit import EXAMPLE_EDIT_CONTENT

    model = app_config.model(TINY_ID).model_copy(update={"edit_adapter": str(lora[0])})
    config = app_config.model_copy(update={"models": [model], "data_dir": str(tmp_path)})
    chat = {"model": TINY_ID, "messages": [{"role": "user", "content": "Hello"}]}
    chat |= {"max_tokens": 8, "temperature": 0}
    edit = {"model": TINY_ID, "messages": [{"role": "user", "content": EXAMPLE_EDIT_CONTENT}]}
    with TestClient(local_router_app(config), raise_server_exceptions=False) as adapted:
        answered = adapted.post("/v1/edit/completions", json=edit, headers=AUTH)
        assert answered.status_code == 200, answered.text
        assert answered.json()["choices"][0]["message"]["content"].startswith("```")
        with_adapter = adapted.post("/v1/chat/completions", json=chat, headers=AUTH)
    without = client.post("/v1/chat/completions", json=chat, headers=AUTH)
    assert with_adapter.status_code == without.status_code == 200, with_adapter.text
    content = [r.json()["choices"][0]["message"]["content"] for r in (with_adapter, without)]
    assert content[0] == content[1]


def test_the_service_refuses_to_start_on_a_broken_adapter(app_config, tmp_path: Path) -> None:
    from serve_app.testing import local_router_app
    from tests.conftest import TINY_ID

    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8}')
    model = app_config.model(TINY_ID).model_copy(update={"edit_adapter": str(folder)})
    config = app_config.model_copy(update={"models": [model], "data_dir": str(tmp_path)})
    with pytest.raises(AdapterError, match="cannot read adapter_model.safetensors") as raised:
        local_router_app(config)
    assert str(folder) in str(raised.value)
