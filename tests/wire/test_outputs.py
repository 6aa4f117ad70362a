"""The batch builder of wire/outputs writes the bytes its one-message forms write."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from perceptron_stream.learning.reasons import Reasons
from perceptron_stream.wire.outputs import explained, prediction, predictions

numbers = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([0.0, -0.0, 1e-300, 5e-324])
names = st.text(max_size=12) | st.sampled_from(["a,b", '"},{"x":', "line\nbreak", "é", ""])


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 12), k=st.integers(1, 4), named=st.booleans(), short=st.booleans(), data=st.data())
def test_predictions_with_reasons_write_what_prediction_then_explained_write(n, k, named, short, data):
    """Feature names with commas, quotes, braces and newlines, positions, zeros of both signs and the extremes of
    float64, events with fewer parts than K (``short``): each message is the one :func:`prediction` then
    :func:`explained` write of the same values."""
    counts: list[int] | None = data.draw(st.lists(st.integers(0, k), min_size=n, max_size=n)) if short else None
    size = n * k if counts is None else sum(counts)
    features = data.draw(st.lists(names, min_size=size, max_size=size)) if named else np.arange(size) % 7
    values, weights, contributions = (
        np.array(data.draw(st.lists(numbers, min_size=size, max_size=size)), dtype=np.float64) for _ in range(3)
    )
    bias = np.array(data.draw(st.lists(numbers, min_size=n, max_size=n)))
    reasons = Reasons(features, values, weights, contributions, bias, k, counts)
    ids = data.draw(st.lists(st.integers(0, 10**6) | names | st.none(), min_size=n, max_size=n))
    score = data.draw(st.lists(numbers, min_size=n, max_size=n))
    ys = data.draw(st.lists(st.sampled_from([1, -1, None]), min_size=n, max_size=n))
    mistake = [None if y is None else s * y <= 0 for s, y in zip(score, ys)]
    versions, seen, mistakes = list(range(n)), list(range(1, n + 1)), [0] * n
    built = predictions(
        ids, "points", 3, list(range(10, 10 + n)), [1] * n, score, ys, mistake, versions, seen, mistakes, {"run": "r"},
        reasons,
    )  # fmt: skip
    one = [
        explained(
            prediction(ids[i], "points", 3, 10 + i, 1, score[i], ys[i], mistake[i], i, i + 1, 0, {"run": "r"}),
            *reasons[i],
        )
        for i in range(n)
    ]
    assert built == one
