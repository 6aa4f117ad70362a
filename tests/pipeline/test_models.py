"""service/pipeline/models.py: drift counted in episodes (one change, one count); our DDM is river's."""

from __future__ import annotations

import random
from itertools import islice

from hypothesis import given, settings
from hypothesis import strategies as st
from perceptron_stream.learning import make_learner
from perceptron_stream.pipeline.models import DDM, DriftWatch
from perceptron_stream.streams import credit, separable
from river.drift.binary import DDM as RiversDDM


def _drifts(events, variant: str = "plain", standardize: bool = False, batch: int = 500) -> list[int]:
    """The events at which DriftWatch opened an episode, the champion's mistakes fed a batch at a time as the task does."""
    model, watch, found, flags = make_learner(variant, standardize=standardize), DriftWatch(), [], []
    for i, (x, y) in enumerate(events, start=1):
        flags.append(model.step(x, y)[2] is True)  # labeled: a bool
        if len(flags) == batch:
            found += [i] * watch.update(flags)
            flags = []
    return found + [i] * watch.update(flags)


def test_the_demos_policy_change_is_one_drift():
    """The demo's stream and champion (credit, 2% noise, seed 42, averaged with a scaler, the policy changing at event
    10,000 as at 500 events/s): river's DDM alone fired 4 times within 400 events; the episode counts it once, and
    nothing in the 30,000 events after it."""
    events = ((e["features"], e["y"]) for e in islice(credit(noise=0.02, seed=42, drift_every=10_000), 40_000))
    [at] = _drifts(events, "averaged", standardize=True)
    assert 10_000 < at <= 11_000


def test_a_flip_and_a_flip_back_are_two_drifts_and_a_steady_noisy_stream_none():
    for seed in (82, 1, 2):
        stream = islice(separable(dimensions=5, margin=0.1, seed=seed), 15_000)
        events = [(e["x"], -e["y"] if 5_000 <= i < 10_000 else e["y"]) for i, e in enumerate(stream)]
        first, second = _drifts(events)
        assert 5_000 < first <= 5_500 and 10_000 < second <= 10_500, (seed, first, second)
    noisy = [(e["x"], e["y"]) for e in islice(separable(dimensions=5, margin=0.1, noise=0.05, seed=1), 20_000)]
    assert _drifts(noisy, "averaged") == []


def test_an_episode_ends_when_the_rate_is_back_at_its_level_or_after_the_limit():
    watch = DriftWatch(window=10, limit=100)
    steady = [i % 10 == 0 for i in range(500)]  # 10 % mistakes
    assert watch.update(steady) == 0 and not watch.in_episode
    assert watch.update([True] * 40) == 1 and watch.in_episode
    assert watch.update([True] * 30) == 0 and watch.in_episode  # still erring: the same drift
    assert watch.update(steady[:20]) == 0 and not watch.in_episode  # 10 % again over the last 10: settled
    harder = DriftWatch(window=10, limit=100)
    harder.update(steady)
    assert harder.update([True] * 40) == 1
    half = [i % 2 == 0 for i in range(100)]  # 50 %: never back at 10 % (+ two standard errors of 10 events, 29 %)
    assert harder.update(half[:60]) == 0 and harder.in_episode
    harder.update(half[60:])
    assert not harder.in_episode  # the limit: from here the detector measures the new level as its normal


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.floats(0.0, 1.0), st.integers(1, 400)), min_size=1, max_size=8),
    st.lists(st.integers(1, 300), max_size=20),
    st.integers(0, 2**32),
)
def test_our_ddm_is_rivers_float_for_float(phases, cuts, seed):
    """DDM (our loop over many flags) against river's DDM fed one flag at a time: the same detections, at the same
    flags, and the same statistics after every batch, over streams of phases of several error rates (drifts and
    settling), fed in batches of any size."""
    rng = random.Random(seed)
    flags = [rng.random() < rate for rate, length in phases for _ in range(length)]
    ours, theirs = DDM(), RiversDDM()
    at, i = [], 0
    for size in [*cuts, len(flags)]:
        batch, base = flags[i : i + size], i
        i += len(batch)
        start = 0
        while start < len(batch):
            fed, drift = ours.update_many(batch, start)
            start += fed
            if drift:
                at.append(base + start)
    expected = []
    for n, x in enumerate(flags, 1):
        theirs.update(x)
        if theirs.drift_detected:
            expected.append(n)
    assert at == expected
    river_stats = (
        theirs._p.n,  # noqa: SLF001 — river keeps DDM's statistics private; nothing public shows them
        theirs._p.get(),  # noqa: SLF001
        theirs._ps_min,  # noqa: SLF001
        theirs.warning_detected,
        theirs.drift_detected,
    )
    assert (ours.n, ours.mean, ours.ps_min, ours.warning_detected, ours.drift_detected) == river_stats
