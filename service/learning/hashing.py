"""Feature hashing in front of the perceptron: a fixed-size model for open-ended feature names.

Why: a stream whose feature names never stop coming (tokens, ids, URLs)
makes a model keyed by name grow without bound, or, with a cap, stop
learning from new names.  The hashing trick (Weinberger et al. 2009; what
Vowpal Wabbit does) maps every name into one of ``n_features`` buckets, so
the model holds at most ``n_features`` weights whatever the names, at the
price of collisions: names that share a bucket share a weight.

The hash is river's :class:`river.preprocessing.FeatureHasher` (river 0.26:
MurmurHash3 x86_32 of ``str(name)`` with a fixed 32-bit seed, in Rust;
scikit-learn's hash).  Python's ``hash()`` is never involved: strings hash
differently in every process (PYTHONHASHSEED), which would scatter a
restored model's weights over the wrong features.  River draws the seed from
NumPy's legacy ``RandomState(seed)``, frozen by NumPy's compatibility
policy, so the same ``seed`` gives the same buckets in every process and
after every restart.  The sign of the hash flips half of the values
(``alternate_sign``), so colliding features tend to cancel rather than add
up.  Values that land in one bucket are summed.

What the state keeps: ``n_features``, the seed and, as a guard, the buckets
and signs of a few probe names.  A river whose hash changed would read the
weights under other features than they were learned for: :meth:`from_state`
recomputes the probes and refuses the state when they differ.

Dense lists are hashed too, as the features 0..d-1 (the tokens ``"0"``,
``"1"``...: the same buckets as names "0", "1"...), so lists and dicts share
one space of buckets; hashing a fixed-dimension list only costs time.

>>> m = HashedPerceptron(16)
>>> m.step({"user=ann": 1.0, "page=/home": 2.0}, 1)[2], m.step({"user=ann": 1.0, "page=/home": 2.0}, 1)[2]
(True, False)
>>> sorted(m.weights) == sorted(m.hash({"user=ann": 1.0, "page=/home": 2.0}))  # buckets, not names
True
>>> all(0 <= k < 16 for k in m.weights)
True
>>> HashedPerceptron.from_state(m.to_state()).to_state() == m.to_state()
True
"""

from __future__ import annotations

from typing import Any

from perceptron_stream.learning.linear import as_dict as _as_dict
from perceptron_stream.learning.many import Steps, relabel_many, signed_labels
from perceptron_stream.learning.perceptron import Perceptron, StepResult
from perceptron_stream.learning.scaled import STATE_KIND as SCALED_KIND
from perceptron_stream.learning.scaled import ScaledPerceptron
from perceptron_stream.learning.state import Reader as _Reader
from river import base

STATE_KIND = "hashed-perceptron"
STATE_FORMAT = 1
#: Names whose buckets and signs the state keeps, to notice a hash that changed.
PROBES = tuple(f"perceptron-stream/probe/{i}" for i in range(8))


def _check_n(n_features: Any) -> None:
    if type(n_features) is not int or n_features < 1:
        raise ValueError(f"n_features must be an integer >= 1, got {n_features!r}")


class HashedPerceptron(base.Classifier):
    """``FeatureHasher(n_features, seed) | model``, with the perceptron's API (``step``, counters, state).

    ``model``: a :class:`Perceptron` (the default) or a
    :class:`perceptron_stream.learning.ScaledPerceptron`: the scaler then sees buckets.
    """

    def __init__(self, n_features: int, model: Any = None, seed: int = 0) -> None:
        _check_n(n_features)
        if type(seed) is not int or not 0 <= seed < 2**32:
            raise ValueError(f"seed must be an integer in [0, 2**32), got {seed!r}")
        self.n_features = n_features
        self.model = Perceptron() if model is None else model
        self.seed = seed
        # Imported here, like the StandardScaler: river.preprocessing takes about 1.5 s to import.
        from river.preprocessing import FeatureHasher

        self.hasher = FeatureHasher(n_features=n_features, seed=seed, alternate_sign=True)

    def hash(self, x: dict | list) -> dict:
        """x with its features hashed into buckets 0..n_features-1 (values in one bucket summed)."""
        return self.hasher.transform_one(x if type(x) is dict else _as_dict(x))

    def step(self, x: dict | list, y: int | None) -> StepResult:
        return self.model.step(self.hasher.transform_one(x if type(x) is dict else _as_dict(x)), y)

    def explain(self, x: dict | list) -> tuple[list[tuple], float]:
        """The parts of :meth:`score_one`'s score, one per bucket x touched (the model saw buckets: each ``value``
        the bucket's, its features' values signed by their hash and summed), each named by x's features in it.

        >>> m = HashedPerceptron(16); _ = m.step({"user=ann": 1.0}, 1)
        >>> m.explain({"user=ann": 2.0})[0][0][0]
        'user=ann'
        """
        return self._named(x, *self.model.explain(self.hash(x)))

    def explain_step(self, x: dict | list, y: int | None) -> tuple[StepResult, list[tuple], float]:
        """:meth:`step`, with the parts of its score (:meth:`explain`, before it learned)."""
        result, parts, bias = self.model.explain_step(self.hash(x), y)
        return result, *self._named(x, parts, bias)

    def _named(self, x: dict | list, parts: list[tuple], bias: float) -> tuple[list[tuple], float]:
        """``parts`` by bucket, each bucket named by x's features that fell in it (in x's order; several joined by
        " + ", when names collide in one event)."""
        transform = self.hasher.transform_one
        names: dict[Any, list] = {}
        for feature in x if type(x) is dict else range(len(x)):
            for bucket in transform({feature: 1.0}):
                names.setdefault(bucket, []).append(feature)
        named = []
        for bucket, value, weight, contribution in parts:
            them = names.get(bucket, [bucket])
            named.append((them[0] if len(them) == 1 else " + ".join(map(str, them)), value, weight, contribution))
        return named, bias

    def can_step_many(self, xs: list, ys: list) -> bool:
        """Whether the labels are -1/+1/None: a hashed model has no unknown features to look at (:meth:`knows_none_of`)."""
        return signed_labels(ys)

    def step_many(self, xs: list, ys: list, checked: bool = False, joins: list | None = None) -> Steps:
        """:meth:`step` of each event: each hashed per event (river's hasher, one Rust call: names differ from event
        to event on the streams hashing is for, so there is no column layout to share), then the model's
        ``step_many`` over the hashed rows (per event itself while new buckets come); ``joins`` as there."""
        transform = self.hasher.transform_one
        hashed = [transform(x if type(x) is dict else _as_dict(x)) for x in xs]
        return self.model.step_many(hashed, ys, checked or signed_labels(ys), joins)  # dicts all

    def relabel_many(self, xs: list, ys: list, mistakes: list[bool]) -> tuple[list[int], list[int]]:
        """:meth:`relabel` of each: the model's ``relabel_many`` of the hashed rows."""
        return relabel_many(self.model, [self.hash(x) for x in xs], ys, mistakes)

    def relabel(self, x: dict | list, y: int, mistake: bool) -> StepResult:
        return self.model.relabel(self.hash(x), y, mistake)

    def knows_none_of(self, x: dict | list) -> bool:
        """Always False: buckets are shared by unrelated names (a shared bucket says nothing of a shared feature),
        and telling would cost a second hashing of every event."""
        return False

    def predict_one(self, x: dict, **kwargs: Any) -> int | bool:
        return self.model.predict_one(self.hash(x))

    def score_one(self, x: dict | list) -> float:
        """The score :meth:`step` would publish for x; changes nothing (``--learning off`` scores by it)."""
        return self.model.score_one(self.hash(x))

    def learn_one(self, x: dict, y: Any, **kwargs: Any) -> None:
        self.model.learn_one(self.hash(x), y)

    # The model's counters and stats (weights by bucket).
    variant = property(lambda self: self.model.variant)
    margin = property(lambda self: self.model.margin)
    seen = property(lambda self: self.model.seen)
    labeled = property(lambda self: self.model.labeled)
    mistakes = property(lambda self: self.model.mistakes)
    updates = property(lambda self: self.model.updates)
    dropped_features = property(lambda self: self.model.dropped_features)
    radius = property(lambda self: self.model.radius)
    weight_norm = property(lambda self: self.model.weight_norm)
    weights = property(lambda self: self.model.weights)
    weight_snapshot = property(lambda self: self.model.weight_snapshot)
    bias = property(lambda self: self.model.bias)

    @property
    def max_features(self) -> int | None:
        return self.model.max_features

    @max_features.setter
    def max_features(self, value: int | None) -> None:
        self.model.max_features = value

    def _probes(self) -> list[list]:
        """[bucket, sign] of each probe name under this hasher."""
        return [[k, 1 if v > 0 else -1] for name in PROBES for k, v in self.hasher.transform_one({name: 1.0}).items()]

    def to_state(self) -> dict:
        return {
            "kind": STATE_KIND,
            "format": STATE_FORMAT,
            "hasher": {
                "n_features": self.n_features,
                "seed": self.seed,
                "alternate_sign": True,
                "probes": self._probes(),
            },
            "model": self.model.to_state(),
        }

    @classmethod
    def from_state(cls, state: dict) -> HashedPerceptron:
        """Exact inverse of :meth:`to_state`; ValueError on a wrong or corrupt state, or a hash that changed.

        >>> state = HashedPerceptron(8).to_state()
        >>> state["hasher"]["probes"][0][0] += 1   # as if river hashed differently now
        >>> HashedPerceptron.from_state(state)
        Traceback (most recent call last):
        ...
        perceptron_stream.learning.state.StateError: invalid hashed-perceptron state: the feature hasher puts the probe names into other buckets than the one that wrote this state (river's hash changed?): its weights would be read under other features
        """
        st = _Reader("hashed-perceptron state", state)
        st.header(STATE_KIND, STATE_FORMAT)
        hs = _Reader("hashed-perceptron state hasher", st.get("hasher"))
        if hs.get("alternate_sign") is not True:
            hs.fail("alternate_sign must be true")
        try:
            m = cls(hs.get("n_features"), seed=hs.get("seed"))
        except ValueError as exc:
            hs.fail(str(exc))
        if m._probes() != hs.get("probes"):
            st.fail(
                "the feature hasher puts the probe names into other buckets than the one that wrote this state "
                "(river's hash changed?): its weights would be read under other features"
            )
        inner = st.get("model")
        kind = inner.get("kind") if isinstance(inner, dict) else None
        if kind == "perceptron":
            m.model = Perceptron.from_state(inner)
        elif kind == SCALED_KIND:
            m.model = ScaledPerceptron.from_state(inner)
        else:
            st.fail("model must be a perceptron or scaled-perceptron state")
        return m
