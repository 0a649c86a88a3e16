"""The reference validator's side of a schema: its meta-schema and references before decoding,
and the answer after, with every regex bounded.

References stay inside the schema: left to itself, ``jsonschema`` fetches a ``$ref`` to an
``http://`` or ``file://`` address (with no timeout), which would let a request make a model
replica read URLs and files of an attacker's choosing. So ``schema_problem`` finds any
``$ref`` that is not a local ``#...`` pointer, and ``$dynamicRef``/``$recursiveRef``;
validation runs over a registry that retrieves nothing; and a schema whose references loop
without reading the answer (``{"$ref": "#"}``) is found by a trial validation instead of
ending in a RecursionError after the answer was generated.

A stranger writes the patterns too, and Python's ``re`` backtracks (``^(.|.)*Z$`` takes seconds
on a few dozen characters: docs/security.md), so ``pattern`` and ``patternProperties`` are
evaluated with the ``regex`` module under a per-match timeout; a pattern that runs out of time
counts as not matching.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

import regex

PATTERN_TIMEOUT_S = 0.05


def schema_problem(schema: Mapping[str, Any]) -> tuple[str, list[str | int]] | None:
    """Why the reference validator cannot take ``schema`` (its meta-schema refuses it, or a
    reference leaves the schema or loops on itself), with where; None when it can."""
    import jsonschema

    for path, node in _nodes(schema):
        for keyword in ("$dynamicRef", "$recursiveRef"):
            if keyword in node:
                return f"{keyword} is not supported.", [*path, keyword]
        ref = node.get("$ref")
        if ref is not None and not (isinstance(ref, str) and ref.startswith("#")):
            reason = f"$ref {ref!r} is not a local reference (#/...); documents are not fetched."
            return reason, [*path, "$ref"]
    try:
        validator = _validator(schema)
        type(validator).check_schema(schema)
    except jsonschema.SchemaError as e:
        return f"not a valid JSON schema: {e.message}", list(e.absolute_path)
    except Exception as e:  # "$schema": {} or "$id": 5 break the validator's own set-up
        return f"not a JSON schema the reference validator reads ({type(e).__name__}).", []
    try:
        for sample in (None, {}, [], "", 0):
            validator.is_valid(sample)
    except RecursionError:
        return "its $ref chain refers back to itself without reading any of the answer.", []
    except Exception as e:  # an unresolvable pointer, a malformed keyword
        return (str(e).splitlines() or [type(e).__name__])[0], []
    return None


def _nodes(schema: Any) -> Iterator[tuple[list[str | int], Mapping[str, Any]]]:
    """Every object in the schema with its path, iteratively (no recursion limit)."""
    stack: list[tuple[list[str | int], Any]] = [([], schema)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, Mapping):
            yield path, node
            stack.extend(([*path, k], v) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend(([*path, i], v) for i, v in enumerate(node))


def pattern_search(pattern: str, text: str) -> bool:
    """``re.search`` semantics with a deadline; running out of time counts as no match."""
    try:
        return regex.search(pattern, text, timeout=PATTERN_TIMEOUT_S) is not None
    except TimeoutError:
        return False


def validate_output(text: str, schema: Mapping[str, Any] | None) -> str | None:
    """Why ``text`` is not a valid answer (None when it is): parse, top-level object or schema.
    The grammar makes every answer that ends valid; this is the belt to its braces."""
    try:
        value = json.loads(text)
    except ValueError as e:
        return f"not valid JSON: {e}"
    if schema is None:
        return None if isinstance(value, dict) else "the top-level value is not an object"
    import jsonschema

    try:  # references were checked before decoding; the registry fetches nothing regardless
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
    raise ValueError(f"$ref to {uri!r} is not fetched.")


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
