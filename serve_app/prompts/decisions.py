"""Prompts for ``/v1/decisions``: render JSON values as text and build one chat per question.

Every chat starts the same way (a fixed system message, a few worked examples as earlier chat
turns, then the user turn opening with the *state*), so all questions of a request share a
long token prefix that the scorer runs once and caches; the examples are the same for every
request, so the prefix cache serves them to all requests. Only the rest of the user turn
differs between questions; it names the allowed answers, and the scorer reads the likelihood
of those answers at the first assistant position.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from serve_app.prompts.chat_encoding import encode_chat

SYSTEM_TASK = (
    "You answer questions about a state. Judge only from what the state says, and answer "
    "in the exact format requested, with no explanation."
)

# The state a calibrated question is also asked about (``scoring.scorer.calibrated``, off
# unless the scorer is built with ``calibrate``): it carries no information, and is the same
# for every request, so its prefix is cached and only the questions' own tokens run again.
# The empty state did at least as well as "N/A" or "{}" on the probe (bench/noul_probe
# --calibration), and calibration itself barely moved it (docs/api-notes.md): not worth running
# and billing every noul question twice.
CONTENT_FREE_STATE = ""

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


def state_block(state: Any) -> str:
    """The start of every user message: the state, then a blank line.

    The state sits at the very start of the user turn, right after a fixed system message:
    on Qwen2.5-0.5B this separates true from false statements better than putting the state
    in the system message (mean gap 0.14 vs 0.06 on a 10-pair probe set), and it keeps the
    state in the prefix that all questions share.
    """
    return f"State:\n{render_value(state).strip()}\n\n"


def _field(title: str, value: Any) -> str | None:
    """``Title: text`` for one-line text, ``Title:`` then the text below it otherwise."""
    text = render_value(value).strip()
    if not text:
        return None
    return f"{title}:\n{text}" if "\n" in text else f"{title}: {text}"


def _lines(parts: list[str | None]) -> str:
    return "\n".join(part for part in parts if part)


def _subject(name: str, instructions: Any) -> str:
    """The instructions when given, else the question's name (often descriptive: "is_spam")."""
    return render_value(instructions).strip() or name


def noul_message(name: str, instructions: Any = None, criteria: Any = None) -> str:
    """Ask whether the question's statement (a quoted "claim") holds for the state; yes/no.

    The answer is read from the model's mass on the yes/no (and true/false) tokens. On
    Qwen2.5-Coder-0.5B this yes/no wording, with a one-line claim in quotes, puts true claims
    above 0.5 and false ones below it more often than "Is the statement true or false? Answer
    true or false." (docs/api-notes.md has the probe's figures). Asking the negated
    question as well and averaging does not help at this size: the model barely reads the
    negation ("contradict", "false") and answers both questions alike. Calibrating on a
    content-free state (``CONTENT_FREE_STATE``) barely moves the probe: with the worked
    examples in the prefix the empty state's p(yes) is already far from 0 or 1 per claim.
    """
    criteria = criteria if isinstance(criteria, dict) else {}
    subject = _subject(name, instructions)
    claim = f'Claim: "{subject}"' if "\n" not in subject else _field("Claim", subject)
    described = _lines(
        [
            claim,
            _field("It is true when", criteria.get("true")),
            _field("It is false when", criteria.get("false")),
        ]
    )
    return f"{described}\n\nIs this claim true, given the state above? Answer yes or no."


# Up to this many labels, the answer line repeats them; beyond, the list above is enough (255
# labels listed twice would double the question's tokens for no gain).
REPEAT_LABELS_UP_TO = 16


def choice_message(name: str, instructions: Any, labels: dict[str, Any]) -> str:
    """Ask for exactly one of the labels; descriptions are shown next to each label."""
    options = "\n".join(_option_line(f"- {label}", text) for label, text in labels.items())
    listed = (
        f": {', '.join(labels)}" if len(labels) <= REPEAT_LABELS_UP_TO else " in the list above"
    )
    return (
        f"{_field('Question', _subject(name, instructions))}\n\nOptions:\n{options}\n\n"
        "Which option fits the state above? Answer with exactly one of these labels, "
        f"written exactly as shown{listed}."
    )


def _option_line(head: str, description: Any) -> str:
    text = render_value(description).strip()
    return f"{head}: " + text.replace("\n", "\n  ") if text else head


def score_message(name: str, instructions: Any, levels: list[Any]) -> str:
    """Ask for a level digit on an ordered scale, 0 the lowest."""
    top = len(levels) - 1
    scale = "\n".join(_option_line(str(k), level) for k, level in enumerate(levels))
    return (
        f"{_field('Question', _subject(name, instructions))}\n\n"
        f"Scale (0 is the lowest level, {top} the highest):\n{scale}\n\n"
        f"Which level fits the state above? Answer with exactly one digit from 0 to {top}."
    )


# Worked yes/no examples, two per kind of state (one true, one false), none from the probe.
# As chat turns they move more claims to the right side of 0.5 and order more pairs on
# Qwen2.5-Coder-0.5B than fewer, generic examples or the same ones as system-message text
# (bench/noul_probe; the figures: docs/api-notes.md).
NOUL_EXAMPLES: tuple[tuple[Any, str, str], ...] = (
    ({"ticket": "The export button does nothing when I click it.", "customer": "acme"},
     "The ticket reports a bug.", "yes"),
    ({"ticket": "How do I change the email address on my account?"},
     "The ticket reports an outage.", "no"),
    ("def is_even(n):\n    return n % 2 == 0",
     "The function checks whether a number is even.", "yes"),
    ("def area(r):\n    return 3.14 * r * r", "The function sorts a list.", "no"),
    ("2024-06-01 12:00:03 ERROR payment: timeout after 30s", "The log reports an error.", "yes"),
    ("2024-06-01 12:00:03 INFO cache warmed in 80 ms", "The log reports an error.", "no"),
    ({"order": {"status": "delivered", "paid": True}}, "The order was delivered.", "yes"),
    ({"order": {"status": "pending", "paid": False}}, "The order has been paid.", "no"),
    ({"rating": 5, "text": "Fast delivery and great quality."}, "The customer is happy.", "yes"),
    ({"rating": 1, "text": "Arrived broken and late."}, "The review is positive.", "no"),
    ({"subject": "Team lunch", "body": "Pizza on Friday at noon, who is in?"},
     "The email is about a lunch.", "yes"),
    ({"subject": "Invoice 3321", "body": "Please find your invoice attached."},
     "The email is spam.", "no"),
)  # fmt: skip


def example_turns() -> list[dict[str, str]]:
    """The worked examples as user/assistant turns, in the same format as real questions."""
    turns = []
    for state, claim, answer in NOUL_EXAMPLES:
        turns.append({"role": "user", "content": state_block(state) + noul_message("q", claim)})
        turns.append({"role": "assistant", "content": answer})
    return turns


def question_messages(user_content: str) -> list[dict[str, str]]:
    """The chat for one question: the fixed system turn and examples, then
    ``state_block + question``."""
    return [
        {"role": "system", "content": SYSTEM_TASK},
        *example_turns(),
        {"role": "user", "content": user_content},
    ]


# Template tokens a chat turn adds around its content ("<|im_start|>role\n", "<|im_end|>\n").
TURN_TOKENS = 8


@functools.cache
def fixed_prefix_token_bound() -> int:
    """At least the tokens of the fixed part of every decision prompt (system turn and worked
    examples, counted in full in usage): a byte-level BPE token spells at least one byte.
    The router reserves it before any work, without a tokenizer."""
    messages = question_messages("")
    return sum(len(m["content"].encode()) for m in messages) + TURN_TOKENS * len(messages)


@dataclass(frozen=True)
class ChatFrame:
    """The template's token ids around the user turn's content, the system turn included.

    A question's prompt is ``head + state + question + tail``: the state's ids are computed
    once per request and shared by every question, and user text is only ever encoded as
    plain text (``encode_chat`` splits special-token spellings).
    """

    head: list[int]
    tail: list[int]


def chat_frame(tokenizer: Any) -> ChatFrame:
    """Split the encoded chat of an empty and a one-letter user content around the content."""
    empty = encode_chat(tokenizer, question_messages(""))
    marked = encode_chat(tokenizer, question_messages("X"))
    extra = len(marked) - len(empty)
    split = next(
        (i for i, (a, b) in enumerate(zip(marked, empty, strict=False)) if a != b), len(empty)
    )
    head, tail = marked[:split], marked[split + extra :]
    if extra < 1 or head + tail != empty:
        raise ValueError("the chat template does not place the user content in one piece")
    return ChatFrame(head=head, tail=tail)
