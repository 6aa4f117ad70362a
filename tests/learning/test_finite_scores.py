"""No score is ever infinite or NaN (a null in a prediction), whatever a state read back within its bounds holds and
whatever events within --max-feature-value's largest bound (1e100) come: the bounds of a state read back
(perceptron.MAX_STATE_MAGNITUDE, scaled.MAX_MEAN and MAX_VARIANCE) and of a standardised value (scaled.MAX_SCALED)
make every score finite by construction; these tests try to break that with hostile states and events."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perceptron_stream.learning import VARIANTS, ScaledPerceptron, learner_from_state, make_learner
from perceptron_stream.learning.perceptron import MAX_STATE_MAGNITUDE, StateError
from perceptron_stream.learning.scaled import MAX_MEAN, MAX_SCALED, MAX_VARIANCE
from perceptron_stream.pipeline.models import Frozen

LARGEST_VALUE = 1e100  # the largest --max-feature-value (service/config.py)
NAMES = ["a", "b", "c", "d"]

_edges = st.sampled_from([0.0, -0.0, 5e-324, 1e-320, 1e-160, 1.0, 1e50, 1e100])
_values = (_edges | st.floats(-LARGEST_VALUE, LARGEST_VALUE)).flatmap(lambda v: st.sampled_from([v, -v]))
_weights = st.sampled_from([0.0, 1.0, MAX_STATE_MAGNITUDE, -MAX_STATE_MAGNITUDE]) | st.floats(
    -MAX_STATE_MAGNITUDE, MAX_STATE_MAGNITUDE
)
_variances = st.sampled_from([0.0, 5e-324, 1e-320, 1e-300, 1.0, MAX_VARIANCE]) | st.floats(0.0, MAX_VARIANCE)
_means = st.sampled_from([0.0, MAX_MEAN, -MAX_MEAN, 1e-300]) | st.floats(-MAX_MEAN, MAX_MEAN)
_counts = st.sampled_from([1, 2, 2**63 - 1]) | st.integers(0, 2**63 - 1)
_events = st.lists(
    st.tuples(st.fixed_dictionaries({}, optional={n: _values for n in NAMES}), st.sampled_from([1, -1, None])),
    min_size=1,
    max_size=12,
)


@st.composite
def hostile_states(draw):
    """A learner's state as a forger within the read-back bounds would write it: every number at or inside a bound."""
    variant = draw(st.sampled_from(VARIANTS))
    standardize = draw(st.booleans())
    learner = make_learner(variant, 0.5 if variant == "margin" else 0.0, standardize)
    learner.step(dict.fromkeys(NAMES, 1.0), 1)  # every name registered
    state = json.loads(json.dumps(learner.to_state()))
    p = state["perceptron"] if standardize else state
    n = len(p["features"])
    p["weights"] = draw(st.lists(_weights, min_size=n, max_size=n))
    p["bias"] = draw(_weights)
    if variant == "averaged":
        p["averaged"] = {
            "sum": draw(st.lists(_weights, min_size=n, max_size=n)),
            "bias_sum": draw(_weights),
            "c": draw(st.integers(1, 2**63 - 1)),
        }
    if variant == "pocket":
        p["pocket"].update(weights=draw(st.lists(_weights, min_size=n, max_size=n)), bias=draw(_weights))
        p["pocket"]["same_as_running"] = False
    if standardize:
        sc = state["scaler"]
        sc["counts"] = [[k, draw(_counts)] for k, _ in sc["counts"]]
        sc["means"] = [[k, draw(_means)] for k, _ in sc["means"]]
        sc["vars"] = [[k, draw(_variances)] for k, _ in sc["vars"]]
    return state


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hostile_states(), _events, st.booleans())
def test_no_score_is_ever_non_finite(state, events, batch):
    """Predicting and learning (one at a time and in a batch), scoring frozen (--learning off) and relabeling a
    delayed label: every score finite, and the state it leaves still reads back (finite)."""
    learner = learner_from_state(state)
    frozen = Frozen(learner_from_state(state))
    for x, _ in events:
        assert math.isfinite(frozen.step(x, None)[1])
    if batch and learner.can_step_many([x for x, _ in events], [y for _, y in events]):
        scores = list(learner.step_many([x for x, _ in events], [y for _, y in events]).score)
    else:
        scores = [learner.step(x, y)[1] for x, y in events]
    assert all(math.isfinite(s) for s in scores), scores
    for x, y in events:
        assert math.isfinite(learner.relabel(x, y if y is not None else 1, True)[1])
    assert all(math.isfinite(v) for v in learner.weights.values()) and math.isfinite(learner.bias)


def test_a_tiny_variance_no_longer_blows_a_standardised_value_up():
    """The case the property found first: values 0 and 1e-160 leave a variance of 2.5e-321 (not 0), and a frozen
    scaler standardised a later 1 to 2e160: with a weight of 1e150 (within the read-back bound) the score was inf."""
    learner = make_learner("plain", standardize=True)
    learner.step({"a": 0.0}, 1)
    learner.step({"a": 1e-160}, -1)
    state = learner.to_state()
    assert 0.0 < state["scaler"]["vars"][0][1] < 1e-300
    state["perceptron"]["weights"] = [MAX_STATE_MAGNITUDE]
    back = learner_from_state(state)
    assert back.score_one({"a": 1.0}) == MAX_STATE_MAGNITUDE * MAX_SCALED + back.bias
    assert math.isfinite(Frozen(back).step({"a": 1.0}, None)[1])


@pytest.mark.parametrize(
    ("where", "value"),
    [("means", 1e200), ("means", -1e121), ("vars", 1e300), ("counts", 2**63), ("counts", 10**400)],
    ids=["mean 1e200", "mean -1e121", "var 1e300", "count 2**63", "count 10**400"],
)
def test_a_scaler_state_beyond_its_bounds_is_refused_as_non_finite(where, value):
    """A mean of 1e200 read back used to pass (finite), and a mix pooling it squared it: OverflowError."""
    learner = make_learner("plain", standardize=True)
    learner.step({"a": 1.0}, 1)
    state = learner.to_state()
    state["scaler"][where][0][1] = value
    with pytest.raises(StateError, match=r"must be below 2\*\*63|finite number") as refused:
        learner_from_state(state)
    assert refused.value.reason == "non_finite"


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        (lambda s: s.update(weights=[1e151]), "non_finite"),
        (lambda s: s.update(bias=-1e308), "non_finite"),
        (lambda s: s.update(weights=[10**400]), "non_finite"),
        (lambda s: s.update(weights=["1"]), "damaged"),
        (lambda s: s.update(bias=None), "damaged"),
        (lambda s: s["counters"].update(mistakes=2**63 - 1), "implausible"),
        (lambda s: s.update(kind="svm"), "damaged"),
    ],
)
def test_a_refused_state_says_why(mutate, reason):
    """The reason perceptron_rejected_state_total counts a refused state under."""
    from perceptron_stream.learning.perceptron import state_reason

    learner = make_learner("plain")
    learner.step({"a": 1.0}, 1)
    state = learner.to_state()
    mutate(state)
    with pytest.raises(ValueError) as refused:
        learner_from_state(state)
    assert state_reason(refused.value) == reason


def test_a_pooled_mean_on_a_feature_never_seen_leaves_no_negative_variance():
    """A mix pools the others' moments into a feature this replica never saw (count 0, mean not 0). Welford's first
    update then rounds: a mean of 1e17 and a value of 1 left a variance of -1e17, whose square root river takes as a
    complex number: the step was a TypeError. The variance is now held at 0 or above."""
    learner = make_learner("plain", standardize=True)
    learner.step({"a": 1.0, "b": 1.0}, 1)
    state = learner.to_state()
    state["scaler"]["counts"][1][1], state["scaler"]["means"][1][1] = 0, 1e17
    back = learner_from_state(state)
    assert isinstance(back, ScaledPerceptron)
    assert math.isfinite(back.step({"a": 1.0, "b": 1.0}, 1)[1])
    assert all(v >= 0.0 for v in back.scaler.vars.values())
