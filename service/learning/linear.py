"""The weights by feature, which every perceptron variant shares: where each feature sits, which features a model
takes in, and the two operations on the weights, the score and the update.

A model holds one weight per feature in a plain list (fast in CPython: ``sum(map(mul, w, x))`` runs in C) and a
feature→position map. Dense lists are features 0..d-1 and index the weights directly while the model's features
are exactly those positions (``_dense`` of them); dicts are looked up by name.

Which features the model holds (a bounded model):

- only labeled events add features: an unlabeled one (``y`` None) is scored on the features the model knows, the
  others weighing 0, and leaves the model's features as they were, for dicts and for dense lists longer than the
  known positions alike. A feature that has never been learned from has weight 0 anyway: registering it from an
  unlabeled event only made the model (and its checkpoint) grow, without bound on a stream of open-ended names.
- ``max_features`` (None: no cap) caps how many features the model holds. Once it holds that many, a labeled
  event's new features are dropped: the event is predicted and learned from on its known features (plus new ones
  up to the cap, in the event's order), and ``dropped_features`` counts the features left out, one per (event,
  feature). Dropping and counting rather than refusing the event (a dead letter): every event is still predicted
  and learned from, as far as the model can; on a stream of open-ended names nearly every event carries a new name
  once the cap is reached, so refusing them would refuse most of the stream, and a dead letter has no way back
  into the model anyway. The count tells the operator the cap is binding (raise it, or hash the features:
  :class:`perceptron_stream.learning.HashedPerceptron`). A model restored with more features than its cap keeps
  them all and adds none.

Only two places register features, both off the hot path (an event with a feature the model does not know yet):
:meth:`Linear.admit` (dicts) and :meth:`Linear._fit_list` (lists longer than the known positions). So the cap costs
nothing per event.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import repeat
from operator import add, mul, sub
from typing import Any

from perceptron_stream.learning.many import in_order_sum as _sum  # the one definition of a score's sum


def bad_label(y: Any) -> ValueError:
    return ValueError(f"step takes y = -1, +1 or None (map other spellings with to_label), got {y!r}")


def dot(w: list[float], m: Linear | None, x: Any) -> float:
    """w·x without the bias, summed in x's order (river's order).

    ``m`` None: x is a dense list, x[i] is feature i.  Else x is a dict of
    features all known to the model ``m`` (KeyError otherwise); when they
    are its first features in order (a fixed schema) the sum skips the lookups.
    (x is typed Any: which of list and dict it is goes with ``m``, which a type cannot say.)
    """
    ws: Iterable[float]
    if m is None:
        ws, vals = w, x
    elif m.features[: len(x)] == list(x):
        ws, vals = w, x.values()
    else:
        ws, vals = map(w.__getitem__, map(m.feature_index.__getitem__, x)), x.values()
    return _sum(map(mul, ws, vals))


def update(w: list[float], m: Linear | None, x: Any, y: float) -> None:
    """w += y·x (``m`` as in :func:`dot`).  river computes w - x·(-y): for y = ±1, the floats of w ± x."""
    n = len(x)
    if m is not None:
        if m.features[:n] != list(x):
            idx = m.feature_index
            for k, v in x.items():
                w[idx[k]] += y * v
            return
        x = x.values()
    if y == 1:
        w[:n] = map(add, w, x)
    elif y == -1:
        w[:n] = map(sub, w, x)
    else:
        w[:n] = map(add, w, map(mul, x, repeat(y)))


def as_dict(x: dict | list) -> dict:
    if type(x) is dict:
        return x
    return dict(enumerate(x)) if isinstance(x, list) else dict(x)


def check_cap(max_features: Any) -> None:
    if max_features is not None and (type(max_features) is not int or max_features < 1):
        raise ValueError(f"max_features must be None (no cap) or an integer >= 1, got {max_features!r}")


class Linear:
    """Running weights ``_w`` (by position) and bias ``_b``, the features they belong to, and the cap on them.

    A variant that keeps other weight lists beside these (the averaged sums, the pocket's weights) names them in
    :meth:`_kept`, so a new feature gets a position in each."""

    def __init__(self, max_features: int | None = None) -> None:
        check_cap(max_features)
        self.max_features = max_features  # most features the model holds (None: no cap)
        self.features: list = []  # position -> feature
        self.feature_index: dict = {}  # feature -> position
        self._dense = 0  # features[i] == i for every i < _dense: lists index positions directly
        self._w: list[float] = []  # running (learning) weights
        self._b = 0.0
        self.dropped_features = 0  # new features of labeled events left out: the model held max_features

    def _kept(self) -> tuple[list[float], ...]:
        """The variant's weight lists beside the running ones, one value per feature (none here)."""
        return ()

    def knows_none_of(self, x: dict | list) -> bool:
        """Whether the model holds features and ``x`` has none of them: its score is then the bias alone.

        A dense list's values are the features 0..len-1, a dict's keys are
        names: a model of names never shares one with a dense event, nor a
        model of positions with a named one (what a model trained on one form
        and served the other does, silently, without this check).

        >>> from perceptron_stream.learning import Perceptron
        >>> p = Perceptron.from_weights({"x1": 1.0})
        >>> p.knows_none_of([1.0, 2.0]), p.knows_none_of({"x1": 1.0, "x3": 0.5}), Perceptron().knows_none_of([1.0])
        (True, False, False)
        """
        index = self.feature_index
        if not index:
            return False
        if type(x) is list:
            if self._dense:  # position 0 is known: any value shares it
                return not x
            return not any(i in index for i in range(len(x)))
        return index.keys().isdisjoint(x)

    def _known(self, x: dict | Any, y: int | None) -> dict:
        """x as a dict of features the model holds (see :meth:`admit`)."""
        x = as_dict(x)
        if all(map(self.feature_index.__contains__, x)):
            return x
        return self.admit(x, y)

    def admit(self, x: dict, y: int | None) -> dict:
        """The part of x the model takes, after registering what it may.

        Unlabeled (``y`` None): only the features it knows, nothing registered.
        Labeled: its new features get a position (weight 0) while the model
        holds fewer than ``max_features``; the rest are left out and counted in
        ``dropped_features``.  The label is checked before anything changes.
        """
        idx = self.feature_index
        if y is None:
            return {k: v for k, v in x.items() if k in idx}
        if y != 1 and y != -1:
            raise bad_label(y)
        new = [k for k in x if k not in idx]
        cap = self.max_features
        room = len(new) if cap is None else max(cap - len(self.features), 0)
        for k in new[:room]:
            self._add_feature(k)
        if room >= len(new):
            return x
        self.dropped_features += len(new) - room
        return {k: v for k, v in x.items() if k in idx}

    def _fit_list(self, x: list, y: int | None) -> list | dict:
        """A list longer than the known positions, as the model takes it (as :meth:`admit` does for dicts).

        A list when the model's features are all positions: cut to the known
        ones (unlabeled, or past the cap: the rest dropped and counted), after
        registering new positions (labeled, up to the cap).  Else a dict, for
        the dict path: names already hold the positions after the known ones.
        """
        n, d = len(x), self._dense
        if n <= d:
            return x
        if d != len(self.features):  # a name sits at position d
            return as_dict(x)
        if y is None:
            return x[:d]
        if y != 1 and y != -1:
            raise bad_label(y)
        cap = self.max_features
        end = n if cap is None else min(n, cap)
        for k in range(d, end):  # keys are exactly 0..d-1: every position from d on is free
            self._add_feature(k)
        d = self._dense
        if d < n:
            self.dropped_features += n - d
            return x[:d]
        return x

    def _add_feature(self, k: Any) -> int:
        i = len(self.features)
        self.features.append(k)
        self.feature_index[k] = i
        self._w.append(0.0)
        for arr in self._kept():
            arr.append(0.0)
        if k == i and type(k) is int and self._dense == i:
            self._dense += 1
        return i
