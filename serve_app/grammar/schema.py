"""A client's JSON schema -> an llguidance grammar, or a 400 that names where and why.

A schema arrives in a request body, so it is checked before any of it is compiled, in the
order that gives the clearest answer: the shape and the caps on what it may cost (this
module's walk: subschemas, properties, enum values, anyOf/oneOf alternatives, pattern
length), the JSON Schema meta-schema (``properties: 7`` is named there, not a TypeError),
references that leave the document or loop without reading the answer (``postcheck``),
then llguidance itself, which refuses what it cannot enforce (``not``, ``uniqueItems``,
``if``/``then``, unknown formats) and bounds its own compile and per-token work with
``LIMITS``. Every refusal is a ``SchemaError``: an ``InvalidRequestError`` whose ``param`` is
the request field (``response_format.json_schema.schema``, ``tools[0].function.parameters``)
followed by the place inside the schema where that is known.

Compiled grammars are kept (``cached_grammar``: LRU, by the schema's JSON text), so the check a
service runs off its event loop makes the engine's compile of the same schema a lookup.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import llguidance

from serve_app.errors import InvalidRequestError
from serve_app.grammar.postcheck import schema_problem

# Caps on what one schema may cost (OpenAI's structured outputs has caps of the same kind);
# its nesting is capped where every request body's is (``api.common.MAX_NESTING``).
MAX_SCHEMA_NODES = 2000  # objects and arrays anywhere in the schema document
MAX_OBJECT_PROPERTIES = 256
MAX_ANYOF_OPTIONS = 64
MAX_ENUM_VALUES = 1024
MAX_PATTERN_CHARS = 1000
CACHE_SIZE = 64

# Compile and per-token work llguidance may spend on a stranger's grammar: the lexer's fuel
# and the parser's items a step, sized so a mask never costs more than a few ms and a compile a
# few tens of ms before the grammar is refused (the rates: docs/structured_output.md).
LIMITS = llguidance.LLParserLimits(
    initial_lexer_fuel=1_000_000,
    step_lexer_fuel=200_000,
    step_max_items=50_000,
    max_grammar_size=200_000,
    verbose_errors=False,
)

# How the output is laid out, whatever the schema's own ``x-guidance`` asks: ``json.dumps``'s
# separators and no other whitespace (a model cannot loop on newlines), every keyword enforced
# or the schema refused (``lenient`` would ignore what it cannot enforce).
JSON_OPTIONS: Mapping[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "lenient": False,
    "coerce_one_of": False,
    "json_allow_general_unicode_escapes": True,  # "\u00e9" as models trained on ASCII JSON write
}

# The grammar of ``response_format: json_object``: any object.
ANY_OBJECT_SCHEMA: Mapping[str, Any] = {"type": "object"}

_CACHE: OrderedDict[str, Grammar] = OrderedDict()
_CACHE_LOCK = threading.Lock()


class SchemaError(InvalidRequestError):
    """A schema this service does not decode under: ``param`` says where, the message why."""

    def __init__(self, reason: str, param: str, path: Sequence[str | int] = ()) -> None:
        where = param + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
        self.reason = reason
        super().__init__(f"{where}: {reason}", param=where)


@dataclass(frozen=True)
class Grammar:
    """An llguidance grammar (its serialized text) checked against ``LIMITS``; the matchers
    that walk it come from ``serve_app.grammar.matcher``."""

    text: str


def compile_schema(schema: Any, param: str) -> Grammar:
    """The grammar of documents valid against ``schema``, or ``SchemaError`` naming ``param``."""

    def build() -> Grammar:
        check_schema(schema, param)
        try:  # as JSON text: a number past 64 bits (or NaN) is then the library's refusal
            text = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(enforced(schema)))
        except ValueError as e:
            raise SchemaError(_library_reason(str(e)), param) from None
        return checked_grammar(text, param)

    return cached_grammar("schema " + _cache_key(schema), build)


def cached_grammar(key: str, build: Callable[[], Grammar]) -> Grammar:
    """The grammar cached under ``key``, else ``build``'s (kept once built: a refusal is not)."""
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
    grammar = build()
    with _CACHE_LOCK:
        _CACHE[key] = grammar
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.popitem(last=False)
    return grammar


def enforced(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` as it is decoded: objects closed (``closed_objects``), and this service's
    layout options (``JSON_OPTIONS``) in its ``x-guidance``, which llguidance reads whether the
    schema is a document or a ``%json`` in a Lark grammar."""
    return {**closed_objects(schema), "x-guidance": dict(JSON_OPTIONS)}


# Keywords whose value is a subschema, a list of them, or a map of names to them; and those
# whose meaning depends on objects staying open.
_SUBSCHEMA = ("additionalProperties", "items", "not", "if", "then", "else", "contains")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_OPENNESS = frozenset({"allOf", "oneOf", "not", "if"})


def closed_objects(schema: Any) -> Any:
    """Structured outputs' reading of an object that lists ``properties``: only those keys,
    as if ``additionalProperties: false`` were written (a model left free invents keys); a
    schema that says otherwise keeps its word. Closing only narrows what each object takes, so
    every answer stays valid against the original, except under the keywords that read an
    object's openness (``allOf`` parts combine, ``oneOf`` must match once, ``not``, ``if``):
    a schema using one is decoded as written."""
    if any(isinstance(node, Mapping) and _OPENNESS & node.keys() for _, node in _walk(schema)):
        return schema
    return _closed(schema)


def _closed(node: Any) -> Any:
    if not isinstance(node, Mapping):
        return node
    out = dict(node)
    for key in _SUBSCHEMA:
        if key in out:
            out[key] = _closed(out[key])
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_closed(item) for item in out[key]]
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {name: _closed(item) for name, item in out[key].items()}
    if _closable(out):
        out["additionalProperties"] = False
    return out


def _closable(node: Mapping[str, Any]) -> bool:
    """An object that lists its properties and needs no other key: none required that it does
    not list, no more keys asked for than it lists, nothing said of other keys."""
    properties = node.get("properties")
    if not isinstance(properties, Mapping):
        return False
    if {"additionalProperties", "patternProperties", "unevaluatedProperties"} & node.keys():
        return False
    required = node.get("required")
    if isinstance(required, list) and not set(map(str, required)) <= set(properties):
        return False
    least = node.get("minProperties")
    return not (isinstance(least, int) and least > len(properties))


def checked_grammar(text: str, param: str) -> Grammar:
    """``text`` as a ``Grammar`` once llguidance has built it within ``LIMITS``."""
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, limits=LIMITS)
    if is_error:
        raise SchemaError(_library_reason(messages[0]), param)
    return Grammar(text)


def _library_reason(message: str) -> str:
    """llguidance's refusal in one line: a regex error's own ``error:`` line, else its first."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    errors = [line.removeprefix("error:").strip() for line in lines if line.startswith("error:")]
    return f"not supported by the grammar engine: {(errors or lines or ['unknown'])[0]}"


def check_schema(schema: Any, param: str) -> None:
    """Every check but llguidance's (module docstring), cheapest first."""
    if not isinstance(schema, Mapping):
        raise SchemaError("a schema must be a JSON object.", param)
    _check_costs(schema, param)
    problem = schema_problem(schema)
    if problem is not None:
        raise SchemaError(problem[0], param, problem[1])


def _check_costs(schema: Mapping[str, Any], param: str) -> None:
    nodes = 0
    for path, node in _walk(schema):
        nodes += 1
        if nodes > MAX_SCHEMA_NODES:
            raise SchemaError(f"more than {MAX_SCHEMA_NODES} objects and arrays.", param)
        if not isinstance(node, Mapping):
            continue
        _check_keyword_sizes(node, param, path)


# A keyword's size cap: the keyword, its most entries, and what an entry is called.
_SIZE_CAPS = (
    ("properties", MAX_OBJECT_PROPERTIES, "properties in one object"),
    ("required", MAX_OBJECT_PROPERTIES, "required properties in one object"),
    ("anyOf", MAX_ANYOF_OPTIONS, "alternatives"),
    ("oneOf", MAX_ANYOF_OPTIONS, "alternatives"),
    ("enum", MAX_ENUM_VALUES, "values"),
)


def _check_keyword_sizes(node: Mapping[str, Any], param: str, path: list[str | int]) -> None:
    for keyword, cap, what in _SIZE_CAPS:
        value = node.get(keyword)
        if isinstance(value, Mapping | list) and len(value) > cap:
            raise SchemaError(f"more than {cap} {what}.", param, [*path, keyword])
    for where, pattern in _patterns(node, path):
        _check_pattern(pattern, param, where)


def _patterns(node: Mapping[str, Any], path: list[str | int]) -> Iterator[tuple[list, Any]]:
    """A node's ``pattern`` and ``patternProperties`` regexes, each with its path."""
    if "pattern" in node:
        yield [*path, "pattern"], node["pattern"]
    pattern_properties = node.get("patternProperties")
    if isinstance(pattern_properties, Mapping):
        for key in pattern_properties:
            yield [*path, "patternProperties", key], key


def _check_pattern(pattern: Any, param: str, path: list[str | int]) -> None:
    """A regex the grammar engine cannot run (backreferences, lookaround, bad syntax) is
    named here, where its path is known; llguidance's own check has no path."""
    if not isinstance(pattern, str):
        return  # the meta-schema names it
    if len(pattern) > MAX_PATTERN_CHARS:
        raise SchemaError(f"pattern longer than {MAX_PATTERN_CHARS} characters.", param, path)
    problem = llguidance.LLMatcher.validate_grammar(
        llguidance.LLMatcher.grammar_from_regex(pattern), limits=LIMITS
    )
    if problem:
        raise SchemaError(f"pattern {_library_reason(problem)}", param, path)


def _walk(schema: Any) -> Iterator[tuple[list[str | int], Any]]:
    """Every object and array in the document, with its path, iteratively."""
    stack: list[tuple[list[str | int], Any]] = [([], schema)]
    while stack:
        path, node = stack.pop()
        yield path, node
        children = node.items() if isinstance(node, Mapping) else enumerate(node)
        for key, value in children:
            if isinstance(value, Mapping | list):
                stack.append(([*path, key], value))


def _cache_key(schema: Any) -> str:
    return json.dumps(schema, separators=(",", ":"))
