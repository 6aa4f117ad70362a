"""The plain variant against ``river.linear_model.Perceptron`` fed the same events.

River's Perceptron is SGD with lr 1 on the hinge loss with threshold 0 and
intercept_lr 1: it updates when y·(w·x + b) <= 0 (y = 2·label - 1), by
w ← w - x·(-y), b ← b - (-y).  Negating and multiplying by 1 are exact, and
w - (-a) rounds exactly like w + a, so the updates are the same floats.  The
score w·x is summed in the order of x's keys and the bias added last, in
both.  Hence: same scores bit for bit, same mistakes, same final weights,
with exact equality (no tolerance).
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from perceptron_stream.learning import Perceptron, ScaledPerceptron
from river import datasets, linear_model

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


def _run_both(stream):
    ours, theirs = Perceptron(), linear_model.Perceptron()
    for x, y in stream:
        expected = theirs._raw_dot_one(x)  # noqa: SLF001 — river's raw score w·x + b: no public one
        _, score, mistake = ours.step(x, y)
        assert score == expected  # bit for bit
        theirs.learn_one(x, y == 1)
        assert mistake == (y * expected <= 0)
    return ours, theirs


def _same_weights(ours, theirs):
    assert ours.bias == theirs.intercept
    rw = theirs.weights
    assert set(rw) <= set(ours.weights)
    for k, w in ours.weights.items():
        assert w == rw.get(k, 0.0), k


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(finite, min_size=3, max_size=3), st.sampled_from([-1, 1])), max_size=80))
def test_same_as_river_on_generated_streams(events):
    stream = [({f"f{i}": v for i, v in enumerate(x)}, y) for x, y in events]
    ours, theirs = _run_both(stream)
    _same_weights(ours, theirs)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.dictionaries(st.sampled_from("abcdef"), st.integers(-5, 5) | finite, max_size=4),
            st.sampled_from([-1, 1]),
        ),
        max_size=60,
    )
)
def test_same_as_river_with_sparse_dicts_and_ints(events):
    ours, theirs = _run_both(events)
    _same_weights(ours, theirs)


def test_same_as_river_on_phishing():
    """Phishing ships inside river (no download): 1250 events, bool labels, 9 features."""
    stream = [(x, 1 if y else -1) for x, y in datasets.Phishing()]
    ours, theirs = _run_both(stream)
    _same_weights(ours, theirs)
    assert ours.mistakes > 0 and ours.updates == ours.mistakes
    assert ours.seen == 1250


def test_same_predictions_as_river_predict_one():
    """river predicts via sigmoid(score) > 0.5: the same as score > 0 unless |score| < ~1e-16.

    Having learned from bool labels, ours answers bools too, as river's does.
    """
    ours, theirs = Perceptron(), linear_model.Perceptron()
    assert ours.predict_one({"a": 1.0}) == -1  # before any learning: -1/+1
    answers = []
    for x, y in itertools.islice(datasets.Phishing(), 500):
        if ours.seen:
            answers.append(ours.predict_one(x))
            assert answers[-1] is theirs.predict_one(x)
        ours.learn_one(x, y)
        theirs.learn_one(x, y)
    assert {True, False} <= set(answers)


def test_progressive_val_score_on_phishing_with_bool_labels():
    """river's own loop on river's data set as it is (bool labels): the same accuracy as
    river's Perceptron, event for event the same mistakes, not ~37% from -1 vs False."""
    from river import evaluate, metrics, preprocessing

    ours = preprocessing.StandardScaler() | Perceptron()
    theirs = preprocessing.StandardScaler() | linear_model.Perceptron()
    acc_ours = evaluate.progressive_val_score(datasets.Phishing(), ours, metrics.Accuracy())
    acc_theirs = evaluate.progressive_val_score(datasets.Phishing(), theirs, metrics.Accuracy())
    assert acc_ours.get() == acc_theirs.get() > 0.8
    _same_weights(ours["Perceptron"], theirs["Perceptron"])
    hits_ours, hits_theirs = [], []
    ours, theirs = ours.clone(), theirs.clone()
    for x, y in datasets.Phishing():
        hits_ours.append(ours.predict_one(x) == y)
        hits_theirs.append(theirs.predict_one(x) == y)
        ours.learn_one(x, y)
        theirs.learn_one(x, y)
    assert hits_ours == hits_theirs


def test_scaled_perceptron_in_progressive_val_score_with_bool_labels():
    """ScaledPerceptron (the service's standardised model) is river's pipeline there too."""
    from perceptron_stream.learning import ScaledPerceptron
    from river import evaluate, metrics, preprocessing

    acc_ours = evaluate.progressive_val_score(datasets.Phishing(), ScaledPerceptron(), metrics.Accuracy())
    theirs = preprocessing.StandardScaler() | linear_model.Perceptron()
    acc_theirs = evaluate.progressive_val_score(datasets.Phishing(), theirs, metrics.Accuracy())
    assert acc_ours.get() == acc_theirs.get() > 0.8


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.lists(finite, min_size=4, max_size=4), st.sampled_from([-1, 1])), max_size=60))
def test_dense_lists_same_as_river_dicts(events):
    ours, theirs = Perceptron(), linear_model.Perceptron()
    for x, y in events:
        assert ours.step(x, y)[1] == theirs._raw_dot_one(dict(enumerate(x)))  # noqa: SLF001 — river's raw score w·x + b: no public one
        theirs.learn_one(dict(enumerate(x)), y == 1)
    _same_weights(ours, theirs)


def test_progressive_validation_same_as_river_with_a_scaler():
    """In river's own evaluation loop, behind river's scaler: same predictions, same accuracy."""
    from river import evaluate, metrics, preprocessing

    stream = [(x, 1 if y else -1) for x, y in datasets.Phishing()]
    ours = preprocessing.StandardScaler() | Perceptron()
    theirs = preprocessing.StandardScaler() | linear_model.Perceptron()
    acc_ours = evaluate.progressive_val_score(stream, ours, metrics.Accuracy())
    acc_theirs = evaluate.progressive_val_score([(x, y == 1) for x, y in stream], theirs, metrics.Accuracy())
    assert acc_ours.get() == acc_theirs.get()
    _same_weights(ours["Perceptron"], theirs["Perceptron"])


def test_scaled_step_is_rivers_pipeline_learning_during_predict():
    """ScaledPerceptron.step = river's pipeline inside compose.learn_during_predict()."""
    from perceptron_stream.learning import make_learner
    from river import compose, preprocessing

    ours = make_learner(standardize=True)
    theirs = preprocessing.StandardScaler() | linear_model.Perceptron()
    with compose.learn_during_predict():
        for x, y in datasets.Phishing():
            y_pred = 1 if theirs.predict_one(x) else -1
            ours_pred, score, _ = ours.step(x, 1 if y else -1)
            assert ours_pred == y_pred or abs(score) < 1e-12
            theirs.learn_one(x, y)
    assert isinstance(ours, ScaledPerceptron)
    _same_weights(ours.perceptron, theirs["Perceptron"])


GENERAL_CHECKS = [
    "check_repr",
    "check_str",
    "check_tags",
    "check_clone_same_class",
    "check_clone_is_idempotent",
    "check_init_has_default_params_for_tests",
    "check_init_default_params_are_not_mutable",
    "check_doc",
    "check_clone_changes_memory_addresses",
    "check_mutate_can_be_idempotent",
    "check_repr_roundtrips_clone",
    "check_clone_with_new_params_applies",
    "check_get_params_matches_signature",
]
DATASET_CHECKS = [
    "check_learn_one",
    "check_shuffle_features_no_impact",
    "check_emerging_features",
    "check_disappearing_features",
    "check_radically_disappearing_features",
    "check_predict_one_pure",
    "check_predict_one_before_any_learn",
    "check_no_state_aliasing_with_input",
    "check_clone_is_independent",
]


def _models():
    from perceptron_stream.learning import ScaledPerceptron

    return [Perceptron(), Perceptron("averaged"), Perceptron("pocket"), Perceptron("margin", 0.5), ScaledPerceptron()]


@pytest.mark.parametrize("check", GENERAL_CHECKS + DATASET_CHECKS)
def test_river_estimator_checks(check):
    """river's own estimator checks (those that need neither sklearn nor pickle), on Phishing."""
    from river.checks import common

    for model in _models():
        if check in DATASET_CHECKS:
            getattr(common, check)(model.clone(), datasets.Phishing())
        else:
            getattr(common, check)(model.clone())
