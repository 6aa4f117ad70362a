"""Statistical checks of the tests: seeded, so deterministic, with a tolerance that a changed generator only fails
when it drifts from the promised rate."""

from __future__ import annotations

import math

#: How many binomial standard deviations a count may stray from its expectation (a false alarm ~6e-5 each).
Z = 4.0


def within_binomial(k: int, n: int, p: float) -> bool:
    """Whether ``k`` successes of ``n`` trials are within :data:`Z` standard deviations of the rate ``p``.

    >>> within_binomial(10, 100, 0.1), within_binomial(30, 100, 0.1)
    (True, False)
    """
    return abs(k - n * p) <= Z * math.sqrt(n * p * (1 - p))
