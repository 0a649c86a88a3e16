"""How bench/next_edit.py scores one next-edit answer against the expected edit."""

from __future__ import annotations

from collections import Counter


def normalized(text: str) -> str:
    """Trailing whitespace trimmed: of every line, and blank lines at the end."""
    return "\n".join(line.rstrip() for line in text.split("\n")).rstrip("\n")


def _ngrams(text: str, n: int) -> Counter:
    return Counter(text[i : i + n] for i in range(len(text) - n + 1))


def _delta(after: Counter, before: Counter) -> Counter:
    """The n-grams an edit added, and (marked with a leading "-") those it removed."""
    delta: Counter = Counter()
    for gram in set(after) | set(before):
        change = after[gram] - before[gram]
        if change:
            delta[gram if change > 0 else "-" + gram] = abs(change)
    return delta


def delta_chrf(original: str, expected: str, actual: str, order: int = 6, beta: float = 2.0):
    """Zed's delta chrF (0-100): chrF between the edit expected and the edit made, each as
    the character n-grams it added or removed (whitespace ignored). An unchanged answer to a
    real edit scores 0; the expected edit 100."""
    texts = ["".join(text.split()) for text in (original, expected, actual)]
    if texts[0] == texts[1] == texts[2]:
        return 100.0
    precision = recall = 0.0
    for n in range(1, order + 1):
        before, want, got = (_ngrams(text, n) for text in texts)
        want, got = _delta(want, before), _delta(got, before)
        if not want and not got:
            precision, recall = precision + 1, recall + 1
            continue
        hits = sum((want & got).values())
        precision += hits / sum(got.values()) if got else 0.0
        recall += hits / sum(want.values()) if want else 0.0
    precision, recall = precision / order, recall / order
    if precision + recall == 0:
        return 0.0
    return 100 * (1 + beta**2) * precision * recall / (beta**2 * precision + recall)


def _changed_lines(diff: str, marker: str) -> set[str]:
    return {
        line[1:].strip()
        for line in diff.split("\n")
        if line.startswith(marker) and not line.startswith(marker * 3) and line[1:].strip()
    }


def reverses(region: str, expected: str, answer: str, last_diff: str) -> bool:
    """The answer undoes part of the newest diff: it brings back a line that diff removed, or
    takes out a line that diff added (and the expected edit keeps)."""
    region_lines = {line.strip() for line in region.split("\n")}
    answer_lines = {line.strip() for line in answer.split("\n")}
    expected_lines = {line.strip() for line in expected.split("\n")}
    removed, added = _changed_lines(last_diff, "-"), _changed_lines(last_diff, "+")
    back = (removed - region_lines - expected_lines) & answer_lines
    gone = (added & region_lines & expected_lines) - answer_lines
    return bool(back or gone)


def drops_kept_line(region: str, expected: str, answer: str) -> bool:
    """The answer lacks a line of the region that the expected edit keeps (blank lines and
    indentation aside, counted with repeats): what a user who takes it loses without asking."""

    def code(text: str) -> Counter:
        return Counter(line.strip() for line in text.split("\n") if line.strip())

    kept = code(region) & code(expected)
    return bool(kept - code(answer))
