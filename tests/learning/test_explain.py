"""Reason codes of the learners (``explain``, ``explain_step``): the parts of the score they publish, exact."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from perceptron_stream.learning import HashedPerceptron, Perceptron, ScaledPerceptron
from perceptron_stream.learning.many import in_order_sum
from perceptron_stream.pipeline.models import Frozen

LEARNERS: dict[str, Callable[[], Perceptron | ScaledPerceptron | HashedPerceptron]] = {
    "plain": lambda: Perceptron(),
    "margin": lambda: Perceptron("margin", margin=0.5),
    "pocket": lambda: Perceptron("pocket"),
    "averaged": lambda: Perceptron("averaged"),
    "standardized": lambda: ScaledPerceptron(),
    "standardized-pocket": lambda: ScaledPerceptron("pocket"),
    "standardized-averaged": lambda: ScaledPerceptron("averaged"),
    "hashed": lambda: HashedPerceptron(64),
    "hashed-colliding": lambda: HashedPerceptron(4),
    "hashed-standardized": lambda: HashedPerceptron(16, ScaledPerceptron()),
}


def _events(n: int, named: bool, seed: int = 1):
    rng = random.Random(seed)
    for _ in range(n):
        x = [rng.gauss(0, 3) for _ in range(8)]
        y = 1 if x[0] - 0.5 * x[3] + rng.gauss(0, 0.5) > 0 else -1
        yield ({f"f{i}": v for i, v in enumerate(x)} if named else x), (y if rng.random() < 0.8 else None)


@pytest.mark.parametrize("named", [False, True], ids=["dense", "named"])
@pytest.mark.parametrize("kind", sorted(LEARNERS))
def test_explain_step_steps_as_step_does_and_its_parts_add_up_to_the_published_score(kind, named):
    explained, reference = LEARNERS[kind](), LEARNERS[kind]()
    worst = 0.0
    for x, y in _events(2000, named):
        expected = reference.step(x, y)
        result, parts, bias = explained.explain_step(x, y)
        assert result == expected  # the same step, the same model after it
        total = in_order_sum(c for *_, c in parts) + bias  # left to right from +0.0, the bias last: the score's sum
        magnitude = sum(abs(c) for *_, c in parts) + abs(bias)
        if "averaged" in kind and magnitude:  # the lazy average publishes (w·x + b) − (u·x + u_b)/c: within rounding
            worst = max(worst, abs(total - result[1]) / magnitude)
        else:
            assert total == result[1], (x, parts, bias)
    assert worst < 4e-15
    assert explained.to_state() == reference.to_state()


def test_each_part_is_the_feature_as_the_event_named_it_with_the_predicting_weight():
    model = Perceptron("pocket")
    for x, y in _events(500, named=True):
        model.step(x, y)
    x = {"f3": 2.0, "f0": -1.0, "new": 7.0}
    weights, bias = model.weights, model.bias
    parts, explained_bias = model.explain(x)
    assert [(f, v, w, w * v) for f, v, w, _ in parts] == parts
    assert [(f, v, w) for f, v, w, _ in parts] == [
        ("f3", 2.0, weights["f3"]),
        ("f0", -1.0, weights["f0"]),
        ("new", 7.0, 0.0),
    ]
    assert explained_bias == bias


def test_standardized_values_are_those_the_perceptron_saw():
    model = ScaledPerceptron()
    for x, y in _events(300, named=True):
        model.step(x, y)
    x = {"f0": 1.0, "f1": 2.0}
    mean, var = model.scaler.means["f0"], model.scaler.vars["f0"]
    parts, _ = model.explain(x)
    assert parts[0][1] == pytest.approx((1.0 - mean) / var**0.5)


def test_hashed_parts_are_named_by_the_event_s_features_colliding_names_joined():
    model = HashedPerceptron(1)  # one bucket: every name collides
    model.step({"a": 1.0, "b": 2.0}, 1)
    parts, _ = model.explain({"a": 1.0, "b": 2.0})
    assert [p[0] for p in parts] == ["a + b"]
    roomy = HashedPerceptron(1 << 20)
    roomy.step({"a": 1.0, "b": 2.0}, 1)
    assert sorted(p[0] for p in roomy.explain({"a": 1.0, "b": 2.0})[0]) == ["a", "b"]


def test_a_frozen_model_explains_with_the_weights_it_never_moves():
    model = Perceptron()
    for x, y in _events(200, named=False):
        model.step(x, y)
    frozen = Frozen(model)
    x = [1.0] * 8
    before = model.to_state()
    result, parts, bias = frozen.explain_step(x, 1)
    assert in_order_sum(c for *_, c in parts) + bias == result[1] == model.score_one(x)
    assert model.to_state() == before
