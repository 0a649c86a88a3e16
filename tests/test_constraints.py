"""JSON-constrained decoding, the automaton: the prefix validator against ``json.loads`` /
``jsonschema`` as oracles, and the shortest-completion distance the token budget relies on.
The logits processor driving the tiny model is in tests/test_constraints_decoding.py.
"""

from __future__ import annotations

import json
import random
from typing import Any

import jsonschema
import pytest
from hypothesis import given
from hypothesis import strategies as st

from serve_app.engine.constraints import (
    JsonValidator,
    SchemaError,
    compile_schema,
    validate_output,
)
from serve_app.grammar.automaton import MAX_WS_RUN
from serve_app.grammar.nodes import ANY_OBJECT, Node
from tests.fixtures.constraints import FAST, SCHEMA, run_validator


def accepts(data: bytes | str, node: Node = ANY_OBJECT) -> bool:
    return not run_validator(data, node).dead


def complete(data: bytes | str, node: Node = ANY_OBJECT) -> bool:
    return run_validator(data, node).complete


def parses_as_object(data: bytes) -> bool:
    """The oracle: what ``json.loads`` accepts as a JSON object (no NaN/Infinity)."""

    def no_constants(name: str) -> None:
        raise ValueError(name)

    try:
        value = json.loads(data.decode("utf-8"), parse_constant=no_constants)
    except (ValueError, RecursionError):
        return False
    return isinstance(value, dict)


# -- the validator on plain JSON --------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "{}",
        ' \n{ "a" : 1 }\n ',
        '{"a": [1, -0, 2.5e-3, 1E+9, "x\\u00e9\\n", true, false, null, {}, []]}',
        '{"nested": {"deep": [[[]], {"k": {"z": -12.0}}]}}',
        '{"é": "中文 ünïcode 🎉"}',
    ],
)
def test_valid_documents_are_complete(text: str) -> None:
    assert complete(text) and parses_as_object(text.encode())


@pytest.mark.parametrize(
    "text",
    [
        "[1]",  # json_object: the top level must be an object
        '"x"',
        "1",
        '{"a":01}',
        '{"a":1,}',
        '{,"a":1}',
        '{"a" 1}',
        '{"a":-}',
        '{"a":1.}',
        '{"a":.5}',
        '{"a":tru}',
        '{"a":True}',
        '{"a":NaN}',
        "{'a':1}",
        '{"a":"\\x"}',
        '{"a":"\\u12g4"}',
        '{"a":"tab\there"}',
        '{"a":1}}',
        '{"a":1} x',
        '{"a":1}{}',
        b'{"a":"\xc0\x80"}',  # overlong
        b'{"a":"\xed\xa0\x80"}',  # UTF-8-encoded surrogate
        b'{"a":"\xc3("}',  # lead byte without continuation
        b'{"a":"\xf5\x80\x80\x80"}',  # beyond U+10FFFF
    ],
)
def test_invalid_documents_are_rejected(text: str | bytes) -> None:
    data = text.encode() if isinstance(text, str) else text
    assert not complete(data)
    assert not parses_as_object(data)


def test_partial_utf8_is_a_valid_prefix_but_not_complete() -> None:
    v = run_validator(b'{"a":"\xe4\xb8')
    assert not v.dead and not v.complete and v.distance() == 3  # one byte, quote, brace
    assert v.feed(b'\xad"}') and v.complete


def test_strings_take_exactly_the_well_formed_utf8() -> None:
    """Every pair of bytes, and every three- and four-byte lead with the bytes after it at the
    edges of their ranges, against Python's decoder: no overlong form, surrogate or code point
    past U+10FFFF gets through."""

    def well_formed(data: bytes) -> bool:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return True

    edges = (0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0)
    opened = run_validator(b'{"a":"')
    pairs = [bytes([lead, second]) for lead in range(0x80, 0x100) for second in range(0x80, 0x100)]
    longer = [
        bytes([lead, second, *tail])
        for lead in range(0xE0, 0xF5)
        for second in edges
        for tail in [(third,) for third in edges] + [(0x80, fourth) for fourth in edges]
    ]
    for data in pairs + longer:
        string = opened.copy()
        assert (string.feed(data + b'"}') and string.complete) == well_formed(data), data


def test_whitespace_runs_are_capped_until_the_value_ends() -> None:
    assert accepts("{" + " " * MAX_WS_RUN)
    assert not accepts("{" + " " * (MAX_WS_RUN + 1))
    assert accepts('{"a": " ' + " " * 200 + '"')  # inside strings, spaces are text
    assert complete("{}" + "\n" * 500)  # after the value, only whitespace can come anyway


def test_copy_is_independent() -> None:
    v = run_validator('{"a": [1, {"b": "x')
    trial = v.copy()
    assert trial.feed('"}]}') and trial.complete
    assert not v.complete and v.feed('y"}]}') and v.complete


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)
json_objects = st.dictionaries(st.text(max_size=5), json_values, max_size=5)
dump_styles = st.sampled_from(
    [{}, {"indent": 2}, {"separators": (",", ":")}, {"ensure_ascii": False}, {"indent": "\t"}]
)


@FAST
@given(value=json_objects, style=dump_styles)
def test_every_prefix_of_a_document_is_accepted_and_complete_only_at_the_end(
    value: dict, style: dict
) -> None:
    data = json.dumps(value, **style).encode()
    v = JsonValidator()
    for i, b in enumerate(data):
        assert v.feed(bytes((b,))), data[: i + 1]
        assert v.complete == (i == len(data) - 1), data[: i + 1]
        assert (v.distance() == 0) == v.complete


MUTATION_BYTES = b'{}[]",:0123456789-+.eEtrufalsn \\/\n\x00\x7f\xc3\xa9\xff'


@FAST
@given(
    value=json_objects,
    style=dump_styles,
    edits=st.lists(
        st.tuples(
            st.sampled_from(["insert", "delete", "replace"]),
            st.integers(0, 10**6),
            st.sampled_from(list(MUTATION_BYTES)),
        ),
        min_size=1,
        max_size=3,
    ),
)
def test_validator_agrees_with_json_loads_on_mutated_documents(
    value: dict, style: dict, edits: list[tuple[str, int, int]]
) -> None:
    data = bytearray(json.dumps(value, **style).encode())
    for op, pos, b in edits:
        pos %= len(data) + (op == "insert")
        if op == "insert":
            data.insert(pos, b)
        elif op == "delete" and len(data) > 1:
            del data[pos]
        elif op == "replace":
            data[pos] = b
    assert complete(bytes(data)) == parses_as_object(bytes(data)), bytes(data)


@FAST
@given(st.binary(max_size=12).map(lambda tail: b'{"k": ' + tail))
def test_validator_agrees_with_json_loads_on_random_bytes(data: bytes) -> None:
    assert complete(data) == parses_as_object(data)


# -- schemas -----------------------------------------------------------------------------------

schema_strings = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=6)
schema_instances = st.fixed_dictionaries(
    {
        "name": schema_strings,
        "age": st.integers(-1000, 10**12),
        "address": st.fixed_dictionaries(
            {"city": schema_strings}, optional={"zip": schema_strings}
        ),
    },
    optional={
        "score": st.floats(allow_nan=False, allow_infinity=False) | st.integers(),
        "active": st.booleans(),
        "nickname": st.none() | schema_strings,
        "color": st.sampled_from(["red", "green", "blue"]),
        "level": st.sampled_from([1, 12, 2.5, None, "x"]),
        "tags": st.lists(schema_strings, max_size=3),
    },
).flatmap(lambda d: st.permutations(list(d.items())).map(dict))


@FAST
@given(instance=schema_instances, style=dump_styles)
def test_schema_mode_accepts_every_prefix_of_valid_instances(instance: dict, style: dict) -> None:
    node = compile_schema(SCHEMA).root
    data = json.dumps(instance, **style).encode()
    v = JsonValidator(node)
    for i, b in enumerate(data):
        assert v.feed(bytes((b,))), data[: i + 1]
        assert v.complete == (i == len(data) - 1)


@FAST
@given(instance=schema_instances, style=dump_styles, cut=st.integers(0, 10**6), seed=st.integers())
def test_distance_is_a_shortest_completion_that_validates(
    instance: dict, style: dict, cut: int, seed: int
) -> None:
    """From any prefix, some byte always lowers ``distance`` by one; following such bytes ends in
    exactly ``distance`` bytes with a schema-valid document. The token budget rests on this."""
    data = json.dumps(instance, **style).encode()
    prefix = data[: cut % (len(data) + 1)]
    v = run_validator(prefix, compile_schema(SCHEMA).root)
    text = prefix + close_by_distance(v, random.Random(seed))
    jsonschema.validate(json.loads(text), SCHEMA)


def close_by_distance(v: JsonValidator, rng: random.Random) -> bytes:
    """Append bytes that each lower the distance by exactly one (random among them)."""
    out = bytearray()
    start = v.distance()
    while not v.complete:
        d = v.distance()
        options = []
        for b in range(256):
            trial = v.copy()
            if trial.feed(bytes((b,))) and trial.distance() == d - 1:
                options.append((b, trial))
        assert options, f"stuck at distance {d}"
        b, v = rng.choice(options)
        out.append(b)
    assert len(out) == start
    return bytes(out)


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "a", "age": 1, "address": {"city": "x"}, "extra": 1}',  # unknown key
        '{"name": "a", "name": "b"}',  # duplicate key
        '{"name": 1}',  # wrong type
        '{"age": 1.5}',  # integer
        '{"name": "a", "age": 1}',  # "}" before the required "address"
        '{"address": {}}',  # nested required
        '{"color": "purple"}',
        '{"color": "re"}',
        '{"level": 3}',
        '{"level": 123}',
        '{"tags": ["a", "b", "c", "d"]}',  # maxItems
        '{"nickname": 0}',
        '{"active": null}',
    ],
)
def test_schema_mode_rejects_outside_the_schema(text: str) -> None:
    assert not complete(text, compile_schema(SCHEMA).root)


def test_schema_keys_are_only_the_properties() -> None:
    node = compile_schema(SCHEMA).root
    assert accepts('{"na', node) and accepts('{"address": {"ci', node)
    assert not accepts('{"nb', node) and not accepts('{"address": {"na', node)
    assert accepts('{"level": 1', node) and accepts('{"level": 12', node)
    assert complete('{"level":12,"name":"","age":0,"address":{"city":""}}', node)


def test_unsupported_keywords_fall_back_and_are_noted() -> None:
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 3},
            "x": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            "y": {"type": "array", "prefixItems": [{"type": "string"}]},
        },
        "required": ["n"],
    }
    grammar = compile_schema(schema)
    assert not grammar.fully_enforced and len(grammar.notes) == 3
    assert complete('{"n": 1, "x": {"any": [1]}, "y": [1, "a"]}', grammar.root)
    assert validate_output('{"n": 1}', schema) is not None  # the post-check catches minimum
    assert validate_output('{"n": 5, "x": "s"}', schema) is None


def test_refs_anyof_and_const() -> None:
    schema = {
        "$defs": {"pet": {"type": "object", "properties": {"kind": {"const": "cat"}}}},
        "type": "object",
        "properties": {
            "pet": {"$ref": "#/$defs/pet"},
            "maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        },
    }
    grammar = compile_schema(schema)
    assert grammar.fully_enforced
    assert complete('{"pet": {"kind": "cat"}, "maybe": null}', grammar.root)
    assert complete('{"maybe": 3}', grammar.root)
    assert not accepts('{"pet": {"kind": "dog', grammar.root)
    assert not accepts('{"maybe": "', grammar.root)
    recursive = {"type": "object", "properties": {"child": {"$ref": "#"}}}
    assert not compile_schema(recursive).fully_enforced


@pytest.mark.parametrize(
    "schema",
    [
        {"enum": []},
        {"type": "integer", "enum": ["a"]},
        {"type": "array", "minItems": 3, "maxItems": 1},
        {"type": "frobnicate"},
        {"$ref": "#/nowhere"},
        False,
    ],
)
def test_schemas_that_admit_nothing_are_errors(schema: Any) -> None:
    with pytest.raises(SchemaError):
        compile_schema(schema)


def test_required_keys_without_properties_get_any_value() -> None:
    node = compile_schema({"type": "object", "required": ["id"]}).root
    assert complete('{"id": [1, {"x": null}]}', node) and not complete("{}", node)


def test_empty_closed_object() -> None:
    node = compile_schema({"type": "object", "additionalProperties": False}).root
    assert complete("{}", node) and not accepts('{"', node)
