"""A bounded model (issue 12): unlabeled events add no features, a cap on the features, feature hashing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from perceptron_stream.learning import (
    VARIANTS,
    HashedPerceptron,
    Perceptron,
    ScaledPerceptron,
    learner_from_state,
    make_learner,
)

from tests.support import ROOT

MARGIN = {"margin": 0.5}


def _learner(variant: str, standardize: bool = False, max_features: int | None = None, hash_features: int = 0):
    return make_learner(variant, MARGIN.get(variant, 0.0), standardize, max_features, hash_features)


def _features(m) -> list:
    """The feature names in the model's state (the perceptron's, wherever it sits)."""
    state = m.to_state()
    while "perceptron" in state or "model" in state:
        state = state.get("perceptron") or state["model"]
    return state["features"]


def _scaler_names(m) -> list | None:
    state = m.to_state()
    return [k for k, _ in state["scaler"]["counts"]] if "scaler" in state else None


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("standardize", [False, True])
def test_unlabeled_events_add_no_feature_and_score_as_predict_one(variant, standardize):
    m = _learner(variant, standardize)
    for x, y in [({"a": 1.0, "b": -2.0}, 1), ([0.5, 1.5], -1), ({"a": 3.0, "b": 1.0}, -1)]:
        m.step(x, y)
    features, scaler = _features(m), _scaler_names(m)
    for x in ({"a": 1.0, "new": 5.0, "other": -1.0}, {"only-new": 2.0}, [1.0, 2.0, 3.0, 4.0], {7: 1.0, "a": 2.0}):
        expected = m.predict_one(x)
        y_pred, _, mistake = m.step(x, None)
        assert mistake is None and y_pred == expected, (variant, x)
        assert _features(m) == features and _scaler_names(m) == scaler, (variant, x)
    assert m.seen == 7 and m.labeled == 3


@pytest.mark.parametrize("variant", VARIANTS)
def test_unlabeled_scores_leave_unknown_features_out(variant):
    """The score of an unlabeled event is the score of its known features: the others weigh 0."""
    m = _learner(variant)
    for x, y in [([1.0, 2.0], -1), ([2.0, -1.0], 1), ([0.5, 0.5], -1)]:
        m.step(x, y)
    assert m.step([1.0, -2.0, 7.0, 9.0], None)[1] == m.step([1.0, -2.0], None)[1]
    assert m.step({0: 1.0, 1: -2.0, "z": 3.0}, None)[1] == m.step({0: 1.0, 1: -2.0}, None)[1]
    assert _features(m) == [0, 1]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("standardize", [False, True])
def test_the_cap_drops_and_counts_the_new_features_of_labeled_events(variant, standardize):
    m = _learner(variant, standardize, max_features=3)
    m.step({"a": 1.0, "b": 2.0}, 1)
    m.step({"c": 1.0, "d": 2.0, "a": 1.0, "e": 1.0}, -1)  # room for c only: d and e dropped
    assert (_features(m), m.dropped_features) == (["a", "b", "c"], 2)
    _, _, mistake = m.step({"f": 9.0}, 1)  # nothing known: learned as an empty event (bias only)
    assert m.dropped_features == 3 and mistake is not None
    assert _features(m) == ["a", "b", "c"] and (_scaler_names(m) in (None, ["a", "b", "c"]))
    m.step({"g": 1.0}, None)  # unlabeled: never counted, never added
    assert m.dropped_features == 3 and m.seen == 4


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_cap_on_dense_lists(variant):
    m = _learner(variant, max_features=3)
    m.step([1.0, 2.0], 1)
    m.step([1.0, 2.0, 3.0, 4.0, 5.0], -1)  # positions 3 and 4 dropped
    assert (_features(m), m.dropped_features) == ([0, 1, 2], 2)
    assert m.step([1.0, 2.0, 3.0, 4.0], None)[1] == m.step([1.0, 2.0, 3.0], None)[1]
    assert m.dropped_features == 2
    m.step([1.0, 1.0, 1.0, 1.0], 1)
    assert m.dropped_features == 3


def test_learning_on_the_known_features_is_learning_without_the_dropped_ones():
    capped, reference = Perceptron(max_features=2), Perceptron()
    events = [
        ({"a": 1.0, "b": -1.0}, 1),
        ({"a": 2.0, "c": 5.0, "b": 1.0}, -1),
        ({"c": -3.0, "a": 1.0}, 1),
        ({"a": -1.0, "b": 2.0}, 1),
    ]
    for x, y in events:
        assert capped.step(x, y) == reference.step({k: v for k, v in x.items() if k in ("a", "b")}, y)
    assert capped.weights == reference.weights and capped.bias == reference.bias
    assert capped.dropped_features == 2


def test_a_bad_label_with_new_features_changes_nothing():
    for x in ({"a": 1.0, "new": 2.0}, [1.0, 2.0, 3.0]):
        m = Perceptron(max_features=5)
        m.step({"a": 1.0}, 1)
        before = m.to_state()
        with pytest.raises(ValueError, match=r"y = -1, \+1 or None"):
            m.step(x, 0)
        assert m.to_state() == before


@pytest.mark.parametrize("standardize", [False, True])
@pytest.mark.parametrize("hash_features", [0, 64])
def test_cap_and_count_survive_a_checkpoint_and_old_states_still_load(standardize, hash_features):
    m = _learner("averaged", standardize, max_features=2, hash_features=hash_features)
    m.step({"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0, "e": 5.0}, 1)
    assert m.dropped_features > 0
    back = learner_from_state(json.loads(json.dumps(m.to_state())))
    assert back.to_state() == m.to_state()
    assert (back.max_features, back.dropped_features) == (2, m.dropped_features)
    # a state written before the cap existed: no cap, nothing dropped
    state = Perceptron().to_state()
    del state["max_features"], state["counters"]["dropped_features"]
    old = learner_from_state(state)
    assert (old.max_features, old.dropped_features) == (None, 0)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "10"])
def test_bad_caps_are_refused(bad):
    with pytest.raises(ValueError, match="max_features"):
        Perceptron(max_features=bad)
    state = Perceptron().to_state()
    state["max_features"] = bad
    with pytest.raises(ValueError, match="max_features"):
        learner_from_state(state)


def test_a_restored_model_over_its_cap_keeps_its_features_and_adds_none():
    m = Perceptron()
    m.step({"a": 1.0, "b": 1.0, "c": 1.0}, 1)
    m.max_features = 2  # what the service does to a model restored from before the cap existed
    m.step({"a": 1.0, "d": 1.0}, -1)
    assert (_features(m), m.dropped_features) == (["a", "b", "c"], 1)
    assert learner_from_state(m.to_state()).to_state() == m.to_state()


def test_the_river_api_follows_the_cap():
    m = ScaledPerceptron(max_features=1)
    m.learn_one({"a": 1.0, "b": 2.0}, True)
    assert (_features(m), _scaler_names(m), m.dropped_features) == (["a"], ["a"], 1)
    assert Perceptron(max_features=3).clone().max_features == 3


# -- properties ----------------------------------------------------------------

names = st.sampled_from(["a", "b", "c", "d", "e", 0, 1, 2, 3, 5])
value = st.floats(-5, 5, allow_nan=False)
stream_event = st.tuples(
    st.one_of(st.lists(value, min_size=1, max_size=6), st.dictionaries(names, value, min_size=1, max_size=5)),
    st.sampled_from([-1, 1, None]),
)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(VARIANTS),
    st.booleans(),
    st.one_of(st.none(), st.integers(1, 6)),
    st.lists(stream_event, max_size=30),
)
def test_unlabeled_never_grow_the_model_the_cap_holds_and_the_drops_are_exact(variant, standardize, cap, events):
    m = _learner(variant, standardize, cap)
    known: list = []  # the reference: a list is the features 0..n-1
    dropped = 0
    for x, y in events:
        before = _features(m)
        m.step(x, y)
        after = _features(m)
        keys = list(range(len(x))) if isinstance(x, list) else list(x)
        if y is None:
            assert after == before
            continue
        new = [k for k in keys if k not in known]
        room = len(new) if cap is None else max(cap - len(known), 0)
        known += new[:room]
        dropped += len(new) - min(room, len(new))
        assert after == known
        assert cap is None or len(after) <= cap
        assert m.dropped_features == dropped
        assert _scaler_names(m) in (None, after)
    assert learner_from_state(json.loads(json.dumps(m.to_state()))).to_state() == m.to_state()


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.dictionaries(st.text(min_size=1, max_size=12), value, min_size=1, max_size=8),
            st.sampled_from([-1, 1, None]),
        ),
        max_size=20,
    )
)
def test_hashing_holds_at_most_n_buckets_whatever_the_names(events):
    m = make_learner("plain", hash_features=16)
    for x, y in events:
        m.step(x, y)
    assert all(type(k) is int and 0 <= k < 16 for k in m.weights)
    assert m.dropped_features == 0


# -- hashing -------------------------------------------------------------------

HASH_NAMES = ["user=ann", "page=/checkout?id=42", "ua:Mozilla/5.0", "ünïcode-名前", "0", "17"]


def test_hashing_is_the_same_in_another_process():
    """The buckets must survive a restart: another interpreter, another PYTHONHASHSEED, same buckets."""
    here = HashedPerceptron(1 << 20).hash({name: float(i + 1) for i, name in enumerate(HASH_NAMES)})
    code = (
        "import json, sys; from perceptron_stream.learning import HashedPerceptron; names = json.loads(sys.argv[1]); "
        "print(json.dumps(sorted(HashedPerceptron(1 << 20).hash({n: float(i + 1) for i, n in enumerate(names)}).items())))"
    )
    for seed in ("1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code, json.dumps(HASH_NAMES)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=120,
            check=True,
        ).stdout
        assert [tuple(kv) for kv in json.loads(out)] == sorted(here.items())


def _murmur3_32(data: bytes, seed: int) -> int:
    """MurmurHash3 x86_32 (Austin Appleby's reference algorithm), as a signed 32-bit int."""
    c1, c2, mask = 0xCC9E2D51, 0x1B873593, 0xFFFFFFFF

    def rotl(v: int, r: int) -> int:
        return ((v << r) | (v >> (32 - r))) & mask

    h = seed
    n = len(data) // 4 * 4
    for i in range(0, n, 4):
        k = rotl(int.from_bytes(data[i : i + 4], "little") * c1 & mask, 15) * c2 & mask
        h = (rotl(h ^ k, 13) * 5 + 0xE6546B64) & mask
    tail = data[n:]
    if tail:
        h ^= rotl(int.from_bytes(tail, "little") * c1 & mask, 15) * c2 & mask
    h ^= len(data)
    for shift, mult in ((16, 0x85EBCA6B), (13, 0xC2B2AE35)):
        h = (h ^ (h >> shift)) * mult & mask
    h ^= h >> 16
    return h - (1 << 32) if h >= 1 << 31 else h


def test_hashing_is_murmurhash3_of_the_name_with_a_pinned_seed():
    """What the buckets are, independently of river: a river that hashes otherwise fails here (and its
    states fail their probes) before it can read a checkpoint's weights under other features."""
    n, seed = 1 << 20, 2357136044  # river: the seed drawn by numpy's RandomState(0), frozen by numpy's policy
    got = HashedPerceptron(n).hash({name: 1.0 for name in HASH_NAMES})
    expected: dict[int, float] = {}
    for name in HASH_NAMES:
        h = _murmur3_32(name.encode(), seed)
        expected[h % n] = expected.get(h % n, 0.0) + (-1.0 if h < 0 else 1.0)
    assert got == expected


@pytest.mark.parametrize("standardize", [False, True])
def test_a_hashed_model_restores_and_goes_on_identically(standardize):
    m = _learner("pocket", standardize, hash_features=32)
    events = [({f"tok{i % 11}": 1.0, f"id{i}": 0.5}, 1 if i % 3 else -1) for i in range(40)]
    for x, y in events[:30]:
        m.step(x, y)
    back = learner_from_state(json.loads(json.dumps(m.to_state())))
    assert type(back) is HashedPerceptron and back.to_state() == m.to_state()
    for x, y in events[30:]:
        assert back.step(x, y) == m.step(x, y)
    assert len(_features(m)) <= 32


def test_dense_lists_are_hashed_as_the_features_0_to_d_minus_1():
    m = HashedPerceptron(64)
    assert m.step([1.0, 2.0], 1) == HashedPerceptron(64).step({0: 1.0, 1: 2.0}, 1)
    assert m.hash([1.0, 2.0]) == m.hash({"0": 1.0, "1": 2.0})


def test_hashing_refuses_bad_sizes_and_states_of_another_kind():
    bad: Any  # wrong on purpose
    for bad in (0, -3, 1.5, None):
        with pytest.raises(ValueError, match="n_features"):
            HashedPerceptron(bad)
    state = HashedPerceptron(8).to_state()
    state["hasher"]["n_features"] = 0
    with pytest.raises(ValueError, match="n_features"):
        learner_from_state(state)
