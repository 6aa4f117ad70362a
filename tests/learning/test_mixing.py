"""Iterative parameter mixing in the learning core: the merge, and the mistake bound it keeps.

The bound tested (McDonald, Hall & Mann 2010, Theorem 3, with the bias as a
weight): on data separable with margin γ and radius R (of x' = (1, x)), S
shards that start every round from the same mixed weights make mistakes
k_{i,n} with Σ_n Σ_i μ_{i,n} k_{i,n} ≤ (R/γ)², for error-weighted and for
uniform mixing, any S and any round length.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perceptron_stream.learning import Perceptron, make_learner
from perceptron_stream.learning.mixing import bound, mix_states, mixing_weights, shard, simulate
from perceptron_stream.streams import separable, separator


def _stream(d: int, margin: float, seed: int, count: int) -> tuple[list[tuple[list[float], int]], float]:
    events = [(e["x"], e["y"]) for e, _ in zip(separable(dimensions=d, margin=margin, seed=seed), range(count))]
    w, b = separator(dimensions=d, margin=margin, seed=seed)(0)
    return events, bound(events, w, b)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    d=st.integers(1, 8),
    margin=st.sampled_from([0.05, 0.1, 0.3]),
    seed=st.integers(0, 10_000),
    shards=st.sampled_from([1, 2, 3, 4, 8]),
    round_events=st.integers(1, 60),
    mixing=st.sampled_from(["error", "uniform"]),
    count=st.integers(50, 600),
)
def test_mixing_keeps_the_perceptron_mistake_bound(d, margin, seed, shards, round_events, mixing, count):
    events, limit = _stream(d, margin, seed, count)
    sim = simulate(shard(events, shards), round_events=round_events, mixing=mixing)
    assert sim.weighted_mistakes <= limit + 1e-9
    # every round's μ is a convex combination
    assert all(abs(sum(r.mu) - 1.0) < 1e-9 and min(r.mu) >= 0 for r in sim.rounds)


def test_several_epochs_over_the_shards_also_keep_the_bound():
    """Figure 3 as the paper runs it: epochs over the same shards until they stop erring."""
    events, limit = _stream(4, 0.1, 7, 400)
    pieces = shard(events, 4)
    models = [Perceptron() for _ in pieces]
    total = 0.0
    for _ in range(30):
        ks = []
        for model, piece in zip(models, pieces):
            before = model.updates
            for x, y in piece:
                model.step(x, y)
            ks.append(model.updates - before)
        mu = mixing_weights(ks)
        total += sum(m * k for m, k in zip(mu, ks))
        states = [m.to_state() for m in models]
        models = [Perceptron.from_state(mix_states(s, states, mu)) for s in states]
        if not any(ks):
            break
    assert not any(ks), "did not converge in 30 epochs"
    assert total <= limit
    final = models[0]
    assert all(y * final.score_one(dict(enumerate(x))) > 0 for x, y in events)  # separates the whole data set


def test_one_shard_with_mixing_is_the_single_model():
    events, _ = _stream(5, 0.1, 3, 500)
    single = Perceptron()
    for x, y in events:
        single.step(x, y)
    sim = simulate([events], round_events=37, mixing="error")
    assert sim.shards[0].to_state()["weights"] == single.to_state()["weights"] and sim.mistakes == single.updates


@given(
    st.permutations(["a", "b", "c", "d"]),
    st.lists(st.floats(-10, 10), min_size=4, max_size=4),
    st.lists(st.floats(-10, 10), min_size=4, max_size=4),
    st.floats(0, 1),
)
def test_the_merge_matches_features_by_name_not_position(order, wa, wb, m):
    a = Perceptron.from_weights(dict(zip("abcd", wa)), bias=1.0).to_state()
    b = Perceptron.from_weights(
        {k: wb["abcd".index(k)] for k in order}, bias=-1.0
    ).to_state()  # same features, another order
    mixed = Perceptron.from_state(mix_states(a, [a, b], [m, 1 - m]))
    for i, name in enumerate("abcd"):
        assert mixed.weights[name] == pytest.approx(m * wa[i] + (1 - m) * wb[i], abs=1e-9)
    assert mixed.bias == pytest.approx(2 * m - 1)


def test_a_mix_keeps_the_replicas_own_counters_and_adds_the_others_features():
    a = Perceptron()
    a.step({"x": 1.0}, 1)
    b = Perceptron()
    for _ in range(5):
        b.step({"y": 2.0, "z": 1.0}, -1)
    mixed = Perceptron.from_state(
        mix_states(a.to_state(), [a.to_state(), b.to_state()], mixing_weights([a.updates, b.updates]))
    )
    assert (mixed.seen, mixed.mistakes, mixed.updates) == (a.seen, a.mistakes, a.updates)
    assert list(mixed.weights) == ["x", "y", "z"]
    assert mixed.weights["x"] == pytest.approx(0.5) and mixed.weights["y"] == pytest.approx(-1.0)


def test_averaged_replicas_predict_with_the_mixed_average():
    rng = random.Random(5)
    models = [Perceptron("averaged") for _ in range(3)]
    for model in models:
        for _ in range(200):
            x = {f"f{rng.randrange(6)}": rng.uniform(-1, 1), "g": rng.uniform(-1, 1)}
            model.step(x, 1 if x["g"] > 0 else -1)
    mu = [0.2, 0.5, 0.3]
    states = [m.to_state() for m in models]
    mixed = Perceptron.from_state(mix_states(states[0], states, mu))
    for name in mixed.weights:
        want = sum(m * model.weights.get(name, 0.0) for m, model in zip(mu, models))
        assert mixed.weights[name] == pytest.approx(want, abs=1e-9)  # .weights are the averaged (predicting) ones
    assert mixed.bias == pytest.approx(sum(m * model.bias for m, model in zip(mu, models)))
    assert mixed.to_state()["averaged"]["c"] == states[0]["averaged"]["c"]


def test_pooled_scaler_moments_are_those_of_all_the_data_and_counts_stay_own():
    rng = random.Random(9)
    data = [[{"age": rng.gauss(40 + 10 * i, 5 + i)} for _ in range(100 + 50 * i)] for i in range(3)]
    models = [make_learner(standardize=True) for _ in data]
    for model, rows in zip(models, data):
        for x in rows:
            model.step(x, 1 if x["age"] > 45 else -1)
    states = [m.to_state() for m in models]
    mixed = mix_states(states[1], states, [1 / 3] * 3)
    values = [x["age"] for rows in data for x in rows]
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / len(values)
    sc = {k: dict(mixed["scaler"][k]) for k in ("counts", "means", "vars")}
    assert sc["means"]["age"] == pytest.approx(mean) and sc["vars"]["age"] == pytest.approx(var)
    assert sc["counts"]["age"] == len(data[1])  # its own count: the next mix does not count an event twice


def test_a_pocket_has_no_mix():
    p = Perceptron("pocket").to_state()
    with pytest.raises(ValueError, match="variant pocket has no mix"):
        mix_states(p, [p], [1.0])


def test_mixing_identical_replicas_changes_nothing():
    events, _ = _stream(3, 0.1, 11, 200)
    model = Perceptron("averaged")
    for x, y in events:
        model.step(x, y)
    state = model.to_state()
    again = mix_states(state, [state, state, state], mixing_weights([3, 0, 1]))
    assert again["weights"] == pytest.approx(state["weights"]) and math.isclose(again["bias"], state["bias"])


def test_a_mix_keeps_the_replicas_cap_own_features_first():
    a = Perceptron(max_features=3)
    a.step({"a": 1.0, "b": 1.0}, 1)
    b = Perceptron(max_features=3)
    b.step({"x": 1.0, "y": 1.0, "z": 1.0}, -1)
    mixed = Perceptron.from_state(mix_states(a.to_state(), [a.to_state(), b.to_state()], [0.5, 0.5]))
    assert list(mixed.weights) == ["a", "b", "x"] and mixed.max_features == 3
