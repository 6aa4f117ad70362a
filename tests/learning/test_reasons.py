"""Reason codes of a batch at once (``explain_many``, :mod:`perceptron_stream.learning.reasons`): each event's K
largest parts and bias are, bit for bit, the ones ``explain_step`` gives one event at a time, ranked as the service
ranks them (by magnitude, ties in the event's order), and the steps and the model after them are ``step_many``'s."""

from __future__ import annotations

import random

import numpy as np
import pytest
from perceptron_stream.learning import Perceptron
from perceptron_stream.learning.reasons import top_parts
from perceptron_stream.learning.variants.plain import Plain


def _largest_first(part: tuple) -> float:
    return -abs(part[3])


def _value(rng: random.Random) -> float:
    return rng.choice([0.0, -0.0, 1.0, -2.0, 0.5, 1e-300, 7.5e5, rng.gauss(0, 3), rng.uniform(-50, 50)])


def _batches(seed: int, named: bool, ragged: bool):
    """Batches of events the batch form takes (every name known after the first, labels -1/+1/None), with ties of
    magnitude, zeros of both signs and long runs of updates."""
    rng = random.Random(seed)
    names = [f"f{i}" for i in range(9)]
    for _ in range(12):
        batch = []
        for _ in range(rng.randint(1, 80)):
            if named:
                chosen = rng.sample(names, rng.randint(1, len(names))) if ragged else names
                x: dict | list = {name: _value(rng) for name in chosen}
            else:
                x = [_value(rng) for _ in range(9)]
            batch.append((x, rng.choice([1, -1, 1, -1, None])))
        yield [x for x, _ in batch], [y for _, y in batch]


@pytest.mark.parametrize("k", [1, 3, 20])
@pytest.mark.parametrize("form", ["dense", "named", "ragged"])
@pytest.mark.parametrize("variant", ["plain", "margin"])
def test_explain_many_gives_each_event_the_parts_explain_step_gives_one_at_a_time(variant, form, k):
    def make() -> Perceptron:
        return Perceptron("margin", margin=0.5) if variant == "margin" else Perceptron()

    batched, reference = make(), make()
    assert isinstance(batched, Plain)  # the variants whose running weights publish
    first = {f"f{i}": 1.0 for i in range(9)} if form != "dense" else [1.0] * 9
    for model in (batched, reference):
        model.step(first, 1)  # every feature known: the batch form registers none
    compared = 0
    for seed in range(4):
        for xs, ys in _batches(seed, form != "dense", form == "ragged"):
            assert batched.can_step_many(xs, ys)
            steps, reasons = batched.explain_many(xs, ys, k)
            for i, (x, y) in enumerate(zip(xs, ys)):
                result, parts, bias = reference.explain_step(x, y)
                assert steps[i] == result
                expected = sorted(parts, key=_largest_first)[:k]
                got, got_bias = reasons[i]
                assert repr(got) == repr(expected) and repr(got_bias) == repr(bias), (i, x, y)
                compared += 1
            assert batched.to_state() == reference.to_state()
    assert compared > 500


def test_a_weight_of_minus_zero_an_update_does_not_touch_stays_minus_zero():
    """-0.0 is the weight an untouched column gets added (the one addition that changes no float): a weight of -0.0
    read back from a model file stays -0.0 in the parts of every event after an update elsewhere."""
    xs = [{"a": 1.0}, {"a": 1.0, "b": 3.0}]
    reasons = top_parts(xs, [1, -1], np.array([True, False]), [0.0, -0.0], 0.0, 2, {"a": 0, "b": 1})
    assert repr(reasons[1]) == repr(([("a", 1.0, 1.0, 1.0), ("b", 3.0, -0.0, -0.0)], 1.0))
