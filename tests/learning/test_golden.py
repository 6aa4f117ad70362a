"""The worked examples of the seeds (the textbook notes the learning rule comes from), reproduced exactly."""

from __future__ import annotations

import math

import pytest
from perceptron_stream.learning import Perceptron, learner_from_state
from perceptron_stream.learning.batch import margin, mistakes, pla, pocket, point_margins, train_report

# seed 003
D3_X = [[1, 2], [2, 4], [3, 4], [2, 1], [4, 2]]
D3_Y = [1, 1, 1, -1, -1]

# seed 002
THETA, THETA0 = [1.0, -1.0], 1.0
D2_X: list[list[float]] = [[1, 3], [2.5, 1.5], [-1.5, 1.5]]
D2_Y = [1, 1, -1]

# seed 002, the offset example
OFF_X = [[1], [2], [3], [4]]
OFF_Y = [1, 1, -1, -1]


def within_ulp(a: float, b: float) -> bool:
    """Equal up to the last bit: -1/√2 and -√2/2 differ in their last bit as floats."""
    return abs(a - b) <= math.ulp(b)


def test_seed003_cyclic_pla():
    fit = pla(D3_X, D3_Y, order="cyclic")
    assert (fit.bias, fit.weights, fit.updates) == (0.0, [-1.0, 1.0], 2)
    assert fit.converged and fit.passes == 2  # the 2nd pass makes no mistake


def test_seed003_online_perceptron_cycling_over_d():
    p = Perceptron()
    mistakes_per_pass = []
    for _ in range(3):
        mistakes_per_pass.append(sum(mistake is True for _, _, mistake in (p.step(x, y) for x, y in zip(D3_X, D3_Y))))
    assert mistakes_per_pass == [2, 0, 0]
    assert (p.bias, p.weights, p.updates) == (0.0, {0: -1.0, 1: 1.0}, 2)


def test_seed003_trace():
    """w(1) = (1, 1, 2) after the first point, w(2) = (0, -1, 1) after (2, 1, -1)."""
    p = Perceptron()
    trace = []
    for x, y in zip(D3_X, D3_Y):
        _, _, mistake = p.step(x, y)
        if mistake:
            trace.append((p.bias, p.weights[0], p.weights[1]))
    assert trace == [(1.0, 1.0, 2.0), (0.0, -1.0, 1.0)]


def test_seed003_report():
    r = train_report(D3_X, D3_Y, feature_names=["x1", "x2"])
    assert r["weights_by_name"] == {"x1": -1.0, "x2": 1.0} and r["bias"] == 0.0
    assert r["updates"] == 2 and r["converged"] and r["training_mistakes"] == 0
    assert within_ulp(r["margin"], 1 / math.sqrt(2))
    assert r["radius"] == math.sqrt(26)  # (1, 3, 4)
    assert r["bound"] == pytest.approx(52.0) and r["updates"] <= r["bound"]


@pytest.mark.parametrize("algorithm", ["pla", "pocket"])
def test_report_when_the_bias_alone_separates(algorithm):
    """w = 0, b = 1 separates D: no geometric margin (no hyperplane), but γ in the space of
    x' = (1, x) is 1/||(1, 0)|| = 1, so the bound is R² = 1 (it was dropped with the margin)."""
    r = train_report([[0.0], [0.0]], [1, 1], algorithm=algorithm)
    assert (r["weights"], r["bias"], r["updates"], r["training_mistakes"]) == ([0.0], 1.0, 1, 0)
    assert r["margin"] is None and r["margin_augmented"] == 1.0
    assert r["radius"] == 1.0 and r["bound"] == 1.0 and r["updates"] <= r["bound"]


def test_report_margins_are_computed_separately():
    """The offset example: b ≠ 0, so the bound uses γ with ||(b, w)||, not the geometric margin."""
    r = train_report(OFF_X, OFF_Y)
    assert (r["weights"], r["bias"]) == ([-3.0], 7.0)
    assert r["margin"] == 1 / 3 and r["margin_augmented"] == 1 / math.sqrt(58)
    assert r["bound"] == pytest.approx(r["radius"] ** 2 * 58) and r["radius"] == math.sqrt(17)


def test_seed002_one_update_from_given_weights():
    p = Perceptron.from_weights(THETA, bias=THETA0)
    r = p.step([1.0, 3.0], 1)
    _, score, mistake = r
    assert mistake and score == -1.0  # y(θ·x + θ0) = -1
    assert (p.weights, p.bias, p.updates) == ({0: 2.0, 1: 2.0}, 2.0, 1)


def test_seed002_from_a_state():
    state = {
        "kind": "perceptron",
        "format": 1,
        "variant": "plain",
        "margin": 0.0,
        "features": [0, 1],
        "weights": THETA,
        "bias": THETA0,
        "max_norm": 0.0,
        "counters": {"seen": 0, "labeled": 0, "mistakes": 0, "updates": 0},
    }
    p = learner_from_state(state)
    _, _, mistake = p.step([1.0, 3.0], 1)
    assert mistake
    assert (p.weights, p.bias) == ({0: 2.0, 1: 2.0}, 2.0)


def test_seed002_pla_update_from_given_weights():
    fit = pla([[1, 3]], [1], weights=THETA, bias=THETA0, max_passes=1)
    assert (fit.weights, fit.bias, fit.updates) == ([2.0, 2.0], 2.0, 1)


def test_seed002_margins():
    got = point_margins(THETA, THETA0, D2_X, D2_Y)
    for g, want in zip(got, [-math.sqrt(2) / 2, math.sqrt(2), math.sqrt(2)]):
        assert within_ulp(g, want)
    assert within_ulp(margin(THETA, THETA0, D2_X, D2_Y), -math.sqrt(2) / 2)
    assert mistakes(THETA, THETA0, D2_X, D2_Y) == 1


def test_seed002_offset_separable_with_a_bias():
    assert mistakes([-1.0], 2.5, OFF_X, OFF_Y) == 0
    assert margin([-1.0], 2.5, OFF_X, OFF_Y) == 0.5
    fit = pla(OFF_X, OFF_Y)
    assert fit.converged and mistakes(fit.weights, fit.bias, OFF_X, OFF_Y) == 0
    p = Perceptron()  # the online perceptron also ends up separating it
    for _ in range(20):
        for x, y in zip(OFF_X, OFF_Y):
            p.step(x, y)
    assert all(p.predict_one({0: x[0]}) == y for x, y in zip(OFF_X, OFF_Y))


@pytest.mark.parametrize("w", [-100.0, -2.5, -1.0, -1e-9, 1e-9, 0.5, 1.0, 3.0, 1e6])
def test_seed002_offset_not_separable_through_the_origin(w):
    """With b = 0, y·w·x has the sign of w for (1, +1) and of -w for (3, -1): one is wrong."""
    assert margin([w], 0.0, OFF_X, OFF_Y) < 0
    assert mistakes([w], 0.0, OFF_X, OFF_Y) >= 2


def test_seed002_offset_pla_without_intercept_never_converges():
    fit = pla(OFF_X, OFF_Y, intercept=False, max_passes=1000)
    assert not fit.converged and fit.bias == 0.0 and fit.passes == 1000
    r = train_report(OFF_X, OFF_Y, intercept=False, max_passes=50)
    assert not r["converged"] and r["training_mistakes"] > 0 and r["margin"] < 0 and r["bound"] is None
    best = pocket(OFF_X, OFF_Y, intercept=False, max_passes=50)
    assert mistakes(best.weights, 0.0, OFF_X, OFF_Y) == 2  # the best a line through 0 can do
