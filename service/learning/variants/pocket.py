"""Gallant's online pocket: learn as plain does, predict with the weights that had the longest run of correct
predictions.

Helps on non-separable data with a stable concept: a bad update cannot hurt the published prediction until the new
weights prove themselves. Beside the running weights (w, b) the variant keeps its pocket (p, pb), the current run
of correct predictions of the running weights and the pocket's best run, and whether the pocket holds the running
weights (``_same``: then one dot product scores both). A run that beats the best puts the running weights in the
pocket.

Its dense-list path is inline (no ``dot`` call to score); other events take the shared step, which asks
:meth:`Pocket._published` and :meth:`Pocket._learned`. The batch form, :class:`PocketBatch`, keeps the same runs
over many events.
"""

from __future__ import annotations

from math import hypot
from operator import add, mul, sub
from typing import Any

import numpy as np
from perceptron_stream.learning.linear import bad_label, dot, update
from perceptron_stream.learning.many import Batch, gather, in_order_sum, learn_named, scatter
from perceptron_stream.learning.perceptron import Perceptron, StepResult
from perceptron_stream.learning.state import Reader

_shared_step = Perceptron.step


class PocketBatch(Batch):
    """Many events of the pocket rule: the running weights, the pocket (``p``, ``pb``), the runs, ``same``; ``took``:
    the pocket took the running weights in this batch (the model's weights outside the batch's columns too)."""

    __slots__ = ("best", "p", "pb", "run", "same", "took")

    def __init__(self, w: list[float], b: float, p: list[float], pb: float, run: int, best: int, same: bool) -> None:
        super().__init__(w, b)
        self.p, self.pb, self.run, self.best, self.same, self.took = p, pb, run, best, same, False

    def values(self) -> list[float]:
        return [*self.w, *self.p, self.b, self.pb]

    def fused(self, rows: list, ys: list, dense: bool) -> tuple[list, list]:
        score = [0.0] * len(rows)
        upd = [False] * len(rows)
        w, p, b, pb = self.w, self.p, self.b, self.pb
        run, best, same, took = self.run, self.best, self.same, self.took
        i = 0
        for x, y in zip(rows, ys):
            s = in_order_sum(map(mul, w, x)) + b
            score[i] = s if same else in_order_sum(map(mul, p, x)) + pb
            if y is not None:
                if y * s <= 0.0:
                    w = list(map(add if y == 1 else sub, w, x))
                    b += y
                    upd[i] = True
                    run, same = 0, False
                else:
                    run += 1
                    if run > best:
                        best = run
                        if not same:
                            p, pb, same, took = w, b, True, True  # w is never changed in place: a new list on update
            i += 1  # noqa: SIM113  # a counter: enumerate's tuple measured 20 ns an event more
        self.w, self.p, self.b, self.pb = w, p, b, pb
        self.run, self.best, self.same, self.took = run, best, same, took
        return score, upd

    def ragged(self, index: dict, xs: list[dict], ys: list) -> tuple[list, list]:
        score = [0.0] * len(xs)
        upd = [False] * len(xs)
        w, p, b, pb = self.w, self.p, self.b, self.pb
        run, best, same, took = self.run, self.best, self.same, self.took
        place = index.__getitem__
        for i, (x, y) in enumerate(zip(xs, ys)):
            s = in_order_sum(map(mul, map(w.__getitem__, map(place, x)), x.values())) + b
            score[i] = s if same else in_order_sum(map(mul, map(p.__getitem__, map(place, x)), x.values())) + pb
            if y is None:
                continue
            if not y * s <= 0.0:
                run += 1
                if run > best:
                    best = run
                    if not same:
                        p, pb, same, took = w[:], b, True, True  # a copy: w changes in place
                continue
            run, same = 0, False
            learn_named(w, place, x, y)
            b += y
            upd[i] = True
        self.p, self.b, self.pb = p, b, pb
        self.run, self.best, self.same, self.took = run, best, same, took
        return score, upd

    # the windows (perceptron_stream.learning.windows): the pocket scored beside w while it differs
    def vectors(self) -> list[list[float]]:
        return [[0.0, *self.w, self.b], [0.0, *self.p, self.pb]]

    def publish(self, yscore, sums, W, labeled, i: int, j: int, end: int, hit: bool) -> None:
        """Rows i..i+end-1 are correct: they lengthen the run; the first beyond the best puts w in the pocket."""
        ys, yp = sums[0], sums[1]
        run, best, same = self.run, self.best, self.same
        counted = np.cumsum(labeled[i : i + end])
        total = int(counted[-1]) if end else 0
        q = end
        if not same and run + total > best:
            q = int(np.searchsorted(counted, max(1, best - run + 1)))
        yscore[i : i + min(q + 1, end)] = (ys if same else yp)[: min(q + 1, end)]
        if q < end:
            yscore[i + q + 1 : i + end] = ys[q + 1 : end]
            W[1] = W[0]
            same = self.took = True
        run += total
        if run > best:
            best = run
        if hit:  # row i + end updates w: the run starts again and the pocket differs
            yscore[i + end] = ys[end] if same else yp[end]
            run, same = 0, False
        self.run, self.best, self.same = run, best, same

    def end(self, W, n_labeled: int) -> None:
        super().end(W, n_labeled)
        p = W[1].tolist()
        self.p, self.pb = p[1:-1], p[-1]


class Pocket(Perceptron):
    """The pocket variant (see the module docstring)."""

    _keeps = True
    _echo = False

    def __init__(self, variant: str = "pocket", margin: float = 0.0, max_features: int | None = None) -> None:
        self._p: list[float] = []  # the pocket's weights
        self._pb = 0.0
        self._run = 0  # current run of correct predictions of the running weights
        self._best = 0  # run of the pocket weights
        self._same = True  # the pocket holds the same values as the running weights
        super().__init__(variant, margin, max_features)

    def _kept(self) -> tuple[list[float], ...]:
        return (self._p,)

    def _batch(self, cols) -> PocketBatch:
        return PocketBatch(
            gather(self._w, cols), self._b, gather(self._p, cols), self._pb, self._run, self._best, self._same
        )

    def _unbatch(self, batch: PocketBatch, cols) -> None:  # type: ignore[override]  # its own batch
        super()._unbatch(batch, cols)
        if batch.took:  # the pocket took the running weights whole at its last swap: those outside the columns too
            self._p[:] = self._w
        scatter(self._p, cols, batch.p)
        self._pb, self._run, self._best, self._same = batch.pb, batch.run, batch.best, batch.same

    def step(self, x: dict | list, y: int | None) -> StepResult:
        # every label checked before anything changes (a few ns beside two dot products; not the service's default)
        if y is not None and y != 1 and y != -1:
            raise bad_label(y)
        if type(x) is not list or len(x) > self._dense:
            return _shared_step(self, x, y)
        # dense lists, inline scoring (no dot calls): the floats of the shared step
        w = self._w
        s = in_order_sum(map(mul, w, x)) + self._b
        score = s if self._same else in_order_sum(map(mul, self._p, x)) + self._pb
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
            update(w, None, x, y)
            self._b += y
            self.updates += 1
            self._learned(None, x, y, True)
        else:
            self._learned(None, x, y, False)
        return (y_pred, score, mistake)

    step.__doc__ = Perceptron.step.__doc__

    def _published(self, s: float, m: Perceptron | None, x: Any) -> float:
        return dot(self._p, m, x) + self._pb

    def _learned(self, m: Perceptron | None, x: Any, y: int, updated: bool) -> None:
        if updated:
            self._run = 0
            self._same = False
        else:
            self._run += 1
            if self._run > self._best:
                self._best = self._run
                if not self._same:
                    self._p[:] = self._w
                    self._pb = self._b
                    self._same = True

    def _predicting(self) -> tuple[list[float], float]:
        return self._p, self._pb

    def _started(self) -> None:
        self._p[:] = self._w
        self._pb = self._b

    def _save_kept(self, state: dict) -> None:
        state["pocket"] = {
            "weights": list(self._p),
            "bias": self._pb,
            "run": self._run,
            "best_run": self._best,
            "same_as_running": self._same,
        }

    def _read_kept(self, st: Reader, n: int) -> None:
        pk = Reader("perceptron state pocket", st.get("pocket"))
        self._p, self._pb, self._run, self._best = (
            pk.floats("weights", n),
            pk.float("bias"),
            pk.count("run"),
            pk.count("best_run"),
        )
        self._same = pk.get("same_as_running")
        if type(self._same) is not bool:
            pk.fail("same_as_running must be true or false")
        if self._same and (self._p != self._w or self._pb != self._b):
            pk.fail("same_as_running is true but the pocket weights differ from the running ones")
