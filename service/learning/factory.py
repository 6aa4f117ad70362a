"""The learners the service runs, made and rebuilt by name: the one place that knows every kind.

A :class:`~perceptron_stream.learning.perceptron.Perceptron`, a
:class:`~perceptron_stream.learning.scaled.ScaledPerceptron` (a StandardScaler in
front), either behind a :class:`~perceptron_stream.learning.hashing.HashedPerceptron`.
"""

from __future__ import annotations

from perceptron_stream.learning.hashing import STATE_KIND as HASHED_KIND
from perceptron_stream.learning.hashing import HashedPerceptron
from perceptron_stream.learning.perceptron import Perceptron
from perceptron_stream.learning.scaled import STATE_KIND, ScaledPerceptron


def make_learner(
    variant: str = "plain",
    margin: float = 0.0,
    standardize: bool = False,
    max_features: int | None = None,
    hash_features: int = 0,
) -> Perceptron | ScaledPerceptron | HashedPerceptron:
    """The model the service runs: a :class:`Perceptron`, with a StandardScaler in front if asked,
    holding at most ``max_features`` features (None: no cap), and with the features hashed into
    ``hash_features`` buckets first when it is not 0 (:class:`HashedPerceptron`).

    >>> m = make_learner("averaged", standardize=True, max_features=2)
    >>> _ = m.step({"a": 1.0, "b": 2.0, "c": 3.0}, 1)
    >>> sorted(m.weights), m.dropped_features, len(learner_from_state(m.to_state()).to_state()["scaler"]["counts"])
    (['a', 'b'], 1, 2)
    >>> type(make_learner(hash_features=1024)).__name__
    'HashedPerceptron'
    """
    model = (
        ScaledPerceptron(variant, margin, max_features) if standardize else Perceptron(variant, margin, max_features)
    )
    if hash_features:
        return HashedPerceptron(hash_features, model)
    return model


def learner_from_state(state: dict) -> Perceptron | ScaledPerceptron | HashedPerceptron:
    """Rebuild whichever learner wrote ``state`` (dispatch on its ``kind``).

    >>> learner_from_state({"kind": "svm"})
    Traceback (most recent call last):
    ...
    ValueError: invalid learner state: unknown kind 'svm' (expected 'perceptron', 'scaled-perceptron' or 'hashed-perceptron')
    """
    kind = state.get("kind") if isinstance(state, dict) else None
    if kind == "perceptron":
        return Perceptron.from_state(state)
    if kind == STATE_KIND:
        return ScaledPerceptron.from_state(state)
    if kind == HASHED_KIND:
        return HashedPerceptron.from_state(state)
    raise ValueError(
        f"invalid learner state: unknown kind {kind!r} (expected 'perceptron', 'scaled-perceptron' or 'hashed-perceptron')"
    )
