"""JSON schema -> grammar nodes, with every cost a stranger controls bounded.

A schema arrives in a request body, so compiling it must not cost more than a cap: each
``$ref`` is compiled once (a 16-level chain of double references is 16 nodes, not 65,536),
nested ``anyOf`` are flattened and their distinct alternatives capped (the automaton tries each
at every value's first byte), objects, enums and the whole grammar have size caps, and a
deadline stops a compile that still runs long. A cap answers ``SchemaTooComplexError`` (a 400
naming the schema feature). Patterns are checked here too (``postcheck.check_patterns``).
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from serve_app.grammar.nodes import (
    ANY,
    ANY_ARRAY,
    ANY_OBJECT,
    ArrayNode,
    LiteralNode,
    Node,
    NumberNode,
    ObjectNode,
    SchemaError,
    StringNode,
    UnionNode,
    dumps_value,
)
from serve_app.grammar.postcheck import check_patterns, check_references

# Caps on what one schema may cost (OpenAI structured outputs has similar ones).
MAX_SCHEMA_NODES = 2000  # subschemas compiled, $refs counted once
MAX_OBJECT_PROPERTIES = 256  # keys of one object: the automaton scans them per key byte
MAX_ANYOF_OPTIONS = 64  # distinct alternatives of one anyOf/type list, nested ones flattened
MAX_ENUM_VALUES = 1024
MAX_COMPILE_SECONDS = 2.0
CACHE_SIZE = 64

_CACHE: OrderedDict[str, Grammar] = OrderedDict()
_CACHE_LOCK = threading.Lock()


class SchemaTooComplexError(SchemaError):
    """The schema is valid but over a cap on the work it may cost; ``feature`` names it."""

    def __init__(self, feature: str, where: str, detail: str) -> None:
        self.feature = feature
        super().__init__(f"response_format.json_schema: {feature} at {where}: {detail}.")


@dataclass
class Grammar:
    """A compiled schema: ``root`` node; ``notes`` list what the automaton does not enforce."""

    root: Node
    schema: Mapping[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    compile_nodes: int = 0  # subschemas compiled: the work this schema cost

    @property
    def fully_enforced(self) -> bool:
        """True when every completed output is valid against the schema by construction."""
        return not self.notes


_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated"}
    | {"readOnly", "writeOnly", "$defs", "definitions", "strict", "name"}
)
_VALUE_CHECKS = frozenset(
    {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength"}
    | {"maxLength", "pattern", "format", "uniqueItems", "minProperties", "maxProperties"}
    | {"contentEncoding", "contentMediaType"}
)
_HANDLED = frozenset(
    {"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems"}
    | {"enum", "const", "anyOf", "allOf", "$ref"}
)
_TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")


def compile_schema(
    schema: Mapping[str, Any] | bool, *, deadline_s: float = MAX_COMPILE_SECONDS
) -> Grammar:
    """Compile a JSON schema into a grammar (see ``serve_app.engine.constraints`` for the
    subset), or raise ``SchemaError`` (``SchemaTooComplexError`` when a cap is hit).

    Compiled grammars are kept (LRU, by the schema's canonical JSON), so the validation a
    service runs off the event loop makes the engine's own compile of the same schema free.
    """
    key = _cache_key(schema)
    if key is not None:
        with _CACHE_LOCK:
            hit = _CACHE.get(key)
            if hit is not None:
                _CACHE.move_to_end(key)
                return hit
    check_patterns(schema)
    compiler = _SchemaCompiler(schema, time.monotonic() + deadline_s)
    root = compiler.node(schema, "#")
    check_references(schema)  # after the compiler's caps: it runs a trial validation
    grammar = Grammar(
        root, schema if isinstance(schema, Mapping) else None, compiler.notes, compiler.count
    )
    if key is not None:
        with _CACHE_LOCK:
            _CACHE[key] = grammar
            while len(_CACHE) > CACHE_SIZE:
                _CACHE.popitem(last=False)
    return grammar


def _cache_key(schema: Any) -> str | None:
    try:
        return json.dumps(schema, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return None


class _SchemaCompiler:
    def __init__(self, root: Any, deadline: float) -> None:
        self.root = root
        self.deadline = deadline
        self.notes: list[str] = []
        self.resolving: set[str] = set()
        self.refs: dict[str, Node] = {}  # each $ref compiled once, however often it is used
        self.count = 0

    def node(self, s: Any, where: str) -> Node:
        self._tick(where)
        node = self._node(s, where)
        if isinstance(node, UnionNode) and len(node.options) > MAX_ANYOF_OPTIONS:
            raise SchemaTooComplexError(
                "anyOf", where, f"more than {MAX_ANYOF_OPTIONS} distinct alternatives"
            )
        return node

    def _tick(self, where: str) -> None:
        """Count compiled subschemas; stop at the cap or the deadline."""
        self.count += 1
        if self.count > MAX_SCHEMA_NODES:
            raise SchemaTooComplexError(
                "size", where, f"more than {MAX_SCHEMA_NODES} subschemas to compile"
            )
        if time.monotonic() > self.deadline:
            raise SchemaTooComplexError("size", where, "compiling it took too long")

    def _node(self, s: Any, where: str) -> Node:
        if s is True:
            return ANY
        if s is False:
            raise SchemaError(f"schema at {where} is false: no value is valid")
        if not isinstance(s, Mapping):
            raise SchemaError(f"schema at {where} is not an object")
        if "$ref" in s:
            return self._ref(s, where)
        checks = sorted(set(s) & _VALUE_CHECKS)
        if checks:
            self.notes.append(f"{where}: not enforced while decoding: {', '.join(checks)}")
        unknown = sorted(set(s) - _HANDLED - _VALUE_CHECKS - _ANNOTATIONS)
        all_of = s.get("allOf")
        if all_of is not None and not (isinstance(all_of, list) and len(all_of) == 1):
            unknown.append("allOf")
        if unknown:
            self.notes.append(f"{where}: unsupported {', '.join(unknown)}: any value of its type")
            return self._typed_only(s, where)
        if all_of is not None:
            rest = {k: v for k, v in s.items() if k != "allOf"}
            return self.node(_merge(rest, all_of[0]), where)
        if "anyOf" in s:
            rest = {k: v for k, v in s.items() if k != "anyOf"}
            options = s["anyOf"]
            if not isinstance(options, list):
                raise SchemaError(f"anyOf at {where} must be a list")
            branches = [_merge(rest, o) for o in options]
            return UnionNode([self.node(b, f"{where}/anyOf/{i}") for i, b in enumerate(branches)])
        types = self._types(s, where)
        if "const" in s or "enum" in s:
            values = [s["const"]] if "const" in s else list(s["enum"])
            if len(values) > MAX_ENUM_VALUES:
                raise SchemaTooComplexError("enum", where, f"more than {MAX_ENUM_VALUES} values")
            values = [v for v in values if any(_has_type(v, t) for t in types)]
            return LiteralNode(dumps_value(v) for v in values)
        nodes = [self._typed(t, s, where) for t in types]
        return nodes[0] if len(nodes) == 1 else UnionNode(nodes)

    def _ref(self, s: Mapping[str, Any], where: str) -> Node:
        ref = s["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#") or ref in self.resolving:
            self.notes.append(f"{where}: $ref {ref!r} (recursive or not local): any value")
            return ANY
        target: Any = self.root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, Mapping) or part not in target:
                raise SchemaError(f"$ref {ref!r} at {where} does not resolve")
            target = target[part]
        if ref in self.refs:
            return self.refs[ref]
        self.resolving.add(ref)
        try:
            node = self.refs[ref] = self.node(target, ref)
        finally:
            self.resolving.discard(ref)
        return node

    def _types(self, s: Mapping[str, Any], where: str) -> list[str]:
        t = s.get("type")
        if t is None:
            if {"properties", "required", "additionalProperties"} & s.keys():
                return ["object"]
            if {"items", "minItems", "maxItems"} & s.keys():
                return ["array"]
            return list(_TYPES)
        types = [t] if isinstance(t, str) else list(t)
        bad = [x for x in types if x not in _TYPES]
        if bad or not types:
            raise SchemaError(f"unknown type {t!r} at {where}")
        if "number" in types and "integer" in types:
            types.remove("integer")
        return types

    def _typed_only(self, s: Mapping[str, Any], where: str) -> Node:
        """Fallback for unsupported keywords: any value of the declared type(s)."""
        if "type" not in s:
            return ANY
        simple = {"object": ANY_OBJECT, "array": ANY_ARRAY}
        nodes = [simple.get(t) or self._typed(t, {}, where) for t in self._types(s, where)]
        return nodes[0] if len(nodes) == 1 else UnionNode(nodes)

    def _typed(self, t: str, s: Mapping[str, Any], where: str) -> Node:
        if t == "object":
            return self._object(s, where)
        if t == "array":
            items = s.get("items", True)
            if isinstance(items, list):  # draft-4 tuple form
                self.notes.append(f"{where}: tuple items: any items")
                items = True
            max_items = s.get("maxItems")
            return ArrayNode(
                self.node(items, f"{where}/items"),
                int(s.get("minItems", 0)),
                None if max_items is None else int(max_items),
            )
        if t == "string":
            return StringNode()
        if t in ("number", "integer"):
            return NumberNode(integer=t == "integer")
        return LiteralNode([b"true", b"false"] if t == "boolean" else [b"null"])

    def _object(self, s: Mapping[str, Any], where: str) -> Node:
        props = dict(s.get("properties") or {})
        required = list(s.get("required") or [])
        if len(props.keys() | set(map(str, required))) > MAX_OBJECT_PROPERTIES:
            raise SchemaTooComplexError(
                "properties", where, f"more than {MAX_OBJECT_PROPERTIES} properties in one object"
            )
        for key in required:
            props.setdefault(key, True)  # required but undeclared: any value
        nodes = {k: self.node(v, f"{where}/properties/{k}") for k, v in props.items()}
        extra = s.get("additionalProperties", True)
        additional = None if extra is False or props else self.node(extra, f"{where}/*")
        return ObjectNode(nodes, required, additional)


def _merge(outer: Mapping[str, Any], inner: Any) -> Any:
    """A subschema (anyOf branch, allOf item) with the keywords around it applied too."""
    if isinstance(inner, Mapping):
        return {**outer, **inner}
    return inner if inner is False or not outer else dict(outer)


def _has_type(value: Any, t: str) -> bool:
    if t == "integer":
        return (
            isinstance(value, int)
            and not isinstance(value, bool)
            or (isinstance(value, float) and value.is_integer())
        )
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}
    if t == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, kinds[t])
