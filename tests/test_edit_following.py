"""Which regions follow a predicted edit (``typed_toward``), and whose predictions a request
may follow (``Predictions``)."""

from __future__ import annotations

import pytest

from serve_app.prompts.next_edit import CURSOR, EditPrompt
from serve_app.prompts.next_edit.following import typed_toward
from serve_app.serving.predictions import Predictions

BEFORE = "if total < 0:\n    total = 0.0"
PREDICTED = "if subtotal < 0:\n    total = 0.0"


@pytest.mark.parametrize(
    ("before", "predicted", "now", "follows"),
    [
        (BEFORE, PREDICTED, "if stotal < 0:\n    total = 0.0", True),  # typed its first letter
        (BEFORE, PREDICTED, "if subtotal < 0:\n    total = 0.0", False),  # typed all: no more
        (BEFORE, PREDICTED, BEFORE, False),  # nothing typed
        (BEFORE, PREDICTED, "if xtotal < 0:\n    total = 0.0", False),  # another letter
        (BEFORE, PREDICTED, "if stotal < 0:\n    total = 1.0", False),  # and an edit elsewhere
        ("foo(x)", "bar(x)", "b(x)", True),  # the old word deleted, the new one begun
        ("foo(x)", "bar(x)", "boo(x)", True),  # typed over its first letter
        ("foo(x)", "bar(x)", "oo(x)", True),  # its first letter deleted
        ("a\nold line\nb", "a\nb", "a\nld line\nb", True),  # deleting the predicted line
        ("a\nold line\nb", "a\nb", "a\nold\nb", False),  # deleting only part of it
        ("same", "same", "sam", False),  # "no change" is nothing to type toward
    ],
)
def test_typed_toward(before: str, predicted: str, now: str, follows: bool) -> None:
    assert typed_toward(before, predicted, now) is follows


def prompt(region: str, file_before: str = "x = 1\n") -> EditPrompt:
    return EditPrompt("a.py", file_before, region, "\ny = 2\n")


def test_predictions_are_per_account_and_file() -> None:
    predictions = Predictions()
    predictions.remember("account-1", prompt(f"if {CURSOR}total:"), "if subtotal:", 5)
    typed = prompt(f"if s{CURSOR}total:")
    kept = predictions.followed("account-1", typed)
    assert kept is not None and kept.predicted == "if subtotal:" and kept.completion_tokens == 5
    assert predictions.followed("account-2", typed) is None
    assert predictions.followed("account-1", prompt(f"if s{CURSOR}total:", "x = 2\n")) is None


def test_a_no_change_answer_forgets_the_file_and_old_files_go_first() -> None:
    predictions = Predictions(capacity=2)
    predictions.remember("a", prompt(f"if {CURSOR}total:"), "if subtotal:", 5)
    predictions.remember("a", prompt(f"if {CURSOR}total:"), "if total:", 5)
    assert predictions.followed("a", prompt(f"if s{CURSOR}total:")) is None
    for account in ("a", "b", "c"):
        predictions.remember(account, prompt(f"if {CURSOR}total:"), "if subtotal:", 5)
    assert predictions.followed("a", prompt(f"if s{CURSOR}total:")) is None
    assert predictions.followed("c", prompt(f"if s{CURSOR}total:")) is not None


def test_a_region_too_long_to_keep_is_not_remembered() -> None:
    predictions = Predictions()
    tail = "\n" + "x = 1\n" * 3000
    predictions.remember("a", prompt(f"if {CURSOR}total:{tail}"), f"if subtotal:{tail}", 5)
    assert predictions.followed("a", prompt(f"if s{CURSOR}total:{tail}")) is None
