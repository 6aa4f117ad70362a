"""What a state read back may hold, and how it is read: the one place that refuses a damaged or forged state.

A learner's state comes back from a checkpoint, a mix record or a model file: JSON someone else may have written.
Every number in it is checked here (finite, within :data:`MAX_STATE_MAGNITUDE`, so no score can become infinite),
every count is an int >= 0, and every refusal is a :class:`StateError` whose ``reason`` the service counts
(``perceptron_rejected_state_total``). The perceptron, the scaler and the hashed model read their states with
:class:`Reader`, so a refusal says the same things in the same words whichever part refused.
"""

from __future__ import annotations

import math
from typing import Any

#: The largest magnitude a weight, bias or sum of a perceptron's state read back (a checkpoint, a mix record, a model
#: file) may have. A float holds 1.8e308, and two weights of 1e308 already sum to inf: a score of null in a
#: prediction. Bounded here, a score over n features of values at most 1e100 (the largest --max-feature-value
#: allows) stays under n·1e250, finite for any n a model can hold. Learning cannot come near it: an update adds at
#: most 1e100 to a weight (the averaged variant's sums at most 2**63 times that), so 1e150 is ~1e31 updates away;
#: only a forged or damaged state holds more. (The scaler's statistics are held to finite numbers only: a variance
#: of values up to 1e100 is up to 1e200.)
MAX_STATE_MAGNITUDE = 1e150


class StateError(ValueError):
    """A state read back that is refused, and why (``reason``, as ``perceptron_rejected_state_total`` counts it):
    ``non_finite`` for a number that is not finite or beyond its bound (:data:`MAX_STATE_MAGNITUDE`: it would make a
    score infinite), ``implausible`` for counts that contradict each other, ``damaged`` for anything else."""

    def __init__(self, message: str, reason: str = "damaged") -> None:
        super().__init__(message)
        self.reason = reason


def state_reason(exc: BaseException) -> str:
    """Why ``exc`` refused a state: a :class:`StateError`'s reason (or any error's that carries one), else damaged.

    >>> state_reason(StateError("x", "non_finite")), state_reason(ValueError("x"))
    ('non_finite', 'damaged')
    """
    return getattr(exc, "reason", "damaged")


def is_state_number(value: Any) -> bool:
    """Whether ``value`` is a number a state may hold: an int or a float, finite, within MAX_STATE_MAGNITUDE.

    >>> [is_state_number(v) for v in (0, -2.5, 1e150, 1e151, float("nan"), True, "1", 10**400)]
    [True, True, True, False, False, False, False, False]
    """
    # the magnitude first: math.isfinite of an int too large for a float is an OverflowError, not False
    return type(value) in (int, float) and abs(value) <= MAX_STATE_MAGNITUDE and math.isfinite(value)


Floats = list[float]  # for Reader, whose method float hides the type in its class


class Reader:
    """Typed reads from a JSON state, each failure a ValueError that says what is wrong."""

    def __init__(self, what: str, state: Any) -> None:
        self.what = what
        if not isinstance(state, dict):
            self.fail(f"expected a JSON object, got {type(state).__name__}")
        self.state = state

    def fail(self, msg: str, reason: str = "damaged") -> None:
        raise StateError(f"invalid {self.what}: {msg}", reason)

    def header(self, kind: str, fmt: int) -> None:
        if self.state.get("kind") != kind:
            self.fail(f"kind is {self.state.get('kind')!r}, expected {kind!r}")
        if self.state.get("format") != fmt:
            self.fail(f"format {self.state.get('format')!r} is not supported (this version reads format {fmt})")

    def get(self, key: str) -> Any:
        if key not in self.state:
            self.fail(f"{key!r} is missing")
        return self.state[key]

    def float(self, key: str) -> float:
        v = self.get(key)
        if not is_state_number(v):
            self.fail(
                f"{key} must be a finite number of magnitude at most {MAX_STATE_MAGNITUDE:g}, got {v!r}",
                "non_finite" if type(v) in (int, float) else "damaged",
            )
        return float(v)

    def floats(self, key: str, n: int) -> Floats:
        v = self.get(key)
        if not isinstance(v, list) or len(v) != n:
            self.fail(f"{key} must be a list of {n} numbers (one per feature)")
        if not all(map(is_state_number, v)):
            numbers = all(type(e) in (int, float) for e in v)  # numbers out of bounds, or not numbers at all
            self.fail(
                f"{key} must hold finite numbers of magnitude at most {MAX_STATE_MAGNITUDE:g} only",
                "non_finite" if numbers else "damaged",
            )
        return [float(e) for e in v]

    def count(self, key: str) -> int:
        v = self.get(key)
        if type(v) is not int or v < 0:
            self.fail(f"{key} must be an integer >= 0, got {v!r}")
        return v
