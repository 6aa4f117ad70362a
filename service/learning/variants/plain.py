"""The seeds' rule, plain and with a margin: the running weights are the published ones, and nothing else is kept.

- ``"plain"``: update w ← w + y·x, b ← b + y on a mistake (y·score ≤ 0).  Best when the stream is separable (at most
  (R/γ)² updates) or drifts: it reacts to the latest mistake at once.
- ``"margin"``: also updates when 0 < y·score ≤ γ (``margin=γ``), pushing the boundary away from the points; helps
  generalisation on separable data with a thin margin, at the price of more updates.

This is the service's default and its hot path, so a dense list takes :meth:`Plain.step`'s first branch: no call,
no variant dispatch (the class was picked at construction), the label checked on the update path only. Speed notes
(bench/learner.py, bench/README.md "## Learner"): sums run in C (``sum(map(mul, ...))``), so does the norm
(``hypot``, the cheapest exact one); counters that move on every event are the fewest possible (labeled is
derived); the answer is a plain tuple. Profiled at d = 10: the dot product is about half of a step, hypot a tenth,
the Python around them (call, checks, counters) under a fifth, so shaving bytecode measured as noise.

A dict takes the shared step (:meth:`Perceptron.step <perceptron_stream.learning.Perceptron.step>`) written out
in :meth:`Plain.step`: for the one variant that keeps nothing beside w, the call and the questions to the variant
measured about 15% of a dict step (bench/learner.py's "step dict", the river interface's path); tests/learning/
test_variants.py checks the two agree. Other events (neither list nor dict, or a longer list whose new positions
would fall after a name) take the shared step itself.
The batch form, :class:`PlainBatch`, is the same rule over many events (:mod:`perceptron_stream.learning.many`).
"""

from __future__ import annotations

from math import hypot
from operator import add, mul, sub

import numpy as np
from perceptron_stream.learning.linear import bad_label, dot, update
from perceptron_stream.learning.many import Batch, Steps, gather, in_order_sum, learn_named
from perceptron_stream.learning.perceptron import Perceptron, StepResult
from perceptron_stream.learning.reasons import Reasons, top_parts

_shared_step = Perceptron.step


class PlainBatch(Batch):
    """Many events of the plain or margin rule: the running weights only; a correct prediction answers y itself."""

    __slots__ = ("thr",)
    echo = True

    def __init__(self, w: list[float], b: float, thr: float) -> None:
        super().__init__(w, b)
        self.thr = thr

    def fused(self, rows: list, ys: list, dense: bool) -> tuple[list, list]:
        """``step``'s operations over aligned rows (``dense``: the list path's comparison ``not y·s > γ``, where a
        NaN score updates; the dict path's ``y·s <= γ`` does not)."""
        score = [0.0] * len(rows)
        upd = [False] * len(rows)
        w, b, thr = self.w, self.b, self.thr
        i = 0
        for x, y in zip(rows, ys):
            s = in_order_sum(map(mul, w, x)) + b
            score[i] = s
            if y is not None:
                ys_ = y * s
                if (not ys_ > thr) if dense else ys_ <= thr:
                    w = list(map(add if y == 1 else sub, w, x))
                    b += y
                    upd[i] = True
            i += 1  # noqa: SIM113  # a counter: enumerate's tuple measured 20 ns an event more
        self.w, self.b = w, b
        return score, upd

    def ragged(self, index: dict, xs: list[dict], ys: list) -> tuple[list, list]:
        score = [0.0] * len(xs)
        upd = [False] * len(xs)
        w, b, thr = self.w, self.b, self.thr
        place = index.__getitem__
        for i, (x, y) in enumerate(zip(xs, ys)):
            s = in_order_sum(map(mul, map(w.__getitem__, map(place, x)), x.values())) + b
            score[i] = s
            if y is None or not y * s <= thr:
                continue
            learn_named(w, place, x, y)
            b += y
            upd[i] = True
        self.b = b
        return score, upd

    def wrong(self, ys, dense: bool):
        return ~(ys > self.thr) if dense else ys <= self.thr

    def publish(self, yscore, sums, W, labeled, i: int, j: int, end: int, hit: bool) -> None:
        yscore[i : i + end + hit] = sums[0][: end + hit]


class Plain(Perceptron):
    """The plain and margin variants (see the module docstring)."""

    def _batch(self, cols) -> PlainBatch:
        return PlainBatch(gather(self._w, cols), self._b, self._thr)

    def step(self, x: dict | list, y: int | None) -> StepResult:
        if type(x) is list:
            if len(x) > self._dense:  # new positions: the model grows (or not: unlabeled, the cap), then this path
                x = self._fit_list(x, y)
                if type(x) is not list:
                    return _shared_step(self, x, y)
            w = self._w
            s = in_order_sum(map(mul, w, x)) + self._b
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
                    raise bad_label(y)
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
        if type(x) is not dict:
            return _shared_step(self, x, y)
        # dicts: the shared step written out for plain, which keeps nothing beside w (the call and the variant's
        # questions measured 15% of a dict step); test_variants.py checks the two agree
        w = self._w
        try:
            s = dot(w, self, x) + self._b
        except KeyError:  # new features: rare, so the label is checked in full before any is registered
            x = self.admit(x, y)
            s = dot(w, self, x) + self._b
        ys = None if y is None else y * s
        if ys is not None and ys <= self._thr:
            if y != 1 and y != -1:
                raise bad_label(y)
            update(w, self, x, y)
            self._b += y
            self.updates += 1
        r = hypot(*x.values())
        if r > self._xmax:
            self._xmax = r
        self.seen += 1
        if y is None:
            self._unlabeled += 1
            return (1 if s > 0.0 else -1, s, None)
        if ys <= 0.0:  # type: ignore[operator]  # is_mistake(y, s) inlined; ys a float (y is not None here)
            self.mistakes += 1
            return (1 if s > 0.0 else -1, s, True)
        return (y, s, False)

    step.__doc__ = Perceptron.step.__doc__

    def explain_many(self, xs: list, ys: list, k: int) -> tuple[Steps, Reasons]:
        """:meth:`step_many` of ``xs`` (which :meth:`can_step_many` takes: no feature registered), and each event's
        ``k`` largest parts of its score with its bias, as :meth:`explain` before its step gives them, ranked
        (:mod:`perceptron_stream.learning.reasons`)."""
        w0, b0, before = list(self._w), self._b, self.updates
        steps = self.step_many(xs, ys, True)
        updated = np.diff(steps.updates, prepend=before) != 0
        return steps, top_parts(xs, ys, updated, w0, b0, k, self.feature_index)
