"""Prompts for ``/v1/decisions``: render JSON values as text and build one chat per question.

Every chat starts with the same system message (the task and the *state*), so all questions
of a request share a long token prefix that the scorer runs once and caches. Only the user
message differs between questions; it names the allowed answers, and the scorer reads the
likelihood of those answers at the first assistant position.
"""

from __future__ import annotations

import json
from typing import Any

SYSTEM_TASK = (
    "You are a careful evaluator. You answer questions about the state given below, "
    "judging only from what the state says. You always answer in the exact format requested, "
    "with no explanation."
)

NOUL_TRUE_WORDS = ("true", "yes")
NOUL_FALSE_WORDS = ("false", "no")


def render_value(value: Any) -> str:
    """Render a JSON value as stable, readable text.

    Strings are used as is (they are usually prose); objects and arrays become indented JSON
    in insertion order (key order often carries meaning for the caller); never a Python repr.
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False)


def system_message(state: Any) -> str:
    """The shared first message: task, then the state. Identical for every question."""
    return f"{SYSTEM_TASK}\n\n# State\n\n{render_value(state)}"


def _section(title: str, value: Any) -> str | None:
    text = render_value(value).strip()
    return f"{title}\n{text}" if text else None


def _join(parts: list[str | None]) -> str:
    return "\n\n".join(part for part in parts if part)


def noul_message(name: str, instructions: Any = None, criteria: Any = None) -> str:
    """Ask whether the question's statement holds for the state; answer ``true``/``false``."""
    criteria = criteria if isinstance(criteria, dict) else {}
    return _join(
        [
            f"# Question: {name}",
            "Decide whether the following statement is true or false for the state.",
            _section("## Statement", instructions) or f"## Statement\n{name}",
            _section("## It is true when", criteria.get("true")),
            _section("## It is false when", criteria.get("false")),
            "Answer with exactly one word: true or false.",
        ]
    )


def choice_message(name: str, instructions: Any, labels: dict[str, Any]) -> str:
    """Ask for exactly one of the labels; descriptions are shown under each label."""
    options = "\n".join(_label_line(label, description) for label, description in labels.items())
    listed = ", ".join(labels)
    return _join(
        [
            f"# Question: {name}",
            _section("## Instructions", instructions),
            f"## Options\n{options}",
            f"Answer with exactly one of these labels, written exactly as shown: {listed}.",
        ]
    )


def _label_line(label: str, description: Any) -> str:
    text = render_value(description).strip()
    if not text:
        return f"- {label}"
    return f"- {label}: " + text.replace("\n", "\n  ")


def score_message(name: str, instructions: Any, levels: list[Any]) -> str:
    """Ask for a level digit on an ordered scale, 0 the lowest."""
    top = len(levels) - 1
    scale = "\n".join(_label_line(str(k), level) for k, level in enumerate(levels))
    return _join(
        [
            f"# Question: {name}",
            _section("## Instructions", instructions),
            f"## Scale (0 is the lowest level, {top} the highest)\n{scale}",
            f"Answer with exactly one digit from 0 to {top}: the level that fits the state best.",
        ]
    )


def question_messages(state: Any, user_message: str) -> list[dict[str, str]]:
    """The chat for one question: state first (shared prefix), question second."""
    return [
        {"role": "system", "content": system_message(state)},
        {"role": "user", "content": user_message},
    ]
