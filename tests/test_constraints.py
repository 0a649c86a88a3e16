"""Grammars for constrained decoding: a client's schema checked (400s that name the field and
the place in the schema), and what the llguidance masks let through, byte by byte with the
tiny model's vocabulary, against ``json.loads`` and ``jsonschema`` as oracles. The logits
processors driving the tiny model are in tests/test_constraints_decoding.py.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serve_app.engine.constraints import SchemaError, compile_schema, validate_output
from serve_app.grammar.schema import ANY_OBJECT_SCHEMA, MAX_ENUM_VALUES
from tests.fixtures.constraints import FAST, SCHEMA, TinyVocabulary
from tests.fixtures.schemas import ANYTHING

PARAM = "response_format.json_schema.schema"


@pytest.fixture(scope="module")
def vocab(tiny_source: str) -> TinyVocabulary:
    return TinyVocabulary.load(tiny_source.removeprefix("tiny:"))


def grammar(schema: Any) -> Any:
    return compile_schema(schema, PARAM)


# -- the checks: 400s naming where -------------------------------------------------------------


@pytest.mark.parametrize(
    "schema, param, reason",
    [
        ({"type": "object", "properties": 7}, f"{PARAM}.properties", "not of type 'object'"),
        ({"type": "object", "required": 5}, f"{PARAM}.required", "not of type 'array'"),
        ({"enum": 3}, f"{PARAM}.enum", "not of type 'array'"),
        ({"type": "string", "maxLength": -5}, f"{PARAM}.maxLength", "minimum of 0"),
        ({"type": "frobnicate"}, f"{PARAM}.type", "not valid"),
        ({"$ref": "#"}, PARAM, "refers back to itself"),
        ({"$ref": "#/$defs/missing"}, PARAM, "missing"),
        ({"$ref": "http://example.com/s.json"}, f"{PARAM}.$ref", "not a local reference"),
        (
            {"properties": {"a": {"type": "string", "pattern": r"^(a+)\1$"}}},
            f"{PARAM}.properties.a.pattern",
            "backreferences",
        ),
        (
            {"properties": {"a": {"type": "string", "pattern": "(?=a)a"}}},
            f"{PARAM}.properties.a.pattern",
            "look-around",
        ),
        ({"properties": {"a": {"not": {"type": "string"}}}}, PARAM, "not"),
        ({"type": "array", "uniqueItems": True}, PARAM, "uniqueItems"),
        ({"type": "string", "format": "no-such-format"}, PARAM, "no-such-format"),
        ({"enum": list(range(MAX_ENUM_VALUES + 1))}, f"{PARAM}.enum", "values"),
        ({"anyOf": [{"const": i} for i in range(100)]}, f"{PARAM}.anyOf", "alternatives"),
        ({"type": "object", "properties": {f"p{i}": {} for i in range(300)}}, None, "properties"),
        ([], PARAM, "a JSON object"),
        ({"$schema": {}}, PARAM, "reference validator"),
        ({"$schema": 5}, PARAM, "reference validator"),
        ({"$id": 5}, PARAM, "reference validator"),
        ({"type": "integer", "minimum": -(10**30)}, PARAM, "integer range"),
    ],
)
def test_a_schema_that_cannot_be_decoded_is_a_400_naming_where(schema, param, reason) -> None:
    with pytest.raises(SchemaError) as refused:
        grammar(schema)
    assert refused.value.status_code == 400
    assert refused.value.param == (param or f"{PARAM}.properties"), refused.value.message
    assert reason in refused.value.message


def test_a_tool_schema_is_named_by_its_tool() -> None:
    with pytest.raises(SchemaError) as refused:
        compile_schema({"type": "object", "properties": 7}, "tools[2].function.parameters")
    assert refused.value.param == "tools[2].function.parameters.properties"


def test_a_client_cannot_loosen_the_layout_through_x_guidance(vocab) -> None:
    loose = {"type": "object", "x-guidance": {"whitespace_flexible": True, "lenient": True}}
    assert vocab.walk(grammar(loose), "{}") == (True, True)
    assert vocab.walk(grammar(loose), "{ }")[0] is False
    with pytest.raises(SchemaError):  # lenient would have ignored it
        grammar({**loose, "uniqueItems": True})


# -- what the masks let through ----------------------------------------------------------------


# The grammar writes control characters (DEL and C1 too) escaped, never raw.
texts = st.text(st.characters(exclude_categories=["Cc", "Cs"]), max_size=8)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(texts, inner, max_size=4),
    max_leaves=12,
)
json_objects = st.dictionaries(texts, json_values, max_size=5)


@FAST
@given(value=json_objects, ensure_ascii=st.booleans())
def test_json_object_mode_takes_every_object_in_the_answer_layout(
    vocab, value: dict, ensure_ascii: bool
) -> None:
    """The layout is ``json.dumps``'s (", " and ": ", no other whitespace)."""
    data = json.dumps(value, ensure_ascii=ensure_ascii)
    assert vocab.walk(grammar(ANY_OBJECT_SCHEMA), data) == (True, True), data


MUTATION_BYTES = b'{}[]",:0123456789-+.eEtrufalsn \\/\n\x00\x7f\xc3\xa9\xff'


@FAST
@given(
    value=json_objects,
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
def test_whatever_the_mask_lets_through_to_the_end_parses(vocab, value, edits) -> None:
    data = bytearray(json.dumps(value).encode())
    for op, pos, b in edits:
        pos %= len(data) + (op == "insert")
        if op == "insert":
            data.insert(pos, b)
        elif op == "delete" and len(data) > 1:
            del data[pos]
        elif op == "replace":
            data[pos] = b
    allowed, done = vocab.walk(grammar(ANY_OBJECT_SCHEMA), bytes(data))
    if allowed and done:
        assert isinstance(json.loads(bytes(data).decode("utf-8")), dict), bytes(data)


@pytest.mark.parametrize(
    "data",
    [b'{"a": "\xc0\x80"}', b'{"a": "\xed\xa0\x80"}', b'{"a": "\xc3("}', b'{"a": 01}', b"[1]"],
    ids=["overlong", "surrogate", "cut-utf8", "leading-zero", "not-an-object"],
)
def test_malformed_bytes_never_pass(vocab, data: bytes) -> None:
    assert vocab.walk(grammar(ANY_OBJECT_SCHEMA), data) != (True, True)


schema_strings = st.text(st.characters(exclude_categories=["Cc", "Cs"]), max_size=6)
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
)


def in_schema_order(instance: dict, schema: dict) -> dict:
    """Keys in the order the schema lists them: the order the grammar writes them in."""
    order = list(schema["properties"])
    ordered = {key: instance[key] for key in order if key in instance}
    if isinstance(ordered.get("address"), dict):
        ordered["address"] = in_schema_order(ordered["address"], schema["properties"]["address"])
    return ordered


@FAST
@given(instance=schema_instances)
def test_every_valid_instance_passes_in_schema_order(vocab, instance: dict) -> None:
    data = json.dumps(in_schema_order(instance, SCHEMA))
    assert vocab.walk(grammar(SCHEMA), data) == (True, True), data


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "a", "age": 1, "address": {"city": "x"}, "extra": 1}',  # unknown key
        '{"name": 1}',  # wrong type
        '{"name": "a", "age": 1.5}',  # integer
        '{"name": "a", "age": 1}',  # "}" before the required "address"
        '{"name": "a", "age": 1, "address": {}}',  # nested required
        '{"name": "a", "age": 1, "address": {"city": ""}, "color": "purple"}',
        '{"name": "a", "age": 1, "address": {"city": ""}, "level": 3}',
        '{"name": "a", "age": 1, "address": {"city": ""}, "tags": ["a", "b", "c", "d"]}',
        '{"name": "a", "age": 1, "address": {"city": ""}, "active": null}',
    ],
)
def test_documents_outside_the_schema_never_pass(vocab, text: str) -> None:
    assert vocab.walk(grammar(SCHEMA), text) != (True, True)
    assert validate_output(text, SCHEMA) is not None or "extra" not in text


@pytest.mark.parametrize(
    "schema, good, bad",
    [
        ({"type": "integer", "minimum": 3, "maximum": 20}, ["3", "20"], ["2", "21"]),
        ({"type": "string", "pattern": "^[a-z]{2}-[0-9]$"}, ['"ab-1"'], ['"ab-12"', '"AB-1"']),
        ({"type": "string", "minLength": 2, "maxLength": 3}, ['"ab"'], ['"a"', '"abcd"']),
        (
            {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            ['"s"', "4"],
            ["true", "[]"],
        ),
        (
            {"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "integer"}},
            ['["a", 1, 2]'],
            ["[1]", '["a", "b"]'],
        ),
        (
            {
                "$defs": {"pet": {"type": "object", "properties": {"kind": {"const": "cat"}}}},
                "type": "object",
                "properties": {"pet": {"$ref": "#/$defs/pet"}},
                "required": ["pet"],
            },
            ['{"pet": {"kind": "cat"}}'],
            ['{"pet": {"kind": "dog"}}'],
        ),
        (
            {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {"a": {"type": "integer"}},
                        "required": ["a"],
                        "additionalProperties": False,
                    },
                    {
                        "type": "object",
                        "properties": {"b": {"type": "string"}},
                        "required": ["b"],
                        "additionalProperties": False,
                    },
                ]
            },
            ['{"a": 1}', '{"b": "x"}'],
            ['{"a": "x"}', '{"c": 1}'],
        ),
    ],
    ids=["minimum", "pattern", "length", "oneOf", "prefixItems", "ref-const", "anyOf-objects"],
)
def test_value_keywords_are_enforced_while_decoding(vocab, schema, good, bad) -> None:
    compiled = grammar(schema)
    for text in good:
        assert vocab.walk(compiled, text) == (True, True), text
        jsonschema.validate(json.loads(text), schema)
    for text in bad:
        assert vocab.walk(compiled, text) != (True, True), text


def test_objects_take_only_their_properties_unless_they_need_more(vocab) -> None:
    listed = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert vocab.walk(grammar(listed), '{"a": 1}') == (True, True)
    assert vocab.walk(grammar(listed), '{"b": 1}') != (True, True)
    undeclared = {**listed, "required": ["a", "b"]}  # "b" must come: the object stays open
    assert vocab.walk(grammar(undeclared), '{"a": 1, "b": [true]}') == (True, True)


def test_a_recursive_schema_that_reads_the_answer_is_decoded(vocab) -> None:
    tree = {
        "type": "object",
        "properties": {"children": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["children"],
        "additionalProperties": False,
    }
    text = '{"children": [{"children": []}, {"children": [{"children": []}]}]}'
    assert vocab.walk(grammar(tree), text) == (True, True)


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(schema=ANYTHING)
def test_any_json_compiles_or_is_a_schema_error(schema: Any) -> None:
    """Every keyword given any value, nested: a grammar, or a 400 naming the schema."""
    try:
        grammar(schema)
    except SchemaError as e:
        assert e.status_code == 400 and e.param.startswith(PARAM)
