"""Batch forms of the perceptron (seeds 000-004): PLA, pocket, margins, R and the bound.

Why a batch module beside the online one: ``perceptron-stream train`` runs
these over a file, and they are where the seeds' theory is checkable: on a
separable D, cyclic PLA halts after at most (R/γ)² updates; on a
non-separable D it never halts, and pocket keeps the best weights met.

The score is summed in feature order and the bias added last, like
:class:`perceptron_stream.learning.Perceptron`, so one pass of cyclic PLA makes the
very same floats as streaming D through ``Perceptron().step``.

Seed 003, cyclic PLA from 0:

>>> X = [[1, 2], [2, 4], [3, 4], [2, 1], [4, 2]]
>>> Y = [1, 1, 1, -1, -1]
>>> fit = pla(X, Y)
>>> fit.weights, fit.bias, fit.updates, fit.passes, fit.converged
([-1.0, 1.0], 0.0, 2, 2, True)
>>> margin(fit.weights, fit.bias, X, Y) == 1 / math.sqrt(2)
True
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from perceptron_stream.learning.labels import is_mistake, to_label

ALGORITHMS = ("pla", "pocket")
ORDERS = ("cyclic", "random")


class Fit(NamedTuple):
    weights: list[float]
    bias: float
    updates: int  # updates of the running weights
    passes: int  # passes over D started
    converged: bool  # the weights returned make no mistake on D


def score(w: Sequence[float], b: float, x: Sequence[float]) -> float:
    """w·x + b, summed in order then the bias (the online perceptron's rounding)."""
    s = 0.0
    for wi, xi in zip(w, x):
        s += wi * xi
    return s + b


def mistakes(w: Sequence[float], b: float, X: Sequence[Sequence[float]], y: Sequence[int]) -> int:
    """How many points of D the weights get wrong; a score of 0 is wrong.

    >>> mistakes([1.0, -1.0], 1.0, [[1, 3], [2.5, 1.5], [-1.5, 1.5]], [1, 1, -1])
    1
    """
    return sum(1 for x, yi in zip(X, y) if is_mistake(yi, score(w, b, x)))


def point_margins(w: Sequence[float], b: float, X: Sequence[Sequence[float]], y: Sequence[int]) -> list[float]:
    """Signed distances y_i (w·x_i + b) / ||w|| of the points to the hyperplane (seed 002).

    >>> [round(g, 12) for g in point_margins([1, -1], 1, [[1, 3], [2.5, 1.5], [-1.5, 1.5]], [1, 1, -1])]
    [-0.707106781187, 1.414213562373, 1.414213562373]
    """
    norm = math.sqrt(sum(wi * wi for wi in w))
    if norm == 0:
        raise ValueError("w is 0: there is no hyperplane, the margin is undefined")
    return [yi * score(w, b, x) / norm for x, yi in zip(X, y)]


def margin(w: Sequence[float], b: float, X: Sequence[Sequence[float]], y: Sequence[int]) -> float:
    """The data set's margin under (w, b): min_i y_i (w·x_i + b)/||w||; < 0 when a point is wrong."""
    return min(point_margins(w, b, X, y))


def augmented_margin(w: Sequence[float], b: float, X: Sequence[Sequence[float]], y: Sequence[int]) -> float:
    """min_i y_i θ·x'_i / ||θ|| with θ = (b, w), x' = (1, x): the γ of the (R/γ)² theorem.

    The proof of the bound works in the space of x' (the bias is a weight),
    so γ must be measured there too, with ||θ|| including b; it is never
    larger than :func:`margin`.
    """
    norm = math.sqrt(b * b + sum(wi * wi for wi in w))
    if norm == 0:
        raise ValueError("w and b are 0: the margin is undefined")
    return min(yi * score(w, b, x) for x, yi in zip(X, y)) / norm


def radius(X: Sequence[Sequence[float]], intercept: bool = True) -> float:
    """R = max_i ||x'_i||, x' = (1, x) with an intercept (the constant feature counts).

    >>> radius([[3, 4], [1, 0]]), radius([[3, 4]], intercept=False)
    (5.0990195135927845, 5.0)
    """
    c = 1.0 if intercept else 0.0
    return max(math.sqrt(c + sum(xi * xi for xi in x)) for x in X)


def mistake_bound(R: float, gamma: float) -> float | None:
    """(R/γ)², the most updates PLA can make on data with margin γ > 0 (None if γ <= 0).

    >>> mistake_bound(2.0, 0.5)
    16.0
    """
    return (R / gamma) ** 2 if gamma > 0 else None


def _orders(n: int, order: str, seed: int | None, max_passes: int) -> Iterator[list[int]]:
    """The visiting order of each pass: 0..n-1, or a fresh seeded shuffle per pass."""
    rng = random.Random(seed)
    idx = list(range(n))
    for _ in range(max_passes):
        if order == "random":
            rng.shuffle(idx)
        yield idx


def pla(
    X: Sequence[Sequence[float]],
    y: Sequence[int],
    *,
    order: str = "cyclic",
    seed: int | None = None,
    max_passes: int = 100,
    intercept: bool = True,
    weights: Sequence[float] | None = None,
    bias: float = 0.0,
) -> Fit:
    """PLA: pass over D, update on each mistake; halt after a full pass with none, or τ passes.

    Without an intercept the hyperplane must go through the origin (seed 002's
    offset example cannot be separated so):

    >>> X, Y = [[1], [2], [3], [4]], [1, 1, -1, -1]
    >>> pla(X, Y).converged, pla(X, Y, intercept=False, max_passes=50).converged
    (True, False)
    """
    w = [float(v) for v in weights] if weights is not None else [0.0] * len(X[0])
    b = float(bias)
    updates = 0
    passes = 0
    for passes, idx in enumerate(_orders(len(X), order, seed, max_passes), 1):
        clean = True
        for i in idx:
            x, yi = X[i], y[i]
            if is_mistake(yi, score(w, b, x)):
                w = [wi + yi * xi for wi, xi in zip(w, x)]
                if intercept:
                    b += yi
                updates += 1
                clean = False
        if clean:
            return Fit(w, b, updates, passes, True)
    return Fit(w, b, updates, passes, False)


def pocket(
    X: Sequence[Sequence[float]],
    y: Sequence[int],
    *,
    order: str = "cyclic",
    seed: int | None = None,
    max_passes: int = 100,
    intercept: bool = True,
) -> Fit:
    """Pocket: run PLA, keep in the pocket the weights with the fewest mistakes on all of D.

    Each update costs a pass over D to count the new weights' mistakes.  Stops
    early when the running weights make no mistake on D.

    >>> X, Y = [[1, 1], [2, 2], [3, 1], [4, 0], [1.5, 2.5]], [1, 1, -1, -1, -1]  # not separable
    >>> best, last = pocket(X, Y, max_passes=5), pla(X, Y, max_passes=5)
    >>> best.converged, mistakes(best.weights, best.bias, X, Y), mistakes(last.weights, last.bias, X, Y)
    (False, 1, 2)
    """
    w = [0.0] * len(X[0])
    b = 0.0
    best = (list(w), b, mistakes(w, b, X, y))
    updates = 0
    passes = 0
    for passes, idx in enumerate(_orders(len(X), order, seed, max_passes), 1):
        for i in idx:
            x, yi = X[i], y[i]
            if is_mistake(yi, score(w, b, x)):
                w = [wi + yi * xi for wi, xi in zip(w, x)]
                if intercept:
                    b += yi
                updates += 1
                m = mistakes(w, b, X, y)
                if m < best[2]:
                    best = (w, b, m)
                    if m == 0:
                        return Fit(list(w), b, updates, passes, True)
    return Fit(list(best[0]), best[1], updates, passes, best[2] == 0)


def _check(X: Any, y: Any, feature_names: Any, algorithm: Any, order: Any, max_passes: Any) -> tuple[list, list]:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}; got {algorithm!r}")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}; got {order!r}")
    if type(max_passes) is not int or max_passes < 1:
        raise ValueError(f"max_passes must be an integer >= 1, got {max_passes!r}")
    if not X or len(X) != len(y):
        raise ValueError(f"X and y must be non-empty and of the same length (got {len(X)} and {len(y)})")
    d = len(X[0])
    rows = []
    for n, x in enumerate(X):
        if len(x) != d:
            raise ValueError(f"X[{n}] has {len(x)} features, X[0] has {d}")
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in x):
            raise ValueError(f"X[{n}] must hold finite numbers only")
        rows.append([float(v) for v in x])
    labels = [to_label(v) for v in y]
    if feature_names is not None and len(feature_names) != d:
        raise ValueError(f"feature_names has {len(feature_names)} names for {d} features")
    return rows, labels


def train_report(
    X: Sequence[Sequence[float]],
    y: Sequence[int],
    *,
    algorithm: str = "pla",
    order: str = "cyclic",
    seed: int | None = None,
    max_passes: int = 100,
    feature_names: list[str] | None = None,
    intercept: bool = True,
) -> dict:
    """Train in batch and describe the result as a JSON-able dict (``perceptron-stream train``).

    ``margin`` is the geometric margin min_i y_i (w·x_i + b)/||w|| (None when
    w = 0: there is no hyperplane); ``margin_augmented`` is γ, the margin of
    the result in the space of x' = (1, x), min_i y_i (w·x_i + b)/||(b, w)||
    (None only when w = 0 and b = 0).  The two are computed separately, so a
    result that separates D with its bias alone (w = 0, b ≠ 0) still gets a
    γ and a bound.  ``bound`` is (R/γ)² with R = max ||x'||: as the result
    separates D, the theorem bounds the updates of any PLA run on D by it.
    None when the result does not separate D.  Labels: -1/+1 (or 0/1, bool).

    >>> r = train_report([[1], [2], [3], [4]], [1, 1, -1, -1])
    >>> r["weights"], r["bias"], r["converged"], r["training_mistakes"], r["margin"]
    ([-3.0], 7.0, True, 0, 0.3333333333333333)
    >>> r["updates"] <= r["bound"]
    True
    >>> r = train_report([[0], [0]], [1, 1])  # separated by the bias alone
    >>> r["weights"], r["bias"], r["margin"], r["margin_augmented"], r["radius"], r["bound"]
    ([0.0], 1.0, None, 1.0, 1.0, 1.0)
    """
    X, y = _check(X, y, feature_names, algorithm, order, max_passes)
    run = pla if algorithm == "pla" else pocket
    fit = run(X, y, order=order, seed=seed, max_passes=max_passes, intercept=intercept)
    wrong = mistakes(fit.weights, fit.bias, X, y)
    try:
        geo = margin(fit.weights, fit.bias, X, y)
    except ValueError:  # w = 0: no hyperplane, no geometric margin
        geo = None
    try:
        aug = augmented_margin(fit.weights, fit.bias, X, y)
    except ValueError:  # w = 0 and b = 0
        aug = None
    R = radius(X, intercept)
    report: dict[str, Any] = {
        "algorithm": algorithm,
        "order": order,
        "seed": seed,
        "max_passes": max_passes,
        "intercept": intercept,
        "n": len(X),
        "dimension": len(X[0]),
        "weights": fit.weights,
        "bias": fit.bias,
        "updates": fit.updates,
        "passes": fit.passes,
        "converged": fit.converged,
        "training_mistakes": wrong,
        "margin": geo,
        "margin_augmented": aug,
        "radius": R,
        "bound": mistake_bound(R, aug) if wrong == 0 and aug is not None else None,
    }
    if feature_names is not None:
        report["feature_names"] = list(feature_names)
        report["weights_by_name"] = dict(zip(feature_names, fit.weights))
    return report
