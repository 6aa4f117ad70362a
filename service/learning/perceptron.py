"""The online perceptron of the seeds, as a river classifier: what every variant shares, and the shared step.

h(x) = sign(w·x + b), the bias b being the weight of a constant feature x0 = 1.
Start from w = 0, b = 0; a score of exactly 0 is a mistake; on a mistake
(y·score ≤ 0: :func:`~perceptron_stream.learning.labels.is_mistake`, the one
definition) update w ← w + y·x, b ← b + y.  Labels are -1/+1 inside.  The
step's hot paths write that comparison inline (a call would cost every event);
tests/learning/test_properties.py checks they agree with ``is_mistake``.

Why a class of our own rather than ``river.linear_model.Perceptron``: the
service calls :meth:`Perceptron.step` once per event (predict with the
published weights, then learn) on plain Python lists with a feature→index
map, which is several times faster than river's dict-of-weights machinery,
and the whole model is a JSON-able state (no pickle).  On the same events the
plain variant makes exactly river's mistakes and ends with river's weights
(same float operations in the same order; see tests/learning/test_river.py).

Variants (``variant=``), one small class each in :mod:`perceptron_stream.learning.variants`
(``Perceptron(variant)`` makes the variant's class): what it keeps beside the
running weights, its fast path for dense lists, and its batch form beside it.

- ``"plain"`` and ``"margin"`` (:mod:`~perceptron_stream.learning.variants.plain`):
  the seeds' rule; margin also updates when 0 < y·score ≤ γ (``margin=γ``).
- ``"averaged"`` (:mod:`~perceptron_stream.learning.variants.averaged`): Freund &
  Schapire's average of all the weight vectors, kept as lazy sums.
- ``"pocket"`` (:mod:`~perceptron_stream.learning.variants.pocket`): Gallant's
  online pocket, the weights with the longest run of correct predictions.

Every event off a variant's fast path (dicts, lists the model must grow for)
takes the one shared step, :meth:`Perceptron.step` here: score with the running
weights, let the variant say what it publishes, update on a mistake, let the
variant keep what it keeps.  For the variants that predict with other weights
than they learn with, ``mistakes`` counts the published predictions' mistakes
and ``updates`` the learning weights' updates (the model version).  Which
features the model takes in, and the cap on them: :mod:`~perceptron_stream.learning.linear`;
its JSON state: :mod:`~perceptron_stream.learning.saved`; its batch form,
``step_many``: :mod:`~perceptron_stream.learning.many`.

In river: ``preprocessing.StandardScaler() | Perceptron()``,
``evaluate.progressive_val_score`` and ``clone()`` work on river's data sets
as they are.  Labels: ``learn_one`` takes -1/+1, True/False or 1/0, and
``predict_one`` answers in the kind of label the model learned from, as a
river classifier predicts the labels it saw: True/False after bool labels
(river's data sets), -1/+1 otherwise and before any learning.  So a metric
compares like with like (-1 against False would count a miss); the one
difference from river's Perceptron is the very first prediction, -1 where
river's says False.  ``step``, the service's hot path, takes and answers -1/+1
whatever ``learn_one`` saw.

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
from math import hypot
from typing import Any

from perceptron_stream.learning.labels import to_label
from perceptron_stream.learning.linear import Linear, as_dict, bad_label, dot, update
from perceptron_stream.learning.many import Batch, ManySteps, scatter
from perceptron_stream.learning.saved import STATE_FORMAT, STATE_KIND, Saved  # noqa: F401  # re-exported
from perceptron_stream.learning.state import (  # noqa: F401  # re-exported: where the service reads them
    MAX_STATE_MAGNITUDE,
    StateError,
    is_state_number,
    state_reason,
)
from river import base

VARIANTS = ("plain", "averaged", "pocket", "margin")

#: What :meth:`Perceptron.step` answers, made BEFORE learning from the event:
#: ``(y_pred, score, mistake)``, mistake None when the event had no label.  A
#: plain tuple: building a NamedTuple was a sixth of a step (bench/README.md).
StepResult = tuple[int, float, "bool | None"]


def _is_bool(y: Any) -> bool:
    """True for bool labels: Python's, and numpy's (river's pandas streams give those)."""
    t = type(y)
    return t is bool or (t.__module__ == "numpy" and t.__name__ in ("bool_", "bool"))


def _check_params(variant: Any, margin: Any) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(VARIANTS)}; got {variant!r}")
    if isinstance(margin, bool) or not isinstance(margin, numbers.Real) or not math.isfinite(margin) or margin < 0:
        raise ValueError(f"margin must be a finite number >= 0, got {margin!r}")
    if margin and variant != "margin":
        raise ValueError(f"margin={margin!r} is only used by variant='margin' (variant is {variant!r})")


class Perceptron(Linear, ManySteps, Saved, base.Classifier):
    """Online perceptron; ``variant`` picks the rule (see the module docstring).

    Inputs are dicts (feature name → number) or dense lists (features 0..d-1,
    the same features as the int keys 0..d-1 of a dict).  ``learn_one`` takes
    -1/+1, True/False or 1/0 labels; ``predict_one`` answers True/False when
    the last label ``learn_one`` took was a bool, else -1/+1 (a river
    classifier predicts the labels it saw).  ``step`` takes and answers -1/+1.
    ``margin`` (γ >= 0) is for ``variant="margin"`` only; a non-zero margin
    with another variant is a ValueError rather than silently ignored.
    ``max_features``: the most features the model holds (None: no cap); see
    :mod:`~perceptron_stream.learning.linear` for what happens past it.

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

    # What a variant says of itself (these: the running weights publish, nothing else is kept, as plain does).
    _same = True  # the published score is the running one (pocket: while its pocket holds the running weights)
    _keeps = False  # the variant keeps something that learns beside the running weights (:meth:`_learned`)
    _echo = True  # a correct prediction answers y itself (plain and margin; the others the sign of their score)

    def __new__(cls, variant: str = "plain", margin: float = 0.0, max_features: int | None = None) -> Perceptron:
        """``Perceptron(variant)`` is the variant's class (a river ``clone`` calls that class itself)."""
        if cls is Perceptron:
            from perceptron_stream.learning.variants import CLASSES  # they subclass this one: imported when used

            _check_params(variant, margin)
            cls = CLASSES[variant]
        return super().__new__(cls)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A variant's class is a Perceptron by name too: river names an estimator by its class's ``__name__`` (a
        pipeline's step, ``pipeline["Perceptron"]``; ``repr``, ``str``). Its ``__qualname__`` and module still say
        which variant it is."""
        super().__init_subclass__(**kwargs)
        cls.__name__ = "Perceptron"

    def __init__(self, variant: str = "plain", margin: float = 0.0, max_features: int | None = None) -> None:
        _check_params(variant, margin)
        super().__init__(max_features)
        self.variant = variant
        self.margin = margin
        self._thr = float(margin)  # update when y·score <= _thr (0 for every variant but margin)
        self._bool_labels = False  # predict_one answers bools (learn_one's last label was one)
        self._xmax = 0.0  # max ||x|| seen (without the constant 1)
        self.seen = 0
        self._unlabeled = 0
        self.mistakes = 0
        self.updates = 0

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
            m, x = self, as_dict(x)
        try:
            s = dot(self._w, m, x) + self._b
        except KeyError:  # unknown features weigh 0: leave them out
            x = {k: v for k, v in as_dict(x).items() if k in self.feature_index}
            s = dot(self._w, m, x) + self._b
        return s if self._same else self._published(s, m, x)

    # ------------------------------------------------------------------ the shared step
    # The label is not checked on the path of a correct prediction (the common
    # one): a check there would cost every event, and y comes mapped already
    # (the service's decoder, learn_one's to_label).  It is checked where it is
    # free, on the update path, before anything changes: that catches y = 0 or
    # False (0/1 labels given as they are) on their first use, since 0·score is
    # always <= 0, and any other value that would move the weights.

    def step(self, x: dict | list, y: int | None) -> StepResult:
        """Score with the predicting weights, predict, then learn if ``y`` is given.

        ``y`` must be -1, +1 or None (unlabeled: predict only); map other
        spellings with :func:`to_label` first.  Not checked on every event (the
        hot path): a value that would update the weights (0, False, 2 on a
        mistake...) is a ValueError and changes nothing, but one on a correct
        prediction (y = 2 with a positive score) goes through as if it were
        its sign, and is echoed as ``y_pred``.

        This is the shared step, which every event off a variant's fast path
        takes (each variant's ``step`` overrides this one with its dense-list
        path first, the same floats, and comes here for the rest).
        """
        m: Perceptron | None = self
        if type(x) is list:
            x = self._fit_list(x, y)
            if type(x) is list:
                m = None
        elif type(x) is not dict:
            x = as_dict(x)
        w = self._w
        try:
            s = dot(w, m, x) + self._b
        except KeyError:  # new features: rare, so the label is checked in full before any is registered
            x = self.admit(as_dict(x), y)
            s = dot(w, m, x) + self._b
        score = s if self._same else self._published(s, m, x)
        if y is not None:
            learns = y * s <= self._thr
            if learns:
                if y != 1 and y != -1:
                    raise bad_label(y)
                update(w, m, x, y)
                self._b += y
                self.updates += 1
            if self._keeps:
                self._learned(m, x, y, learns)
        r = hypot(*(x if m is None else x.values()))  # type: ignore[union-attr]  # m None: a list, else a dict
        if r > self._xmax:
            self._xmax = r
        self.seen += 1
        y_pred = 1 if score > 0.0 else -1
        if y is None:
            self._unlabeled += 1
            return (y_pred, score, None)
        if y * score <= 0.0:  # is_mistake(y, score), inlined
            self.mistakes += 1
            return (y_pred, score, True)
        return (y if self._echo else y_pred, score, False)

    def _published(self, s: float, m: Perceptron | None, x: Any) -> float:
        """The score the variant publishes for x (``m`` as in :func:`~perceptron_stream.learning.linear.dot`), given
        the running weights' score ``s``: asked only when ``_same`` is False."""
        return s

    def _learned(self, m: Perceptron | None, x: Any, y: int, updated: bool) -> None:
        """What the variant keeps, after the running weights learned from (x, y) (``updated``: on a mistake, or
        within the margin): asked only when ``_keeps`` is True."""

    def _unbatch(self, batch: Batch, cols) -> None:
        """Take the running weights back from a batch of steps (:mod:`~perceptron_stream.learning.many`); a variant
        takes back what it keeps too."""
        self._b = batch.b
        scatter(self._w, cols, batch.w)

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

    # ------------------------------------------------------------------ reason codes
    def explain(self, x: dict | list) -> tuple[list[tuple], float]:
        """The parts of the score :meth:`score_one` (and :meth:`step`, before it learns) publishes for x, changing
        nothing: ``(feature, value, weight, contribution)`` for each of x's features in x's order (``weight`` the
        predicting weight, 0.0 for a feature the model does not hold; ``contribution`` weight × value, the
        product the score adds), and the predicting bias.

        Added left to right from +0.0, then the bias (the score's definition:
        :mod:`~perceptron_stream.learning.many`), the contributions give the published score to the last bit for
        the plain, margin and pocket variants: they are its very products (a feature the model does not hold adds
        0.0, which changes no sum). The averaged variant publishes ``(w·x + b) − (u·x + u_b)/c``, the lazy form of
        its average (weights ``w − u/c``, bias ``b − u_b/c``): its parts add up to that within rounding.

        >>> p = Perceptron(); _ = p.step({"debt": 2.0, "income": 1.0}, -1)
        >>> parts, bias = p.explain({"income": 3.0, "debt": 1.0, "age": 5.0})
        >>> parts, bias, sum(c for *_, c in parts) + bias == p.score_one({"income": 3.0, "debt": 1.0, "age": 5.0})
        ([('income', 3.0, -1.0, -3.0), ('debt', 1.0, -2.0, -2.0), ('age', 5.0, 0.0, 0.0)], -1.0, True)
        """
        weight, bias = self._predicting_at()
        index = self.feature_index
        parts = []
        for feature, value in enumerate(x) if type(x) is list else as_dict(x).items():
            i = index.get(feature)
            w = 0.0 if i is None else weight(i)
            parts.append((feature, value, w, w * value))
        return parts, bias

    def explain_step(self, x: dict | list, y: int | None) -> tuple[StepResult, list[tuple], float]:
        """:meth:`step`, with the parts of the score it published (:meth:`explain`, before it learned)."""
        parts, bias = self.explain(x)
        return self.step(x, y), parts, bias

    def _predicting_at(self):
        """(the predicting weight at a position, as a function; the predicting bias), without a copy of the
        weights: a reason code asks for an event's features only."""
        w, b = self._predicting()
        return w.__getitem__, b

    # ------------------------------------------------------------------ stats
    def _predicting(self) -> tuple[list[float], float]:
        """(weights by position, bias) that make the published predictions (not copies)."""
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
