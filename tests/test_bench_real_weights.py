"""bench/real_weights.py: where the GPU's answer first leaves the CPU's."""

from __future__ import annotations

from bench.real_weights import divergence


def test_divergence_is_the_first_token_that_differs() -> None:
    assert divergence([1, 2, 3], [1, 2, 3]) is None
    assert divergence([1, 2, 3], [1, 5, 3]) == 1
    assert divergence([1, 2], [1, 2, 3]) == 2
