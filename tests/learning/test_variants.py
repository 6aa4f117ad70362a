"""Each variant's fast paths are the shared step written out: the same answers, the same model after them.

A variant's ``step`` takes dense lists (and plain's, dicts too) on code of its own, for speed; every other event
takes :meth:`Perceptron.step`, the shared step. Here the same events go through the variant's ``step`` on one model
and through the shared step on another (``Perceptron.step(model, x, y)``), and the two must agree bit for bit
(``repr``: -0.0 is not 0.0), on lists, on dicts of known names, and on events that bring new features.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from perceptron_stream.learning import VARIANTS, Perceptron
from perceptron_stream.learning.variants import CLASSES

value = st.floats(min_value=-4, max_value=4, allow_nan=False, allow_infinity=False)


@st.composite
def events(draw, named: bool):
    """Events of 1 to 4 features (lists of any length up to 4, so some grow the model; or dicts of names a..d in
    any order), labels -1/+1/None."""
    out = []
    for _ in range(draw(st.integers(1, 60))):
        n = draw(st.integers(1, 4))
        x = draw(st.lists(value, min_size=n, max_size=n))
        if named:
            names = draw(st.permutations("abcd"))[:n]
            out.append(({k: v for k, v in zip(names, x)}, draw(st.sampled_from([1, -1, None]))))
        else:
            out.append((x, draw(st.sampled_from([1, -1, None]))))
    return out


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(VARIANTS), st.booleans().flatmap(lambda named: events(named)), st.sampled_from([None, 3]))
def test_every_variant_steps_as_the_shared_step(variant, stream, cap):
    margin = 0.5 if variant == "margin" else 0.0
    own, shared = Perceptron(variant, margin, cap), Perceptron(variant, margin, cap)
    assert type(own) is CLASSES[variant]
    for x, y in stream:
        assert repr(own.step(x, y)) == repr(Perceptron.step(shared, x, y)), (x, y)
    assert repr(own.to_state()) == repr(shared.to_state())


def test_the_variant_is_picked_once_and_river_sees_a_perceptron():
    """``Perceptron(variant)`` makes the variant's class, which river names Perceptron (a pipeline's step)."""
    for variant, cls in CLASSES.items():
        p = Perceptron(variant, 0.5 if variant == "margin" else 0.0)
        assert type(p) is cls and isinstance(p, Perceptron) and type(p).__name__ == "Perceptron"
        assert type(p.clone()) is cls and p.clone().variant == variant
        assert type(Perceptron.from_state(p.to_state())) is cls
