"""docs/configuration.md documents every config field once, with the default the code has.

Each ``## `block` `` section's table is read back: its first column must be exactly the
fields of that block's pydantic model, and a default written as one code span must load (as
YAML, the config's own format) to the field's default.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from serve_app.config import AppConfig, AuthOptions, HttpLimits, ModelConfig, Roles
from serve_app.engine_config import EngineConfig, SpeculationConfig

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"
SECTIONS: dict[str, type[BaseModel]] = {
    "Top level (`args:`)": AppConfig,
    "`models[]`": ModelConfig,
    "`roles`": Roles,
    "`engine`": EngineConfig,
    "`engine.speculation`": SpeculationConfig,
    "`auth`": AuthOptions,
    "`limits`": HttpLimits,
}
# Defaults the code computes (from the environment, or a list of blocks) and the doc words.
WORDED = {(AppConfig, "models"), (AppConfig, "data_dir")}
CODE_SPAN = re.compile(r"^`([^`]*)`$")


def section_rows(text: str, heading: str) -> list[list[str]]:
    """The cells of the first table under ``## heading``."""
    body = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in body.splitlines() if line.startswith("| ")]
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows[2:]]


def code_default(model: type[BaseModel], name: str):
    return model.model_fields[name].get_default(call_default_factory=True)


@pytest.mark.parametrize("heading", SECTIONS)
def test_every_field_is_documented_once(heading: str):
    documented = [row[0] for row in section_rows(DOC.read_text(), heading)]
    expected = [f"`{name}`" for name in SECTIONS[heading].model_fields]
    assert sorted(documented) == sorted(expected)


@pytest.mark.parametrize("heading", SECTIONS)
def test_documented_defaults_are_the_code_defaults(heading: str):
    model = SECTIONS[heading]
    for name, default, _ in section_rows(DOC.read_text(), heading):
        field = name.strip("`")
        if (model, field) in WORDED:
            continue
        value = code_default(model, field)
        if default == "(block)":  # its own section documents its fields and their defaults
            assert isinstance(value, BaseModel), field
            continue
        span = CODE_SPAN.match(default)
        assert span is not None, f"{field}: default {default!r} is not one code span"
        if isinstance(value, BaseModel):
            value = value.model_dump(mode="json")
        assert yaml.safe_load(span.group(1)) == value, field
