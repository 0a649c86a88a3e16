"""The schemas ``bench.grammar_library`` runs: realistic ones with a valid answer each, hostile
ones (what a stranger may send to make a compile slow), the features the project caps or
falls back on, and the documents today's JSON tests expect to pass or fail.

The tests' shared schema is imported from their fixtures; the few schemas that live inside
test modules are repeated here (importing those modules would start the app's fixtures).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.fixtures.constraints import SCHEMA as TEST_SCHEMA
from tests.fixtures.constraints import nested_any_of, ref_chain

Schema = dict[str, Any] | None  # None: ``json_object`` mode (any object)


@dataclass(frozen=True)
class Case:
    """A schema and one valid answer to walk token by token."""

    name: str
    schema: Schema
    instance: Any


PERSON = {  # tests/test_constraints_decoding.py
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}

REFS_ANYOF_CONST = {  # tests/test_constraints.py::test_refs_anyof_and_const
    "$defs": {"pet": {"type": "object", "properties": {"kind": {"const": "cat"}}}},
    "type": "object",
    "properties": {
        "pet": {"$ref": "#/$defs/pet"},
        "maybe": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
    },
}

TOOL_CALL = {  # one OpenAI chat.completions tool call, arguments as an object
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "properties": {
                "name": {"enum": ["get_weather", "search_web", "create_event"]},
                "arguments": {
                    "type": "object",
                    "properties": {
                        "location": {"type": "string"},
                        "unit": {"enum": ["celsius", "fahrenheit"]},
                        "days": {"type": "integer"},
                        "include_hourly": {"type": "boolean"},
                    },
                    "required": ["location", "unit"],
                    "additionalProperties": False,
                },
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        },
    },
    "required": ["id", "type", "function"],
    "additionalProperties": False,
}

ORDER = {  # nested arrays of objects with enums
    "type": "object",
    "properties": {
        "order_id": {"type": "string"},
        "status": {"enum": ["pending", "paid", "shipped", "delivered", "cancelled"]},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "quantity": {"type": "integer"},
                    "size": {"enum": ["XS", "S", "M", "L", "XL"]},
                    "options": {
                        "type": "array",
                        "items": {"enum": ["gift-wrap", "express", "insured", "signature"]},
                        "maxItems": 4,
                    },
                    "price": {"type": "number"},
                },
                "required": ["sku", "quantity", "price"],
            },
            "minItems": 1,
        },
        "shipping": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "country": {"enum": ["FR", "DE", "US", "JP", "BR"]},
                "express": {"type": "boolean"},
            },
            "required": ["name", "country"],
        },
        "notes": {"type": ["string", "null"]},
    },
    "required": ["order_id", "status", "items", "shipping"],
}

_KINDS = ({"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"})
WIDE = {  # many properties: 60 fields of mixed types, every other one required
    "type": "object",
    "properties": {f"field_{i:02d}": _KINDS[i % 4] for i in range(60)},
    "required": [f"field_{i:02d}" for i in range(0, 60, 2)],
}
_WIDE_VALUES = ("value", 42, 3.5, True)

CASES = [
    Case("json_object", None, {"user": {"id": 7, "tags": ["a", "b"]}, "ok": True, "n": None}),
    Case("person (tests)", PERSON, {"name": "Ada Lovelace", "age": 36}),
    Case(
        "SCHEMA (tests)",
        TEST_SCHEMA,
        {
            "name": "Grace Hopper",
            "age": 85,
            "score": 9.5,
            "active": True,
            "nickname": None,
            "color": "blue",
            "level": 12,
            "tags": ["navy", "cobol"],
            "address": {"city": "Arlington", "zip": "22201"},
        },
    ),
    Case("refs+anyOf (tests)", REFS_ANYOF_CONST, {"pet": {"kind": "cat"}, "maybe": 3}),
    Case(
        "tool call",
        TOOL_CALL,
        {
            "id": "call_8f2a",
            "type": "function",
            "function": {
                "name": "get_weather",
                "arguments": {"location": "Paris, France", "unit": "celsius", "days": 3},
            },
        },
    ),
    Case(
        "order (arrays/enums)",
        ORDER,
        {
            "order_id": "A-1042",
            "status": "paid",
            "items": [
                {
                    "sku": "TS-01",
                    "quantity": 2,
                    "size": "M",
                    "options": ["gift-wrap"],
                    "price": 19.9,
                },
                {"sku": "HD-77", "quantity": 1, "size": "XL", "options": [], "price": 54.0},
                {"sku": "SK-3", "quantity": 3, "price": 4.5},
            ],
            "shipping": {"name": "Ines Duarte", "country": "FR", "express": False},
            "notes": None,
        },
    ),
    Case("60 properties", WIDE, {f"field_{i:02d}": _WIDE_VALUES[i % 4] for i in range(60)}),
]

# ------------------------------------------------------------------------------- hostile


def _nested_objects(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def _nested_arrays(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return {"type": "object", "properties": {"v": schema}, "required": ["v"]}


def _prop(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": {"v": schema}, "required": ["v"]}


def _text(**keywords: Any) -> dict[str, Any]:
    return _prop({"type": "string", **keywords})


_NAMES = [f"p{i:04d}" for i in range(4000)]

_ANYOF_OBJECTS = {
    "anyOf": [
        {
            "type": "object",
            "properties": {f"k{i}": {"type": "integer"}, "x": {"type": "string"}},
            "required": [f"k{i}"],
        }
        for i in range(1000)
    ]
}
_ALTERNATION = "^(" + "|".join(f"w{i:03d}" for i in range(199)) + ")$"  # 999 characters

# (what, schema, a prefix of an answer that reaches the hostile part: one mask is timed there)
HOSTILE: list[tuple[str, dict[str, Any], str]] = [
    ("16 doubled $refs (tests)", ref_chain(16), '{"a": {"a": {"a": {"a": '),
    ("16 nested anyOf (tests)", nested_any_of(16), '{"v": [[[[[[[['),
    ("60 nested objects", _nested_objects(60), '{"a": {"a": {"a": {"a": {"a": '),
    ("60 nested arrays", _nested_arrays(60), '{"v": [[[[[[[[[[[[[[[['),
    (
        "enum of 20,000 strings",
        _prop({"enum": [f"value-{i:05d}" for i in range(20000)]}),
        '{"v": "value-1',
    ),
    (
        "anyOf 100 consts (tests)",
        _prop({"anyOf": [{"const": f"value-{i}"} for i in range(100)]}),
        '{"v": "value-',
    ),
    ("anyOf 1,000 objects", _prop(_ANYOF_OBJECTS), '{"v": {"'),
    (
        "4,000 required properties (tests)",
        {
            "type": "object",
            "properties": {n: {"type": "integer"} for n in _NAMES},
            "required": _NAMES,
        },
        '{"p0000": 1, "p0001": 2, "',
    ),
    (
        "256 optional properties",
        {"type": "object", "properties": {n: {"type": "integer"} for n in _NAMES[:256]}},
        '{"p0100": 1, "',
    ),
    ("pattern [ab]*a[ab]{24} (DFA blow-up)", _text(pattern="^[ab]*a[ab]{24}$"), '{"v": "abba'),
    ("pattern (.|.)*Z (backtracking, tests)", _text(pattern="^(.|.)*Z$"), '{"v": "xyz'),
    ("pattern of 999 chars", _text(pattern=_ALTERNATION), '{"v": "w1'),
    ("pattern [a-z]{1000,5000}", _text(pattern="^[a-z]{1000,5000}$"), '{"v": "abc'),
    ("maxLength 100,000", _text(minLength=50000, maxLength=100000), '{"v": "abc'),
    (
        "minItems 10,000",
        _prop({"type": "array", "items": {"type": "integer"}, "minItems": 10000}),
        '{"v": [1, 2, ',
    ),
    (
        "integer range + multipleOf",
        _prop({"type": "integer", "minimum": -(10**15), "maximum": 10**15, "multipleOf": 7}),
        '{"v": 12',
    ),
]

# ----------------------------------------------------------------------------- features

_S = {"type": "string"}


def _many_subschemas() -> dict[str, Any]:
    """2,269 subschemas: nine objects of 250 strings, each under every other cap."""
    wide = {"type": "object", "properties": {n: _S for n in _NAMES[:250]}}
    return {
        "$defs": {f"d{i}": wide for i in range(9)},
        "type": "object",
        "properties": {f"r{i}": {"$ref": f"#/$defs/d{i}"} for i in range(9)},
    }


FEATURES: list[tuple[str, str, Any]] = [
    # (what, the project today, schema)
    ("> 2,000 subschemas", "400 size", _many_subschemas()),
    ("anyOf > 64 alternatives", "400 anyOf", _prop({"anyOf": [{"const": i} for i in range(100)]})),
    (
        "> 256 properties",
        "400 properties",
        {"type": "object", "properties": {n: _S for n in _NAMES[:300]}},
    ),
    ("enum > 1,024 values", "400 enum", _prop({"enum": list(range(2000))})),
    ("pattern > 1,000 chars", "400 pattern", _prop({"type": "string", "pattern": "a" * 1001})),
    ("backreference pattern", "400 pattern", _prop({"type": "string", "pattern": r"^(a+)\1$"})),
    ("lookahead pattern", "400 pattern", _prop({"type": "string", "pattern": "^(?=a)a+$"})),
    ("invalid pattern", "400 pattern", _prop({"type": "string", "pattern": "(a"})),
    ("$dynamicRef", "400 $dynamicRef", {"$dynamicRef": "#x"}),
    ("remote $ref", "400 $ref", {"$ref": "http://127.0.0.1:9/schema.json"}),
    ("file $ref", "400 $ref", {"$ref": "file:///etc/hostname"}),
    ("$ref loop", "400 refers back", {"$ref": "#"}),
    ("maxLength -5", "400 meta-schema", {"type": "string", "maxLength": -5}),
    ('required "a"', "400 meta-schema", {"type": "object", "required": "a"}),
    ("empty enum", "400 admits nothing", {"type": "string", "enum": []}),
    ("minItems > maxItems", "400 admits nothing", {"type": "array", "minItems": 3, "maxItems": 1}),
    ("unknown type", "400 admits nothing", {"type": "frobnicate"}),
    ("false schema", "400 admits nothing", False),
    ("minimum / maxLength", "post-check", _prop({"type": "integer", "minimum": 3})),
    ("format: email", "post-check", _prop({"type": "string", "format": "email"})),
    ("format: unknown", "post-check", _prop({"type": "string", "format": "no-such-format"})),
    ("oneOf", "fallback", _prop({"oneOf": [{"type": "string"}, {"type": "integer"}]})),
    ("not", "fallback", _prop({"not": {"type": "string"}})),
    ("patternProperties", "fallback", {"type": "object", "patternProperties": {"^x": _S}}),
    ("prefixItems", "fallback", _prop({"type": "array", "prefixItems": [_S]})),
    ("uniqueItems", "post-check", _prop({"type": "array", "uniqueItems": True})),
    ("minProperties", "post-check", {"type": "object", "minProperties": 2}),
    ("if/then/else", "fallback", _prop({"if": _S, "then": {"maxLength": 3}, "else": {}})),
    (
        "recursive $ref (tests)",
        "fallback",
        {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#"}}}},
    ),
]

# ---------------------------------------------------------------------------- semantics

# (schema, document, whether today's tests expect it to pass), from tests/test_constraints.py
_TESTS_VALID_OBJECTS = [
    "{}",
    ' \n{ "a" : 1 }',  # the test's trailing "\n ": once complete, the mask forces the end token
    '{"a": [1, -0, 2.5e-3, 1E+9, "x\\u00e9\\n", true, false, null, {}, []]}',
    '{"nested": {"deep": [[[]], {"k": {"z": -12.0}}]}}',
    '{"é": "中文 ünïcode 🎉"}',
]
_TESTS_INVALID_OBJECTS = [
    "[1]", '"x"', "1", '{"a":01}', '{"a":1,}', '{"a":1.}', '{"a":tru}', '{"a":NaN}',
    "{'a':1}", '{"a":"\\x"}', '{"a":"tab\there"}', '{"a":1}}', '{"a":1} x',
]  # fmt: skip
_INVALID_BYTES = [b'{"a":"\xc0\x80"}', b'{"a":"\xed\xa0\x80"}', b'{"a":"\xf5\x80\x80\x80"}']
_SCHEMA_DOCS = [
    ('{"name": "a", "age": 1, "address": {"city": "x"}}', True),
    ('{"age": 1, "name": "a", "address": {"city": "x"}}', True),  # keys out of schema order
    ('{"level":12,"name":"","age":0,"address":{"city":""}}', True),  # test_schema_keys_...
    ('{\n  "name": "a",\n  "age": 1,\n  "address": {\n    "city": "x"\n  }\n}', True),  # indent=2
    ('{\n\t"name": "a",\n\t"age": 1,\n\t"address": {\n\t\t"city": "x"\n\t}\n}', True),  # "\t"
    ('{"name": "a", "age": 1, "address": {"city": "x"}, "extra": 1}', False),
    ('{"name": "a", "name": "b"}', False),
    ('{"name": "a", "age": 1, "address": {"city": "x", "street": "y"}}', False),  # only properties
    ('{"name": 1}', False),
    ('{"age": 1.5}', False),
    ('{"name": "a", "age": 1}', False),
    ('{"color": "purple"}', False),
    ('{"level": 3}', False),
    ('{"tags": ["a", "b", "c", "d"]}', False),
    ('{"nickname": 0}', False),
]
_TWO_OBJECTS = {
    "anyOf": [
        {"type": "object", "properties": {k: {"type": "integer"}}, "required": [k]} for k in "ab"
    ]
}
_TWO_ARRAYS = {"anyOf": [{"type": "array", "items": {"type": t}} for t in ("integer", "string")]}
SEMANTICS: list[tuple[str, Schema, bytes, bool]] = [
    *[("json_object", None, doc.encode(), True) for doc in _TESTS_VALID_OBJECTS],
    *[("json_object", None, doc.encode(), False) for doc in _TESTS_INVALID_OBJECTS],
    *[("json_object", None, doc, False) for doc in _INVALID_BYTES],
    ("json_object", None, b"{" + b" " * 65 + b"}", False),  # MAX_WS_RUN: endless whitespace
    *[("SCHEMA", TEST_SCHEMA, doc.encode(), ok) for doc, ok in _SCHEMA_DOCS],
    ("refs+anyOf", REFS_ANYOF_CONST, b'{"pet": {"kind": "cat"}, "maybe": null}', True),
    ("refs+anyOf", REFS_ANYOF_CONST, b'{"maybe": 3}', True),
    ("refs+anyOf", REFS_ANYOF_CONST, b'{"pet": {"kind": "dog"}}', False),
    ("required, no properties", {"type": "object", "required": ["id"]}, b'{"id": [1, {}]}', True),
    ("required, no properties", {"type": "object", "required": ["id"]}, b"{}", False),
    ("closed empty object", {"type": "object", "additionalProperties": False}, b"{}", True),
    ("closed empty object", {"type": "object", "additionalProperties": False}, b'{"a":1}', False),
    ("person (tests)", PERSON, b'{"name":"","age":0}', True),
    # Valid, but the automaton's anyOf commits to one alternative at the value's first byte
    # (grammar.UnionNode), so only the first of two object or array shapes can be written.
    ("anyOf of two objects", _TWO_OBJECTS, b'{"b": 1}', True),
    ("anyOf of two arrays", _prop(_TWO_ARRAYS), b'{"v": ["x"]}', True),
]
