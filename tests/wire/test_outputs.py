"""The batch builders of wire/outputs write the bytes their one-message forms write."""

from __future__ import annotations

import numpy as np
import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from perceptron_stream.learning.reasons import Reasons
from perceptron_stream.wire.outputs import explained, explained_many

numbers = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([0.0, -0.0, 1e-300, 5e-324])
names = st.text(max_size=12) | st.sampled_from(["a,b", '"},{"x":', "line\nbreak", "é", ""])


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 12),
    k=st.integers(1, 4),
    named=st.booleans(),
    data=st.data(),
)
def test_explained_many_writes_what_explained_writes_for_each(n, k, named, data):
    """Feature names with commas, quotes, braces and newlines, positions, zeros of both signs and the extremes of
    float64: each message is the one :func:`explained` writes of the same parts."""
    size = n * k
    features = data.draw(st.lists(names, min_size=size, max_size=size)) if named else np.arange(size) % 7
    values_, weights, contributions = (
        np.array(data.draw(st.lists(numbers, min_size=size, max_size=size))) for _ in range(3)
    )
    bias = np.array(data.draw(st.lists(numbers, min_size=n, max_size=n)))
    ids = data.draw(st.lists(st.integers(0, 10**6) | names, min_size=n, max_size=n))
    values = [orjson.dumps({"id": i, "score": 1.5}) for i in ids]
    reasons = Reasons(features, values_, weights, contributions, bias, k, None)
    assert explained_many(values, reasons) == [explained(v, *reasons[i]) for i, v in enumerate(values)]
