"""``edit_adapter: builtin:<name>``: the repository's adapters/ folder, not package data.

The shipped adapters live at the repository's root, beside serve_app/, so the runtime package
holds no weights; ``builtin:<name>`` reads them from the clone the project is installed from
(``pip install -e .``). Where the folder is not there (another kind of install) the engine
refuses to start with an error naming the folder it looked for.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from serve_app.config import ModelConfig
from serve_app.engine.startup import EDIT_ADAPTER, role_adapters
from serve_app.models import loader
from serve_app.models.loader import TRAINING_RECORD, AdapterError, adapter_path
from serve_app.runner.lora import CONFIG_FILE, WEIGHTS_FILE

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = "next-edit-0.5b"


def test_builtin_names_a_folder_of_the_repository_adapters() -> None:
    folder = adapter_path(f"builtin:{SHIPPED}")
    assert folder == ROOT / "adapters" / SHIPPED
    assert {CONFIG_FILE, WEIGHTS_FILE, TRAINING_RECORD} <= {path.name for path in folder.iterdir()}


def test_any_other_source_is_a_path() -> None:
    assert adapter_path("data/adapters/x") == Path("data/adapters/x")
    assert adapter_path("~/x") == Path.home() / "x"


def test_the_shipped_adapter_starts_with_the_layout_it_learned() -> None:
    """Through the engine's start path (``role_adapters``): the folder, with its record's
    layout checked against the model's ``edit_prompt``."""
    style = json.loads((ROOT / "adapters" / SHIPPED / TRAINING_RECORD).read_text())["style"]
    model = ModelConfig(
        id="m", source="tiny:x", edit_adapter=f"builtin:{SHIPPED}", edit_prompt=style
    )
    assert role_adapters(model, "edit") == {EDIT_ADAPTER: ROOT / "adapters" / SHIPPED}


def test_a_missing_builtin_adapter_fails_at_start_naming_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As in a non-editable install, where no adapters/ sits beside the package."""
    monkeypatch.setattr(loader, "BUILTIN_ADAPTERS", tmp_path / "adapters")
    model = ModelConfig(
        id="m", source="tiny:x", edit_adapter=f"builtin:{SHIPPED}", edit_prompt="chat_span"
    )
    with pytest.raises(AdapterError, match=r"pip install -e \.") as raised:
        role_adapters(model, "edit")
    assert f"builtin:{SHIPPED}" in str(raised.value)
    assert str(tmp_path / "adapters" / SHIPPED) in str(raised.value)


def test_an_unknown_builtin_adapter_lists_the_shipped_ones() -> None:
    with pytest.raises(AdapterError, match=SHIPPED) as raised:
        adapter_path("builtin:no-such-adapter")
    assert str(ROOT / "adapters" / "no-such-adapter") in str(raised.value)


@pytest.mark.parametrize("name", ["", "..", "../serve_app", "a/b"])
def test_a_builtin_name_is_one_folder_of_adapters(name: str) -> None:
    with pytest.raises(AdapterError, match="named by its folder"):
        adapter_path(f"builtin:{name}")


def test_the_adapters_are_no_package_data() -> None:
    """No weights in the runtime package: not in its tree, not in what setuptools ships."""
    assert not (ROOT / "serve_app" / "adapters").exists()
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    shipped = [pattern for patterns in setuptools["package-data"].values() for pattern in patterns]
    assert not [pattern for pattern in shipped if "adapters" in pattern or "safetensors" in pattern]
    assert not [name for name in setuptools["packages"]["find"]["include"] if "adapters" in name]
