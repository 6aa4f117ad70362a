"""Unit tests of the online perceptron: the rule, the API the service uses, the state."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from perceptron_stream.learning import Perceptron, ScaledPerceptron, learner_from_state, make_learner
from perceptron_stream.learning.perceptron import VARIANTS
from river import base, evaluate, linear_model, metrics, preprocessing


def test_starts_at_zero_and_zero_score_is_a_mistake():
    p = Perceptron()
    r = p.step([3.0, -1.0], -1)
    assert r == (-1, 0.0, True)  # (y_pred, score, mistake): sign(0) is not a label
    assert (p.weights, p.bias, p.updates, p.mistakes) == ({0: -3.0, 1: 1.0}, -1.0, 1, 1)


def test_unlabeled_step_predicts_without_learning():
    p = Perceptron.from_weights([1.0, -1.0], bias=1.0)
    r = p.step([1.0, 3.0], None)
    assert r == (-1, -1.0, None)
    assert (p.seen, p.labeled, p.updates, p.weights) == (1, 0, 0, {0: 1.0, 1: -1.0})


def test_counters_radius_norm():
    p = Perceptron()
    p.step([3.0, 4.0], 1)  # mistake: w = (1; 3, 4)
    p.step([3.0, 4.0], 1)
    p.step([0.0, 0.0], None)
    assert (p.seen, p.labeled, p.mistakes, p.updates) == (3, 2, 1, 1)
    assert p.radius == math.sqrt(26.0)  # ||(1, 3, 4)||
    assert p.weight_norm == math.sqrt(26.0)


def test_dicts_and_lists_share_int_features():
    p = Perceptron()
    p.step({0: 1.0, 1: 2.0}, 1)
    p.step([1.0, 2.0, 5.0], -1)
    p.step({"age": 2.0}, 1)
    p.step([1.0, 1.0, 1.0, 1.0], -1)  # position 3 is "age": falls back to the dict path
    assert list(p.weights) == [0, 1, 2, "age", 3]


@pytest.mark.parametrize("y,expected", [(True, 1), (False, -1), (1, 1), (0, -1), (-1, -1)])
def test_learn_one_labels(y, expected):
    p = Perceptron()
    p.learn_one({"a": 1.0}, y)
    assert p.bias == expected and p.seen == 1 and p.labeled == 1


@pytest.mark.parametrize("y", [2, -2, 0.5, "1", None, float("nan")])
def test_learn_one_rejects_other_labels(y):
    with pytest.raises(ValueError, match="y must be"):
        Perceptron().learn_one({"a": 1.0}, y)


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"variant": "nope"}, "variant"),
        ({"variant": "margin", "margin": -1.0}, "margin"),
        ({"variant": "margin", "margin": math.inf}, "margin"),
        ({"variant": "plain", "margin": 0.5}, "margin"),
    ],
)
def test_bad_params(kwargs, name):
    with pytest.raises(ValueError, match=name):
        Perceptron(**kwargs)


def test_margin_variant_updates_inside_the_margin():
    p = Perceptron("margin", margin=10.0)
    p.step([1.0], 1)  # mistake → w = (1; 1)
    r = p.step([1.0], 1)  # score 2 > 0: correct, but 2 <= 10 → update
    _, _, mistake = r
    assert mistake is False and p.updates == 2 and p.mistakes == 1


def test_averaged_predicts_with_the_average():
    p = Perceptron("averaged")
    p.step([1.0], 1)  # w_1 = (1; 1)
    p.step([-1.0], -1)  # correct with w_1: score -1+1 = 0 → mistake: w_2 = (0; 2)
    # average of w_0, w_1, w_2 = ((0+1+0)/3; (0+1+2)/3)
    assert p.bias == pytest.approx(1 / 3) and p.weights[0] == pytest.approx(1.0)


def test_pocket_keeps_the_longest_run():
    p = Perceptron("pocket")
    stream = [([1.0], 1)] * 5 + [([-1.0], 1)] + [([1.0], -1)]
    for x, y in stream:
        p.step(x, y)
    # w_1 = (1; 1) had a run of 4, then failed twice: the pocket keeps w_1
    assert (p.bias, p.weights) == (1.0, {0: 1.0})
    assert p.updates == 3


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("standardize", [False, True])
def test_state_round_trip_through_json(variant, standardize):
    m = make_learner(variant, 0.25 if variant == "margin" else 0.0, standardize)
    for i in range(50):
        m.step([math.sin(i) * 3, math.cos(i * 1.7), 0.1 * i], 1 if math.sin(i * 0.3) > 0 else -1)
    state = m.to_state()
    back = learner_from_state(json.loads(json.dumps(state)))
    assert type(back) is type(m) and back.to_state() == state
    for i in range(20):  # and it goes on exactly like the original
        x, y = [math.cos(i), i / 7, -1.0], (-1) ** i
        assert back.step(x, y) == m.step(x, y)
    assert back.to_state() == m.to_state()


@pytest.mark.parametrize(
    "mutate,msg",
    [
        (lambda s: s.update(format=2), "format 2"),
        (lambda s: s.update(kind="x"), "kind"),
        (lambda s: s.update(weights=[1.0]), "weights"),
        (lambda s: s.pop("bias"), "bias"),
        (lambda s: s["counters"].update(seen=-1), "seen"),
        (lambda s: s.update(variant="v"), "variant"),
        (lambda s: s.update(features=["a", "a"]), "duplicate"),
        (lambda s: s.update(bias=None), "bias"),
        (lambda s: s.update(weights=[1e308, 1e308]), "weights must hold finite numbers of magnitude at most 1e"),
        (lambda s: s.update(bias=-1e151), "bias must be a finite number of magnitude at most 1e"),
    ],
)
def test_from_state_rejects_corrupt_states(mutate, msg):
    p = Perceptron()
    p.step({"a": 1.0, "b": 2.0}, 1)
    state = json.loads(json.dumps(p.to_state()))
    mutate(state)
    with pytest.raises(ValueError, match=msg):
        learner_from_state(state)


def test_a_state_at_the_magnitude_bound_scores_finite_on_the_largest_values_an_event_may_hold():
    """The bound read-back states are held to keeps every score finite: 1e308 weights summed to inf (a null score).
    1e100: the largest value --max-feature-value lets through."""
    from perceptron_stream.learning.perceptron import MAX_STATE_MAGNITUDE

    p = Perceptron.from_weights(
        {f"f{i}": MAX_STATE_MAGNITUDE * (-1) ** i for i in range(1000)}, bias=MAX_STATE_MAGNITUDE
    )
    back = learner_from_state(json.loads(json.dumps(p.to_state())))
    score = back.step({f"f{i}": 1e100 * (-1) ** i for i in range(1000)}, None)[1]
    assert math.isfinite(score) and score > 1e252
    with pytest.raises(ValueError, match="magnitude at most 1e"):
        Perceptron.from_weights({"a": 1e308})


def test_river_protocol():
    p = Perceptron("averaged")
    assert isinstance(p, base.Classifier)
    p.learn_one({"a": 1.0}, True)
    clone = p.clone()
    assert clone.variant == "averaged" and clone is not p
    assert (clone.seen, clone.weights, clone.predict_one({"a": 1.0})) == (0, {}, -1)  # a fresh model
    assert p.predict_one({"a": 1.0}) is True
    # separable on a: a > 3; river's Perceptron in the same pipeline makes the same mistakes.
    # The first label is True: before any learning ours answers -1 (the label kind is not
    # known yet) where river's answers False, a miss either way only when the label is True.
    stream: list[tuple[dict, bool]] = [({"a": float(i % 7), "b": float(i % 3)}, i % 7 > 3) for i in range(4, 204)]
    model = preprocessing.StandardScaler() | Perceptron()
    acc = evaluate.progressive_val_score(stream, model, metrics.Accuracy())
    river_acc = evaluate.progressive_val_score(
        stream, preprocessing.StandardScaler() | linear_model.Perceptron(), metrics.Accuracy()
    )
    assert acc.get() == river_acc.get() > 0.9
    assert (model["Perceptron"].seen, model["Perceptron"].labeled) == (200, 200)
    # every miss of the metric is a mistake; mistakes also count a score of 0 on a False label
    assert model["Perceptron"].mistakes >= round((1 - acc.get()) * 200) > 0


@pytest.mark.parametrize("y,answer", [(True, True), (False, False), (1, 1), (-1, -1), (0, -1)])
def test_predict_one_answers_in_the_kind_of_label_learned(y, answer):
    p = Perceptron()
    p.learn_one({"a": 1.0}, y)  # score 0: a mistake, so the bias moves to ±1
    assert p.predict_one({"a": 1.0}) == answer and type(p.predict_one({"a": 1.0})) is type(answer)
    y_pred, _, _ = p.step([1.0], None)
    assert type(y_pred) is int and y_pred in (
        -1,
        1,
    )  # step stays -1/+1 whatever learn_one saw (True == 1: check the type)


def test_label_kind_follows_the_last_learn_one_and_survives_a_checkpoint():
    p = Perceptron()
    p.learn_one({"a": 1.0}, True)
    back = learner_from_state(json.loads(json.dumps(p.to_state())))
    assert p.to_state()["labels"] == "bool" and back.predict_one({"a": 1.0}) is True
    p.learn_one({"a": 1.0}, 1)
    assert p.to_state()["labels"] == "-1/+1" and p.predict_one({"a": 1.0}) == 1
    m = make_learner(standardize=True)
    m.learn_one({"a": 1.0}, False)
    m.learn_one({"a": 3.0}, True)
    back = learner_from_state(json.loads(json.dumps(m.to_state())))
    assert back.to_state() == m.to_state() and back.predict_one({"a": 3.0}) is m.predict_one({"a": 3.0}) is True


def test_a_state_without_the_label_kind_still_loads():
    """Checkpoints written before the key existed: -1/+1, as they were."""
    p = Perceptron()
    p.learn_one({"a": 1.0}, True)
    state = p.to_state()
    del state["labels"]
    back = learner_from_state(state)
    assert back.predict_one({"a": 1.0}) == 1 and type(back.predict_one({"a": 1.0})) is int
    assert back.to_state()["labels"] == "-1/+1"


@pytest.mark.parametrize("y", [0, False, 2, -2, 0.5])
def test_step_rejects_a_label_that_would_update(y):
    """Checked where it is free (the update path, before anything changes) and on new
    feature names; averaged and pocket check every label.  0/False always update."""
    for variant in VARIANTS:
        p = Perceptron(variant, 0.5 if variant == "margin" else 0.0)
        p.step([1.0, 2.0], 1)  # w = (1, 2), b = 1
        for x in ([-3.0, 1.0], {0: -3.0, 1: 1.0}, {"a": 5.0}):  # score 0 (list, dict), a new name
            before = p.to_state()
            with pytest.raises(ValueError, match=r"y = -1, \+1 or None"):
                p.step(x, y)
            assert p.to_state() == before, (variant, x)


def test_step_takes_the_labels_it_documents():
    p = Perceptron()
    y: Any  # 1.0 and True too, as step's docstring says, beyond its annotation
    for y in (True, 1, 1.0, -1, None):
        p.step([1.0, 1.0], y)
    assert (p.seen, p.labeled, p.updates, p.bias) == (5, 4, 2, 0.0)


def test_scaled_predict_learn_is_rivers_pipeline():
    ours, pipe = ScaledPerceptron(), preprocessing.StandardScaler() | Perceptron()
    for i in range(300):
        x, y = {"age": 20 + i % 40, "salary": 1000.0 * (i % 13)}, (i % 40) * 1000 > 2 * (i % 13) * 1000
        assert ours.predict_one(x) == pipe.predict_one(x)
        ours.learn_one(x, y)
        pipe.learn_one(x, y)
    assert ours.weights == pipe["Perceptron"].weights and ours.updates == pipe["Perceptron"].updates
