"""Each variant's batch form is its step, event after event, on either exact path and every shape of rows.

``step_many`` picks the NumPy windows or the fused loop by speed alone (``many.NUMPY_RUN``); each variant holds
both beside its one-at-a-time step (learning/variants/). Here each path is forced in turn and the answers and the
model after them (its whole state, ``repr`` so that -0.0 is not 0.0) must be those of ``step`` one event at a
time, over two batches in a row (what a variant keeps carries across them: the pocket's runs, the averaged count).
"""

from __future__ import annotations

import math
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st
from perceptron_stream.learning import VARIANTS, Perceptron, many

value = st.floats(min_value=-4, max_value=4, allow_nan=False, allow_infinity=False)
NAMES = ["a", "b", "c", "d"]


@st.composite
def batches(draw, shape: str):
    """Two batches of events of 4 features (labels -1/+1/None, mostly labeled), as lists, dicts in one order, or
    dicts of several shapes (a subset of the names, in any order)."""
    out = []
    for _ in range(2):
        xs, ys = [], []
        for _ in range(draw(st.integers(1, 40))):
            x = draw(st.lists(value, min_size=4, max_size=4))
            if shape == "list":
                xs.append(x)
            elif shape == "dict":
                xs.append(dict(zip(NAMES, x)))
            else:
                names = draw(st.permutations(NAMES))[: draw(st.integers(1, 4))]
                xs.append({k: x[i] for i, k in enumerate(names)})
            ys.append(draw(st.sampled_from([1, -1, 1, -1, None])))
        out.append((xs, ys))
    return out


def _fresh(variant: str, shape: str) -> Perceptron:
    """A model that holds the four features already (a batch registers none)."""
    p = Perceptron(variant, 0.5 if variant == "margin" else 0.0)
    p.step([1.0, -1.0, 0.5, 2.0] if shape == "list" else dict(zip(NAMES, [1.0, -1.0, 0.5, 2.0])), 1)
    return p


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(VARIANTS),
    st.sampled_from(["windows", "fused"]),
    st.sampled_from(["list", "dict", "ragged"]).flatmap(lambda shape: st.tuples(st.just(shape), batches(shape))),
)
def test_the_batch_form_is_step_after_step(variant, path, data):
    shape, pairs = data
    one, many_ = _fresh(variant, shape), _fresh(variant, shape)
    with mock.patch.object(many, "NUMPY_RUN", 0 if path == "windows" else math.inf):
        for xs, ys in pairs:
            assert many_.can_step_many(xs, ys)
            expected = [one.step(x, y) for x, y in zip(xs, ys)]
            steps = many_.step_many(xs, ys)
            assert repr([steps[i] for i in range(len(xs))]) == repr(expected)
            assert repr(many_.to_state()) == repr(one.to_state())
