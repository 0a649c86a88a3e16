"""Whether the user is typing the edit last predicted for a region.

While a user types the prediction an editor showed, each keystroke sends another request whose
region is a step closer to the predicted one. Zed keeps showing the prediction client-side
while that holds; the service answers those requests with the same prediction, as the FIM
service replays a suggestion being typed (docs/next_edit.md), instead of running the model.
"""

from __future__ import annotations

from serve_app.sequences import common_prefix_len


def typed_toward(before: str, predicted: str, now: str) -> bool:
    """Whether region ``now`` is region ``before`` with part of the edit ``before`` ->
    ``predicted`` made, and not all of it.

    The edit is the span where ``before`` and ``predicted`` differ (their common beginning and
    end cut off): ``old`` there in ``before``, ``new`` in ``predicted``. ``now`` keeps the
    beginning and end, and between them has a beginning of ``new`` followed by an end of
    ``old``: the user typed the first characters of ``new``, deleted the first of ``old``, or
    both; or, where the edit only deletes, a beginning of ``old`` (deleted from its end). Any
    other change (a character the prediction lacks, an edit elsewhere) is not.
    """
    if predicted == before or now in (before, predicted):
        return False
    head = common_prefix_len(before, predicted)
    tail = _common_suffix_len(before[head:], predicted[head:])
    if len(now) < head + tail or now[:head] != before[:head]:
        return False
    if tail and now[-tail:] != before[-tail:]:
        return False
    old = before[head : len(before) - tail]
    new = predicted[head : len(predicted) - tail]
    middle = now[head : len(now) - tail]
    if not new and old.startswith(middle):
        return True
    # ``middle`` is new[:k] + an end of old for some k <= typed exactly when all but its
    # longest common end with ``old`` fits within the beginning of ``new`` typed.
    typed = common_prefix_len(middle, new)
    return len(middle) - _common_suffix_len(middle, old) <= typed


def _common_suffix_len(a: str, b: str) -> int:
    return common_prefix_len(a[::-1], b[::-1])
