"""The after-the-fact check of a constrained answer, with every regex bounded.

The automaton does not enforce value checks such as ``pattern``; ``validate_output`` runs
them with ``jsonschema``. A stranger writes those patterns, and Python's ``re`` backtracks
(``^(.|.)*Z$`` took 8.8 s on 26 characters), so:

- ``check_patterns`` refuses, when the schema is compiled, the constructs no engine can run
  in linear time (backreferences, lookaround) and over-long patterns;
- ``pattern`` and ``patternProperties`` are evaluated with the ``regex`` module under a
  per-match timeout; a pattern that runs out of time counts as not matching, so the answer
  fails validation instead of holding a thread.

References stay inside the schema: left to itself, ``jsonschema`` fetches a ``$ref`` to an
``http://`` or ``file://`` address (with no timeout), which would let a request make a model
replica read URLs and files of an attacker's choosing. So ``check_references`` refuses any
``$ref`` that is not a local ``#...`` pointer, and the ``$dynamicRef``/``$recursiveRef``
keywords, when the schema is compiled; validation runs over a registry that retrieves nothing;
and a schema whose references loop without reading the answer (``{"$ref": "#"}``) is refused
by a trial validation instead of ending in a RecursionError after the answer was generated.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import regex

from serve_app.grammar.nodes import SchemaError

MAX_PATTERN_CHARS = 1000
PATTERN_TIMEOUT_S = 0.05
# Backreferences (\1, \k<name>, (?P=name)) and lookaround need backtracking in any engine.
_NON_LINEAR = regex.compile(r"\\[1-9]|\\k<|\(\?P=|\(\?<?[=!]")


def check_patterns(schema: Any) -> None:
    """Raise ``SchemaError`` naming ``pattern`` for a pattern that cannot be run safely."""
    for where, pattern in _patterns(schema):
        if not isinstance(pattern, str):
            raise SchemaError(f"response_format.json_schema: pattern at {where} is not a string.")
        if len(pattern) > MAX_PATTERN_CHARS:
            raise SchemaError(
                f"response_format.json_schema: pattern at {where} is longer than "
                f"{MAX_PATTERN_CHARS} characters."
            )
        if _NON_LINEAR.search(pattern):
            raise SchemaError(
                f"response_format.json_schema: pattern at {where} uses a backreference or "
                "lookaround, which this service does not run."
            )
        try:
            regex.compile(pattern)
        except regex.error as e:
            raise SchemaError(
                f"response_format.json_schema: pattern at {where} is not a valid regex: {e}."
            ) from None


def check_references(schema: Any) -> None:
    """Raise ``SchemaError`` for a reference that leaves the schema or loops on itself."""
    for where, node in _nodes(schema):
        for keyword in ("$dynamicRef", "$recursiveRef"):
            if keyword in node:
                raise SchemaError(
                    f"response_format.json_schema: {keyword} at {where} is not supported."
                )
        ref = node.get("$ref")
        if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
            raise SchemaError(
                f"response_format.json_schema: $ref {ref!r} at {where} is not a local "
                "reference (#/...); references to other documents are not fetched."
            )
    if isinstance(schema, Mapping):
        validator = _validator(schema)
        _check_against_meta_schema(validator, schema)
        try:
            for sample in (None, {}, [], "", 0):
                validator.is_valid(sample)
        except RecursionError:
            raise SchemaError(
                "response_format.json_schema: its $ref chain refers back to itself without "
                "reading any part of the answer."
            ) from None
        except Exception as e:  # an unresolvable pointer, a malformed keyword
            raise SchemaError(f"response_format.json_schema: {e}") from None


def _check_against_meta_schema(validator: Any, schema: Mapping[str, Any]) -> None:
    """A schema its own draft's meta-schema refuses (``maxLength: -5``, ``required: "a"``)
    is a 400 now, not a failed check after the answer was generated and billed."""
    import jsonschema

    try:
        type(validator).check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(part) for part in e.absolute_path) or "the root"
        raise SchemaError(
            f"response_format.json_schema is not a valid JSON schema at {where}: {e.message}"
        ) from None


def _nodes(schema: Any) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every object in the schema with its location, iteratively (no recursion limit)."""
    stack: list[tuple[str, Any]] = [("#", schema)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, Mapping):
            yield where, node
            stack.extend((f"{where}/{k}", v) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((f"{where}/{i}", v) for i, v in enumerate(node))


def _patterns(schema: Any) -> Iterator[tuple[str, Any]]:
    """Every ``pattern`` value and ``patternProperties`` key."""
    for where, node in _nodes(schema):
        if "pattern" in node and not isinstance(node["pattern"], Mapping):
            yield f"{where}/pattern", node["pattern"]
        pattern_properties = node.get("patternProperties")
        if isinstance(pattern_properties, Mapping):
            for key in pattern_properties:
                yield f"{where}/patternProperties", key


def pattern_search(pattern: str, text: str) -> bool:
    """``re.search`` semantics with a deadline; running out of time counts as no match."""
    try:
        return regex.search(pattern, text, timeout=PATTERN_TIMEOUT_S) is not None
    except TimeoutError:
        return False


def validate_output(text: str, schema: Mapping[str, Any] | None) -> str | None:
    """Why ``text`` is not a valid answer (None when it is): parse, top-level object or schema.

    The post-check for schemas the automaton does not fully enforce (``Grammar.notes``), and a
    way to tell a caller that a length-cut answer is not JSON.
    """
    try:
        value = json.loads(text)
    except ValueError as e:
        return f"not valid JSON: {e}"
    if schema is None:
        return None if isinstance(value, dict) else "the top-level value is not an object"
    import jsonschema

    check_patterns(schema)
    try:  # references were checked at compile; the registry fetches nothing regardless
        _validator(schema).validate(value)
    except jsonschema.ValidationError as e:
        return f"does not match the schema: {e.message}"
    return None


def _validator(schema: Mapping[str, Any]) -> Any:
    """A ``jsonschema`` validator for ``schema`` with bounded patterns and no retrieval."""
    import jsonschema
    from referencing import Registry

    validator = _bounded_validator(jsonschema.validators.validator_for(schema))
    return validator(schema, registry=Registry(retrieve=_retrieve_nothing))


def _retrieve_nothing(uri: str) -> Any:
    raise SchemaError(f"response_format.json_schema: $ref to {uri!r} is not fetched.")


def _bounded_validator(base: type) -> type:
    """``base`` with ``pattern`` and ``patternProperties`` run by ``pattern_search``."""
    import jsonschema

    def pattern(validator: Any, patrn: str, instance: Any, schema: Any) -> Iterator[Any]:
        if validator.is_type(instance, "string") and not pattern_search(patrn, instance):
            yield jsonschema.ValidationError(f"{instance!r} does not match {patrn!r}")

    def pattern_properties(
        validator: Any, properties: Mapping[str, Any], instance: Any, schema: Any
    ) -> Iterator[Any]:
        if not validator.is_type(instance, "object"):
            return
        for patrn, subschema in properties.items():
            for key, value in instance.items():
                if pattern_search(patrn, key):
                    yield from validator.descend(value, subschema, path=key, schema_path=patrn)

    return jsonschema.validators.extend(
        base, {"pattern": pattern, "patternProperties": pattern_properties}
    )
