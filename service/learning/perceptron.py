"""The online perceptron of the seeds, as a river classifier with a fused hot path.

h(x) = sign(w·x + b), the bias b being the weight of a constant feature x0 = 1.
Start from w = 0, b = 0; a score of exactly 0 is a mistake; on a mistake
(y·score ≤ 0: :func:`~perceptron_stream.learning.labels.is_mistake`, the one
definition) update w ← w + y·x, b ← b + y.  Labels are -1/+1 inside.  The
step's hot paths write that comparison inline (a call would cost every event);
tests/learning/test_perceptron.py checks they agree with ``is_mistake``.

Why a class of our own rather than ``river.linear_model.Perceptron``: the
service calls :meth:`Perceptron.step` once per event (predict with the
published weights, then learn) on plain Python lists with a feature→index
map, which is several times faster than river's dict-of-weights machinery,
and the whole model is a JSON-able state (no pickle).  On the same events the
plain variant makes exactly river's mistakes and ends with river's weights
(same float operations in the same order; see tests/learning/test_river.py).

Variants (``variant=``), and when each one helps:

- ``"plain"``: the seeds' rule.  Best when the stream is separable (at most
  (R/γ)² updates) or drifts: it reacts to the latest mistake at once.
- ``"margin"``: also updates when 0 < y·score ≤ γ (``margin=γ``), pushing the
  boundary away from the points; helps generalisation on separable data with
  a thin margin, at the price of more updates.
- ``"averaged"``: Freund & Schapire: predicts with the average of all the
  weight vectors w_0..w_T (lazy trick: O(d) per update, not per event).
  Helps with label noise / non-separable streams, where the last weights
  oscillate; reacts more slowly to drift.
- ``"pocket"``: Gallant's online pocket: learns like plain but predicts with
  the weights that had the longest run of correct predictions.  Helps on
  non-separable data with a stable concept; a bad update cannot hurt the
  published prediction until the new weights prove themselves.

For the variants that predict with other weights than they learn with,
``mistakes`` counts the published predictions' mistakes and ``updates`` the
learning weights' updates (the model version).

In river: ``preprocessing.StandardScaler() | Perceptron()``,
``evaluate.progressive_val_score`` and ``clone()`` work on river's data sets
as they are.  Labels: ``learn_one`` takes -1/+1, True/False or 1/0, and
``predict_one`` answers in the kind of label the model learned from, as a
river classifier predicts the labels it saw: True/False after bool labels
(river's data sets), -1/+1 otherwise and before any learning.  So a metric
compares like with like (-1 against False would count a miss); the one
difference from river's Perceptron is the very first prediction, -1 where
river's says False.  ``step``,
the service's hot path, takes and answers -1/+1 whatever ``learn_one`` saw.

Which features the model holds (a bounded model):

- only labeled events add features: an unlabeled one (``y`` None) is scored
  on the features the model knows, the others weighing 0 (what
  :meth:`Perceptron.predict_one` has always done), and leaves the model's
  features as they were, for dicts and for dense lists longer than the known
  positions alike.  A feature that has never been learned from has weight 0
  anyway: registering it from an unlabeled event only made the model (and
  its checkpoint) grow, without bound on a stream of open-ended names.
- ``max_features`` (None: no cap) caps how many features the model holds.
  Once it holds that many, a labeled event's new features are dropped: the
  event is predicted and learned from on its known features (plus new ones
  up to the cap, in the event's order), and ``dropped_features`` counts the
  features left out, one per (event, feature).  Dropping and counting rather
  than refusing the event (a dead letter): every event is still predicted
  and learned from, as far as the model can; on a stream of open-ended names
  nearly every event carries a new name once the cap is reached, so refusing
  them would refuse most of the stream, and a dead letter has no way back
  into the model anyway.  The count tells the operator the cap is binding
  (raise it, or hash the features: :class:`perceptron_stream.learning.HashedPerceptron`).
  A model restored with more features than its cap keeps them all and adds
  none.
- ``radius`` is measured on what the model takes in (known and admitted
  features).

>>> p = Perceptron()
>>> p.step([1.0, 2.0], 1)            # (y_pred, score, mistake): score 0 is a mistake, then learn
(-1, 0.0, True)
>>> p.step([1.0, 2.0], 1)
(1, 6.0, False)
>>> p.weights, p.bias, p.updates, p.seen
({0: 1.0, 1: 2.0}, 1.0, 1, 2)
>>> Perceptron.from_state(p.to_state()).to_state() == p.to_state()
True
>>> p.learn_one({0: 1.0, 1: 2.0}, False); p.predict_one({0: 1.0, 1: 2.0})
False
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from itertools import repeat
from math import hypot
from operator import add, mul, sub
from typing import Any

from perceptron_stream.learning.labels import is_mistake, to_label
from perceptron_stream.learning.many import ManySteps
from perceptron_stream.learning.many import in_order_sum as _sum  # the one definition of a score's sum
from river import base

VARIANTS = ("plain", "averaged", "pocket", "margin")
STATE_KIND = "perceptron"
STATE_FORMAT = 1

# The names state["labels"] takes: what predict_one answers in.
_SIGNED, _BOOL = "-1/+1", "bool"

#: The largest magnitude a weight, bias or sum of a perceptron's state read back (a checkpoint, a mix record, a model
#: file) may have. A float holds 1.8e308, and two weights of 1e308 already sum to inf: a score of null in a
#: prediction. Bounded here, a score over n features of values at most 1e100 (the largest --max-feature-value
#: allows) stays under n·1e250, finite for any n a model can hold. Learning cannot come near it: an update adds at
#: most 1e100 to a weight (the averaged variant's sums at most 2**63 times that), so 1e150 is ~1e31 updates away;
#: only a forged or damaged state holds more. (The scaler's statistics are held to finite numbers only: a variance
#: of values up to 1e100 is up to 1e200.)
MAX_STATE_MAGNITUDE = 1e150


class StateError(ValueError):
    """A state read back that is refused, and why (``reason``, as ``perceptron_rejected_state_total`` counts it):
    ``non_finite`` for a number that is not finite or beyond its bound (:data:`MAX_STATE_MAGNITUDE`: it would make a
    score infinite), ``implausible`` for counts that contradict each other, ``damaged`` for anything else."""

    def __init__(self, message: str, reason: str = "damaged") -> None:
        super().__init__(message)
        self.reason = reason


def state_reason(exc: BaseException) -> str:
    """Why ``exc`` refused a state: a :class:`StateError`'s reason (or any error's that carries one), else damaged.

    >>> state_reason(StateError("x", "non_finite")), state_reason(ValueError("x"))
    ('non_finite', 'damaged')
    """
    return getattr(exc, "reason", "damaged")


def is_state_number(value: Any) -> bool:
    """Whether ``value`` is a number a state may hold: an int or a float, finite, within MAX_STATE_MAGNITUDE.

    >>> [is_state_number(v) for v in (0, -2.5, 1e150, 1e151, float("nan"), True, "1", 10**400)]
    [True, True, True, False, False, False, False, False]
    """
    # the magnitude first: math.isfinite of an int too large for a float is an OverflowError, not False
    return type(value) in (int, float) and abs(value) <= MAX_STATE_MAGNITUDE and math.isfinite(value)


def _is_bool(y: Any) -> bool:
    """True for bool labels: Python's, and numpy's (river's pandas streams give those)."""
    t = type(y)
    return t is bool or (t.__module__ == "numpy" and t.__name__ in ("bool_", "bool"))


def _bad_label(y: Any) -> ValueError:
    return ValueError(f"step takes y = -1, +1 or None (map other spellings with to_label), got {y!r}")


def _dot(w: list[float], m: Perceptron | None, x: Any) -> float:
    """w·x without the bias, summed in x's order (river's order).

    ``m`` None: x is a dense list, x[i] is feature i.  Else x is a dict of
    features all known to the perceptron ``m`` (KeyError otherwise); when they
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


def _update(w: list[float], m: Perceptron | None, x: Any, y: float) -> None:
    """w += y·x (``m`` as in :func:`_dot`).  river computes w - x·(-y): for y = ±1, the floats of w ± x."""
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


def _as_dict(x: dict | list) -> dict:
    if type(x) is dict:
        return x
    return dict(enumerate(x)) if isinstance(x, list) else dict(x)


#: What :meth:`Perceptron.step` answers, made BEFORE learning from the event:
#: ``(y_pred, score, mistake)``, mistake None when the event had no label.  A
#: plain tuple: building a NamedTuple was a sixth of a step (bench/README.md).
StepResult = tuple[int, float, "bool | None"]
_Floats = list[float]  # for _Reader, whose method float hides the type in its class


def _check_cap(max_features: Any) -> None:
    if max_features is not None and (type(max_features) is not int or max_features < 1):
        raise ValueError(f"max_features must be None (no cap) or an integer >= 1, got {max_features!r}")


def _check_params(variant: Any, margin: Any) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}; got {variant!r}")
    if isinstance(margin, bool) or not isinstance(margin, numbers.Real) or not math.isfinite(margin) or margin < 0:
        raise ValueError(f"margin must be a finite number >= 0, got {margin!r}")
    if margin and variant != "margin":
        raise ValueError(f"margin={margin!r} is only used by variant='margin' (variant is {variant!r})")


class Perceptron(ManySteps, base.Classifier):
    """Online perceptron; ``variant`` picks the rule (see the module docstring).

    Inputs are dicts (feature name → number) or dense lists (features 0..d-1,
    the same features as the int keys 0..d-1 of a dict).  ``learn_one`` takes
    -1/+1, True/False or 1/0 labels; ``predict_one`` answers True/False when
    the last label ``learn_one`` took was a bool, else -1/+1 (a river
    classifier predicts the labels it saw).  ``step`` takes and answers -1/+1.
    ``margin`` (γ >= 0) is for ``variant="margin"`` only; a non-zero margin
    with another variant is a ValueError rather than silently ignored.
    ``max_features``: the most features the model holds (None: no cap); see
    the module docstring for what happens past it.

    Counters: ``seen`` (events through step/learn_one, labeled or not),
    ``labeled``, ``mistakes`` (of the published predictions), ``updates``
    (the model version), ``dropped_features`` (new features of labeled
    events left out because the model held ``max_features``).  ``radius``
    is R = max ||(1, x)||, ``weight_norm`` ||(b, w)|| of the predicting weights.

    >>> p = Perceptron("margin", margin=1.0)
    >>> p.learn_one({"age": 2.0}, True); p.learn_one({"age": 2.0}, 1)  # 2nd: y·score = 5 > 1
    >>> p.predict_one({"age": 2.0}), p.mistakes, p.updates, p.labeled
    (1, 1, 1, 2)
    >>> p.learn_one({"age": 2.0}, True); p.predict_one({"age": 2.0})
    True
    """

    def __init__(self, variant: str = "plain", margin: float = 0.0, max_features: int | None = None) -> None:
        _check_params(variant, margin)
        _check_cap(max_features)
        self.variant = variant
        self.margin = margin
        self.max_features = max_features  # most features the model holds (None: no cap)
        self._thr = float(margin)  # update when y·score <= _thr (0 for every variant but margin)
        self.features: list = []  # position -> feature
        self.feature_index: dict = {}  # feature -> position
        self._dense = 0  # features[i] == i for every i < _dense: lists index positions directly
        self._mode = VARIANTS.index(variant) % 3  # 0: plain/margin, 1: averaged, 2: pocket
        self._fast = 0 if self._mode == 0 else -1  # lists of up to _fast values take step's fast path
        self._bool_labels = False  # predict_one answers bools (learn_one's last label was one)
        self._w: list[float] = []  # running (learning) weights
        self._b = 0.0
        self._u: list[float] = []  # averaged: sum of c·y·x over updates
        self._ub = 0.0
        self._c = 1  # averaged: 1 + labeled events
        self._p: list[float] = []  # pocket weights
        self._pb = 0.0
        self._run = 0  # pocket: current run of correct predictions of the running weights
        self._best = 0  # pocket: run of the pocket weights
        self._p_is_w = True  # pocket holds the same values as the running weights
        self._xmax = 0.0  # max ||x|| seen (without the constant 1)
        self.seen = 0
        self._unlabeled = 0
        self.mistakes = 0
        self.updates = 0
        self.dropped_features = 0  # new features of labeled events left out: the model held max_features

    # ----------------------------------------------------------------- river API
    def predict_one(self, x: dict, **kwargs: Any) -> int | bool:
        """+1 iff the score of the predicting weights is > 0, else -1; True/False
        instead when ``learn_one`` last learned from a bool label."""
        if self._bool_labels:
            return self.score_one(x) > 0.0
        return 1 if self.score_one(x) > 0.0 else -1

    def learn_one(self, x: dict, y: Any, **kwargs: Any) -> None:
        """Learn from one event (counted in ``seen``); y: -1/+1, True/False or 1/0.

        The kind of y (bool or not) sets what :meth:`predict_one` answers in.
        """
        self.step(x, to_label(y))
        t = type(y)
        self._bool_labels = t is bool or (t is not int and _is_bool(y))

    def score_one(self, x: dict | list) -> float:
        """The score :meth:`step` would publish for x; changes nothing."""
        m: Perceptron | None = None
        if type(x) is not list or len(x) > self._dense:
            m, x = self, _as_dict(x)
        try:
            s = _dot(self._w, m, x) + self._b
        except KeyError:  # unknown features weigh 0: leave them out
            x = {k: v for k, v in _as_dict(x).items() if k in self.feature_index}
            s = _dot(self._w, m, x) + self._b
        if self._mode == 1:
            return s - (_dot(self._u, m, x) + self._ub) / self._c
        if self._mode == 2 and not self._p_is_w:
            return _dot(self._p, m, x) + self._pb
        return s

    # ------------------------------------------------------------------ hot path
    # Speed notes (bench/learner.py, bench/README.md "## Learner"): sums run in C
    # (sum(map(mul, ...))), so does the norm (hypot, the cheapest exact one); a
    # dense list of the plain or margin variant takes the first branch of step,
    # with no call and no variant dispatch (_fast is -1 for the other variants,
    # so no list is short enough); counters that move on every event are the
    # fewest possible (labeled is derived); the answer is a plain tuple (a
    # NamedTuple, even built with tuple.__new__, was a sixth of a step).
    # Profiled at d = 10: the dot product is about half of a step, hypot a
    # tenth, the Python around them (call, checks, counters) under a fifth, so
    # shaving bytecode (locals for globals, slots) measured as noise.
    #
    # The label is not checked on the path of a correct prediction (the common
    # one): a check there would cost every event, and y comes mapped already
    # (the service's decoder, learn_one's to_label).  It is checked where it is
    # free, on the update path, before anything changes: that catches y = 0 or
    # False (0/1 labels given as they are) on their first use, since 0·score is
    # always <= 0, and any other value that would move the weights.

    def knows_none_of(self, x: dict | list) -> bool:
        """Whether the model holds features and ``x`` has none of them: its score is then the bias alone.

        A dense list's values are the features 0..len-1, a dict's keys are
        names: a model of names never shares one with a dense event, nor a
        model of positions with a named one (what a model trained on one form
        and served the other does, silently, without this check).

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

    def step(self, x: dict | list, y: int | None) -> StepResult:
        """Score with the predicting weights, predict, then learn if ``y`` is given.

        ``y`` must be -1, +1 or None (unlabeled: predict only); map other
        spellings with :func:`to_label` first.  Not checked on every event (the
        hot path): a value that would update the weights (0, False, 2 on a
        mistake...) is a ValueError and changes nothing, but one on a correct
        prediction (y = 2 with a positive score) goes through as if it were
        its sign, and is echoed as ``y_pred``.
        """
        if type(x) is list and len(x) <= self._fast:
            w = self._w
            s = _sum(map(mul, w, x)) + self._b
            r = hypot(*x)
            if y is not None:
                ys = y * s
                if ys > self._thr:  # correct (and outside the margin): no update
                    if r > self._xmax:
                        self._xmax = r
                    self.seen += 1
                    return (y, s, False)
                # _thr >= 0: every mistake (ys <= 0) lands here.  w + x or w - x:
                # the floats river computes; a new list is cheaper than a slice
                # assignment, which copies the new values once more.
                if y == 1:
                    op = add
                elif y == -1:
                    op = sub
                else:
                    raise _bad_label(y)
                if len(x) == len(w):
                    self._w = list(map(op, w, x))
                else:  # a shorter list: the features after it keep their weights
                    w[: len(x)] = map(op, w, x)
                self._b += y
                self.updates += 1
                if r > self._xmax:
                    self._xmax = r
                self.seen += 1
                if ys <= 0.0:  # is_mistake(y, s), inlined
                    self.mistakes += 1
                    return (1 if s > 0.0 else -1, s, True)
                return (y, s, False)
            if r > self._xmax:
                self._xmax = r
            self.seen += 1
            self._unlabeled += 1
            return (1 if s > 0.0 else -1, s, None)
        mode = self._mode
        if mode:
            return self._step_averaged(x, y) if mode == 1 else self._step_pocket(x, y)
        # plain and margin: dicts, and lists longer than the known positions
        if type(x) is not dict:
            if type(x) is list:
                x = self._fit_list(x, y)
                if type(x) is list:
                    return self.step(x, y)  # now len(x) <= _fast
            else:
                x = _as_dict(x)
        w, m = self._w, self
        try:
            s = _dot(w, m, x) + self._b
        except KeyError:  # new features: rare, so the label is checked in full before any is registered
            x = self.admit(_as_dict(x), y)
            s = _dot(w, m, x) + self._b
        ys = None if y is None else y * s
        if ys is not None and ys <= self._thr:
            if y != 1 and y != -1:
                raise _bad_label(y)
            _update(w, m, x, y)
            self._b += y
            self.updates += 1
        r = hypot(*x.values())  # type: ignore[union-attr]  # a dict by now (the type() tests above; isinstance would cost every event)
        if r > self._xmax:
            self._xmax = r
        self.seen += 1
        if y is None:
            self._unlabeled += 1
            return (1 if s > 0.0 else -1, s, None)
        if ys <= 0.0:  # type: ignore[operator]  # is_mistake(y, s) inlined; ys a float (y is not None here; a second test would cost every event)
            self.mistakes += 1
            return (1 if s > 0.0 else -1, s, True)
        return (y, s, False)

    def relabel(self, x: dict | list, y: int, mistake: bool) -> StepResult:
        """Learn from a label that came after x's prediction was published (delayed labels).

        The prediction was counted then (in ``seen``, as unlabeled); now the
        event counts as labeled, ``mistake`` (whether the *published*
        prediction was wrong) is counted in ``mistakes``, and the weights
        learn by the seeds' rule with the current weights (update when
        y·score ≤ 0, which keeps the (R/γ)² bound). Returns what the current
        model says of x: (y_pred, score, its mistake).

        >>> p = Perceptron()
        >>> p.step([1.0, 2.0], None)                  # published: -1, score 0
        (-1, 0.0, None)
        >>> p.relabel([1.0, 2.0], 1, mistake=True)     # the label comes: learn, count the decision's mistake
        (-1, 0.0, True)
        >>> p.seen, p.labeled, p.mistakes, p.updates
        (1, 1, 1, 1)
        """
        seen, unlabeled, mistakes = self.seen, self._unlabeled, self.mistakes
        result = self.step(x, y)
        self.seen, self._unlabeled, self.mistakes = seen, max(0, unlabeled - 1), mistakes + bool(mistake)
        return result

    # Averaged and pocket check every label before anything changes (a few ns
    # beside their two dot products; they are not the service's default).

    def _step_averaged(self, x: dict | list, y: int | None) -> StepResult:
        if y is not None and y != 1 and y != -1:
            raise _bad_label(y)
        w, u, c = self._w, self._u, self._c
        if type(x) is list and len(x) > self._dense:
            x = self._fit_list(x, y)  # _add_feature appends to w and u in place
        if type(x) is list:
            # dense lists, inline (no _known/_dot/_count/_update calls): the same floats
            s = _sum(map(mul, w, x)) + self._b
            score = s - (_sum(map(mul, u, x)) + self._ub) / c  # averaged weights: w - u/c
            r = hypot(*x)
            if r > self._xmax:
                self._xmax = r
            self.seen += 1
            y_pred = 1 if score > 0.0 else -1
            if y is None:
                self._unlabeled += 1
                return (y_pred, score, None)
            mistake = y * score <= 0.0  # is_mistake(y, score), inlined
            if mistake:
                self.mistakes += 1
            if y * s <= 0.0:
                op, n = add if y == 1 else sub, len(x)
                if n == len(w):  # new lists: cheaper than slice assignments (see step)
                    # u + (yc)·x as a comprehension: a nested map (mul, then add) measured 1.5x
                    # slower, and made averaged cost 2.5x a plain step at d = 100; same floats
                    yc = float(y * c)
                    self._w, self._u = list(map(op, w, x)), [ui + yc * xi for ui, xi in zip(u, x)]
                else:  # u + (yc)·x: x·1 = x and u + (-x) = u - x exactly, so these are _update's floats
                    w[:n] = map(op, w, x)
                    u[:n] = map(add, u, map(mul, x, repeat(y * c)))
                self._b += y
                self._ub += y * c
                self.updates += 1
            self._c = c + 1
            return (y_pred, score, mistake)
        m, x = self, self._known(x, y)
        s = _dot(w, m, x) + self._b
        result = self._count(y, s - (_dot(u, m, x) + self._ub) / c, x)
        if y is not None:
            if y * s <= 0.0:
                _update(w, m, x, y)
                _update(u, m, x, y * c)
                self._b += y
                self._ub += y * c
                self.updates += 1
            self._c += 1
        return result

    def _step_pocket(self, x: dict | list, y: int | None) -> StepResult:
        if y is not None and y != 1 and y != -1:
            raise _bad_label(y)
        w, p, same = self._w, self._p, self._p_is_w
        if type(x) is list and len(x) > self._dense:
            x = self._fit_list(x, y)  # _add_feature appends to w and p in place
        if type(x) is list:
            # dense lists, inline (no _known/_dot/_count/_update calls): the same floats
            s = _sum(map(mul, w, x)) + self._b
            score = s if same else _sum(map(mul, p, x)) + self._pb
            r = hypot(*x)
            if r > self._xmax:
                self._xmax = r
            self.seen += 1
            if y is None:
                self._unlabeled += 1
                return (1 if score > 0.0 else -1, score, None)
            mistake = y * score <= 0.0  # is_mistake(y, score), inlined
            if mistake:
                self.mistakes += 1
            result = (1 if score > 0.0 else -1, score, mistake)
            m = None
        else:
            m, x = self, self._known(x, y)
            s = _dot(w, m, x) + self._b
            result = self._count(y, s if same else _dot(p, m, x) + self._pb, x)
        if y is not None:
            if y * s <= 0.0:
                _update(w, m, x, y)
                self._b += y
                self.updates += 1
                self._run = 0
                self._p_is_w = False
            else:
                self._run += 1
                if self._run > self._best:
                    self._best = self._run
                    if not same:
                        p[:] = w
                        self._pb = self._b
                        self._p_is_w = True
        return result

    def _count(self, y: int | None, score: float, x: list | dict) -> StepResult:
        """Book-keeping of the variants whose published score is not the learning one."""
        r = hypot(*(x.values() if type(x) is dict else x))
        if r > self._xmax:
            self._xmax = r
        self.seen += 1
        y_pred = 1 if score > 0.0 else -1
        if y is None:
            self._unlabeled += 1
            return (y_pred, score, None)
        mistake = is_mistake(y, score)
        self.mistakes += mistake
        return (y_pred, score, mistake)

    def _known(self, x: dict | Any, y: int | None) -> dict:
        """x as a dict of features the model holds (see :meth:`admit`)."""
        x = _as_dict(x)
        if all(map(self.feature_index.__contains__, x)):
            return x
        return self.admit(x, y)

    # --------------------------------------------------------------- features
    # Only two places register features, both off the hot path (an event with a
    # feature the model does not know yet): admit (dicts) and _fit_list (lists
    # longer than the known positions).  So the cap costs nothing per event.

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
            raise _bad_label(y)
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
            return _as_dict(x)
        if y is None:
            return x[:d]
        if y != 1 and y != -1:
            raise _bad_label(y)
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
        for arr in (self._w, self._u, self._p):
            arr.append(0.0)
        if k == i and type(k) is int and self._dense == i:
            self._dense += 1
            if self._mode == 0:
                self._fast = self._dense
        return i

    # ------------------------------------------------------------------ stats
    def _predicting(self) -> tuple[list[float], float]:
        """(weights by position, bias) that make the published predictions (not copies)."""
        if self.variant == "averaged":
            c = self._c
            return [wi - ui / c for wi, ui in zip(self._w, self._u)], self._b - self._ub / c
        if self.variant == "pocket":
            return self._p, self._pb
        return self._w, self._b

    def weight_snapshot(self):
        """The predicting weights as they are now, for a reader in another thread (GET /model).

        Takes only list copies now (C speed: about 0.1 ms for 50,000 features,
        under the lock the loop waits on) and returns a function that computes
        ``(features, weights, bias)`` from them later, off the lock (the
        averaged variant's average is O(d) Python).

        >>> p = Perceptron("averaged"); _ = p.step([1.0], 1); later = p.weight_snapshot()
        >>> _ = p.step([-1.0], 1)  # learns on: the snapshot keeps the weights it was taken with
        >>> later()
        ([0], [0.5], 0.5)
        """
        keys = self.features.copy()
        if self._mode == 1:
            w, u, c, b, ub = self._w.copy(), self._u.copy(), self._c, self._b, self._ub
            return lambda: (keys, [wi - ui / c for wi, ui in zip(w, u)], b - ub / c)
        w, b = self._predicting()
        w = w.copy()
        return lambda: (keys, w, b)

    @property
    def weights(self) -> dict:
        """Feature → weight of the predicting weights."""
        return dict(zip(self.features, self._predicting()[0]))

    @property
    def bias(self) -> float:
        return self._predicting()[1]

    @property
    def weight_norm(self) -> float:
        """||(b, w)|| of the predicting weights."""
        w, b = self._predicting()
        return hypot(b, *w)

    @property
    def radius(self) -> float:
        """R = max ||x'|| over the events seen, x' = (1, x); 0 before any event."""
        return hypot(1.0, self._xmax) if self.seen else 0.0

    @property
    def labeled(self) -> int:
        """Events seen with a label (derived: one counter less on the hot path)."""
        return self.seen - self._unlabeled

    # ------------------------------------------------------------------ state
    @classmethod
    def from_weights(
        cls,
        weights: dict | list,
        bias: float = 0.0,
        variant: str = "plain",
        margin: float = 0.0,
        max_features: int | None = None,
    ) -> Perceptron:
        """A perceptron that starts from the given weights instead of 0 (seed 002's θ, θ0).

        >>> p = Perceptron.from_weights([1.0, -1.0], bias=1.0)
        >>> p.step([1.0, 3.0], 1), p.weights, p.bias
        ((-1, -1.0, True), {0: 2.0, 1: 2.0}, 2.0)
        """
        p = cls(variant, margin, max_features)
        items = enumerate(weights) if isinstance(weights, list) else weights.items()
        values = list(weights) if isinstance(weights, list) else list(weights.values())
        if not all(map(is_state_number, values)) or not is_state_number(bias):
            raise StateError(
                f"weights and bias must be finite numbers of magnitude at most {MAX_STATE_MAGNITUDE:g}", "non_finite"
            )
        for k, v in items:
            i = p._add_feature(k)
            p._w[i] = p._p[i] = float(v)
        p._b = p._pb = float(bias)
        return p

    def to_state(self) -> dict:
        """Everything the model holds, as plain JSON types (floats round trip exactly).

        ``labels`` ("-1/+1" or "bool") is what :meth:`predict_one` answers in;
        :meth:`from_state` reads a state without it (written before it existed)
        as "-1/+1", so the format number did not change.  Likewise
        ``max_features`` (absent: None, no cap) and the ``dropped_features``
        counter (absent: 0).
        """
        for k in self.features:
            if type(k) not in (str, int):
                raise ValueError(f"cannot checkpoint feature name {k!r}: names must be str or int")
        state: dict[str, Any] = {
            "kind": STATE_KIND,
            "format": STATE_FORMAT,
            "variant": self.variant,
            "margin": self.margin,
            "max_features": self.max_features,
            "features": list(self.features),
            "weights": list(self._w),
            "bias": self._b,
            "max_norm": self._xmax,
            "labels": _BOOL if self._bool_labels else _SIGNED,  # what predict_one answers in
            "counters": {
                "seen": self.seen,
                "labeled": self.labeled,
                "mistakes": self.mistakes,
                "updates": self.updates,
                "dropped_features": self.dropped_features,
            },
        }
        if self.variant == "averaged":
            state["averaged"] = {"sum": list(self._u), "bias_sum": self._ub, "c": self._c}
        if self.variant == "pocket":
            state["pocket"] = {
                "weights": list(self._p),
                "bias": self._pb,
                "run": self._run,
                "best_run": self._best,
                "same_as_running": self._p_is_w,
            }
        return state

    @classmethod
    def from_state(cls, state: dict) -> Perceptron:
        """Rebuild exactly what :meth:`to_state` saved; ValueError on a wrong or corrupt state.

        >>> Perceptron.from_state({"kind": "perceptron", "format": 99})
        Traceback (most recent call last):
        ...
        perceptron_stream.learning.perceptron.StateError: invalid perceptron state: format 99 is not supported (this version reads format 1)
        """
        st = _Reader("perceptron state", state)
        st.header(STATE_KIND, STATE_FORMAT)
        variant, margin = st.get("variant"), st.get("margin")
        try:  # max_features: absent from the states written before it existed (no cap then)
            p = cls(variant, margin, st.state.get("max_features"))
        except ValueError as exc:
            st.fail(str(exc))
        keys = st.get("features")
        if not isinstance(keys, list) or any(type(k) not in (str, int) for k in keys):
            st.fail("features must be a list of str or int names")
        if len(set(keys)) != len(keys):
            st.fail("features has duplicate names")
        for k in keys:
            p._add_feature(k)
        n = len(keys)
        p._w, p._b, p._xmax = st.floats("weights", n), st.float("bias"), st.float("max_norm")
        counters = _Reader("perceptron state counters", st.get("counters"))
        p.seen, labeled, p.mistakes, p.updates = (counters.count(c) for c in ("seen", "labeled", "mistakes", "updates"))
        if labeled > p.seen or p.mistakes > labeled:
            counters.fail("need mistakes <= labeled <= seen", "implausible")
        p._unlabeled = p.seen - labeled
        if "dropped_features" in counters.state:  # absent from the states written before it existed
            p.dropped_features = counters.count("dropped_features")
        labels = st.state.get("labels", _SIGNED)  # absent from the states written before it existed
        if labels not in (_SIGNED, _BOOL):
            st.fail(f"labels must be {_SIGNED!r} or {_BOOL!r}, got {labels!r}")
        p._bool_labels = labels == _BOOL
        if variant == "averaged":
            avg = _Reader("perceptron state averaged", st.get("averaged"))
            p._u, p._ub, p._c = avg.floats("sum", n), avg.float("bias_sum"), avg.count("c")
            if p._c < 1:
                avg.fail("c must be >= 1")
        if variant == "pocket":
            pk = _Reader("perceptron state pocket", st.get("pocket"))
            p._p, p._pb, p._run, p._best = (
                pk.floats("weights", n),
                pk.float("bias"),
                pk.count("run"),
                pk.count("best_run"),
            )
            p._p_is_w = pk.get("same_as_running")
            if type(p._p_is_w) is not bool:
                pk.fail("same_as_running must be true or false")
            if p._p_is_w and (p._p != p._w or p._pb != p._b):
                pk.fail("same_as_running is true but the pocket weights differ from the running ones")
        return p


class _Reader:
    """Typed reads from a JSON state, each failure a ValueError that says what is wrong."""

    def __init__(self, what: str, state: Any) -> None:
        self.what = what
        if not isinstance(state, dict):
            self.fail(f"expected a JSON object, got {type(state).__name__}")
        self.state = state

    def fail(self, msg: str, reason: str = "damaged") -> None:
        raise StateError(f"invalid {self.what}: {msg}", reason)

    def header(self, kind: str, fmt: int) -> None:
        if self.state.get("kind") != kind:
            self.fail(f"kind is {self.state.get('kind')!r}, expected {kind!r}")
        if self.state.get("format") != fmt:
            self.fail(f"format {self.state.get('format')!r} is not supported (this version reads format {fmt})")

    def get(self, key: str) -> Any:
        if key not in self.state:
            self.fail(f"{key!r} is missing")
        return self.state[key]

    def float(self, key: str) -> float:
        v = self.get(key)
        if not is_state_number(v):
            self.fail(
                f"{key} must be a finite number of magnitude at most {MAX_STATE_MAGNITUDE:g}, got {v!r}",
                "non_finite" if type(v) in (int, float) else "damaged",
            )
        return float(v)

    def floats(self, key: str, n: int) -> _Floats:
        v = self.get(key)
        if not isinstance(v, list) or len(v) != n:
            self.fail(f"{key} must be a list of {n} numbers (one per feature)")
        if not all(map(is_state_number, v)):
            numbers = all(type(e) in (int, float) for e in v)  # numbers out of bounds, or not numbers at all
            self.fail(
                f"{key} must hold finite numbers of magnitude at most {MAX_STATE_MAGNITUDE:g} only",
                "non_finite" if numbers else "damaged",
            )
        return [float(e) for e in v]

    def count(self, key: str) -> int:
        v = self.get(key)
        if type(v) is not int or v < 0:
            self.fail(f"{key} must be an integer >= 0, got {v!r}")
        return v
