"""Many events stepped at once, exactly as :meth:`Perceptron.step <perceptron_stream.learning.Perceptron.step>`
steps them one at a time.

Not batch learning (:mod:`.batch` is PLA over a data set): the online rule, event by event, without a call, a
tuple and a counter per event. The weights change only where an event updates them, so from any event on the
following events are scored by the current weights until the next update: score a window of them with NumPy,
find the first that updates, update there, and go on from the event after it.

**One written definition of the score**, for every path::

    score(w, b, x) = ((((+0.0 + w[k1]·x1) + w[k2]·x2) + ...) + w[kn]·xn) + b

each product rounded on its own, added left to right in x's order (a dense list's positions, a dict's keys as
they came), from +0.0, the bias last. One event at a time that is ``in_order_sum(map(mul, w, x)) + b``:
``sum`` up to Python 3.11, which adds floats in order from the int 0 (``0 + p`` is ``0.0 + p``: a first product
of -0.0 becomes +0.0); a plain loop from 3.12, whose ``sum`` compensates its rounding. With NumPy: the products
of a window of rows at once (each elementwise operation is one IEEE operation, as Python's float ones), then
``np.add.accumulate`` along each row: a prefix sum cannot be reassociated, so each row is added left to right.
A leading column of +0.0 (weight +0.0) starts every sum at +0.0; a trailing column of 1.0 whose weight is the
bias adds it last. A matrix product (BLAS dot/gemv) adds in blocks, in another order, and rounds otherwise: its
last bits differ from the per-event path's, so none is used.

**Signs.** NumPy's rows are multiplied by their label first (y = ±1; +1 for an unlabeled event). Negation is
exact and rounding symmetric, so a flipped row sums to y·score exactly, the quantity every rule compares, except a
score of exactly zero, which comes out +0.0 where y·(+0.0) is -0.0 (equal in every comparison). The score is then
y·(y·score) + 0.0: a sum from +0.0 never reaches -0.0, so the per-event score is never -0.0, and adding +0.0 turns
the one flipped zero back. An update is one addition of the flipped row (w + y·x, b + y), the averaged variant's
lazy sum one more (u + c·y·x: c·(y·x) and (y·c)·x are one product up to its sign).

**Two exact paths, chosen by speed.** Reading Python floats into an array costs about half a Python dot product
per value, and a NumPy window about a dozen calls: windows pay when runs between updates are long (a clean or
converged stream), not on a noisy stream that updates every few events. So ``step_many`` runs the events either
through the NumPy windows, or through one fused Python loop of the per-event operations (no call, tuple or
attribute write per event), by the runs the model's last batches had (:data:`NUMPY_RUN`). Both give the floats
of ``step``; the choice never changes a result.

Where each part lives: this module decides which form a batch takes and which of the two paths, and runs the
batch (:meth:`ManySteps.step_many`); each variant's :class:`Batch` (in :mod:`perceptron_stream.learning.variants`,
beside its one-at-a-time step) holds what it keeps over the batch and its fused loops; :mod:`.windows` runs the
NumPy windows for every variant; :mod:`.steps` holds what a batch answers and the one-at-a-time reference.

What takes the batch form (:meth:`ManySteps.can_step_many`), and what stays per event:

- dense lists of one length within the model's known positions, and dicts whose names the model holds already;
  every variant (plain, margin, averaged with its lazy sums and its count c, pocket with its runs);
- an event that would register a feature (a new name, a longer list: the model grows and its cap decides what it
  takes, in event order), a label other than -1/+1/None, a model with a non-finite weight: the batch goes through
  ``step`` one event at a time (:func:`step_each`, the reference);
- a point's join with a label that came before it (``joins``): its relabel is interleaved right after its step
  and learns in the same pass (a relabel's learning is a step's), counted as ``relabel`` counts;
- R (the radius): a maximum, which does not depend on the order. The fused loop takes ``math.hypot`` of each
  event as ``step`` does; the windows take NumPy's norm of every row, a bound within a relative
  :data:`~perceptron_stream.learning.windows.NORM_TOLERANCE`, and ``math.hypot`` of the rows that could beat the
  maximum only.
"""

from __future__ import annotations

import sys
from itertools import chain, starmap
from math import hypot
from typing import Any

import numpy as np
from perceptron_stream.learning.labels import is_mistake
from perceptron_stream.learning.steps import (  # noqa: F401  # re-exported: where the service reads them
    Steps,
    as_joins,
    interleave,
    relabel_each,
    relabel_many,
    signed_labels,
    step_each,
)
from perceptron_stream.learning.windows import layout_of, run_windows

#: Windows pay when the model's recent batches ran at least this many labeled events between updates.
NUMPY_RUN = 32


def _loop_sum(values: Any) -> float:
    """sum() as Python up to 3.11 does it for floats: left to right from 0, no compensation."""
    s = 0.0
    for v in values:
        s += v
    return s


#: The in-order sum of the definition: ``sum`` up to 3.11, a loop from 3.12 (whose sum compensates rounding).
in_order_sum = sum if sys.version_info < (3, 12) else _loop_sum


class ManySteps:
    """:meth:`step_many`, the batch form of ``step``, for :class:`~perceptron_stream.learning.Perceptron`."""

    # the Perceptron's state, as this mixin reads and writes it
    _dense: int
    feature_index: dict
    _xmax: float
    _unlabeled: int
    seen: int
    mistakes: int
    updates: int
    #: labeled events per update in the last batches (not state: it only picks the faster of two exact paths)
    _events_per_update: float = 0.0

    def step(self, x: Any, y: int | None) -> tuple:
        """The per-event reference: :meth:`Perceptron.step <perceptron_stream.learning.Perceptron.step>`."""
        raise NotImplementedError

    def _batch(self, cols) -> Batch:
        """The variant's :class:`Batch` of the model's weights at ``cols`` (each variant makes its own)."""
        raise NotImplementedError

    def _unbatch(self, batch: Batch, cols) -> None:
        """Take the weights back from ``batch``: the model after it."""
        raise NotImplementedError

    def can_step_many(self, xs: list, ys: list) -> bool:
        """Whether :meth:`step_many` steps ``xs`` in the batch form: labels -1/+1/None, and rows that register no
        feature (lists of one length within the known positions, or dicts of names the model holds). Else it
        steps them one at a time (the same results)."""
        return self._kind(xs, ys) is not None

    def _kind(self, xs: list, ys: list, names: bool = True) -> type | None:
        """list or dict: the batch's rows, if it takes the batch form; ``names`` False: the dicts' names are not
        looked at (an unknown one raises KeyError on the way, before the model changes)."""
        if not xs:
            return None
        kinds = set(map(type, xs))
        if len(kinds) != 1 or not signed_labels(ys):
            return None
        kind = kinds.pop()
        if kind is list:
            lens = set(map(len, xs))
            if len(lens) != 1 or not 0 < lens.pop() <= self._dense:
                return None
        elif kind is dict:
            if names and not all(
                map(self.feature_index.keys().__ge__, map(dict.keys, xs))
            ):  # every name held (C loops)
                return None
        else:
            return None
        return kind

    def step_many(self, xs: list, ys: list, checked: bool = False, joins: list | None = None) -> Steps:
        """``[step(x, y) for x, y in zip(xs, ys)]`` and the model after it, bit for bit, as :class:`Steps`.

        ``checked``: the caller made sure the rows are all lists of one length or all dicts, and the labels -1, +1
        or None (a task checks once for its champion and challengers: :meth:`can_step_many`). ``joins``: (index,
        y) of unlabeled events whose label came first: each relabeled right after its step (see
        :func:`step_each`), in the same pass (a relabel's learning is a step's)."""
        if joins:
            rows, labels, events_at, joins_at = interleave(xs, ys, joins)
            seen, mistakes, unlabeled = self.seen, self.mistakes, self._unlabeled
            steps, self.seen, self.mistakes = as_joins(
                self.step_many(rows, labels, checked),
                events_at,
                joins_at,
                np.array([y for _, y in joins]),
                seen,
                mistakes,
            )
            self._unlabeled = unlabeled + ys.count(None) - len(joins)  # each join's event was counted unlabeled first
            return steps
        if not checked:
            kind = self._kind(xs, ys, names=False)
        elif type(xs[0]) is dict:
            kind = dict
        else:
            kind = list if 0 < len(xs[0]) <= self._dense else None
        if kind is None:
            return step_each(self, xs, ys)
        try:
            return self._step_many(xs, ys, kind)
        except KeyError:  # a name the model does not hold (nothing changed yet): one at a time, it may register
            return step_each(self, xs, ys)

    def _step_many(self, xs: list, ys: list, kind: type) -> Steps:
        n = len(xs)
        labels = np.array([0 if y is None else y for y in ys], dtype=np.int64)
        labeled = labels != 0
        n_labeled = int(labeled.sum())
        windows = n_labeled == 0 or self._events_per_update >= NUMPY_RUN
        if kind is list:
            cols, rows, ragged = range(len(xs[0])), xs, None
        else:
            cols, rows, ragged = _columns(xs, self.feature_index, windows)
        batch = self._batch(cols)
        if not np.isfinite(batch.values()).all():
            return step_each(self, xs, ys)
        if windows:
            layout = layout_of(xs, rows, ragged, len(cols), labels, labeled)
            score, upd = run_windows(batch, layout, labeled, n_labeled, kind is list)
            xmax = layout.norms()
        else:
            scores, flags = batch.fused(rows, ys, kind is list) if rows is not None else batch.ragged(ragged, xs, ys)
            score, upd = np.array(scores, dtype=np.float64), np.array(flags, dtype=bool)
            xmax = max(starmap(hypot, rows if rows is not None else map(dict.values, xs)))  # hypot(*x) each, in C
        self._unbatch(batch, cols)  # the model after the batch
        if xmax > self._xmax:
            self._xmax = xmax
        mistake = labeled & is_mistake(np.where(labeled, labels, 1), score)
        if batch.echo:  # plain and margin echo y when right (y too for a NaN score, as step does)
            y_pred = np.where(labeled & ~mistake, labels, np.where(score > 0.0, 1, -1))
        else:
            y_pred = np.where(score > 0.0, 1, -1)
        updates = self.updates + np.cumsum(upd)
        mistakes = self.mistakes + np.cumsum(mistake)
        seen = np.arange(self.seen + 1, self.seen + n + 1, dtype=np.int64)
        self._learnt(n_labeled, int(updates[-1]) - self.updates)
        self.updates, self.mistakes, self.seen = int(updates[-1]), int(mistakes[-1]), self.seen + n
        self._unlabeled += n - n_labeled
        if n_labeled == n:
            flags = mistake.tolist()
        elif n_labeled == 0:
            flags = [None] * n
        else:
            flags = [m if yes else None for m, yes in zip(mistake.tolist(), labeled.tolist())]
        return Steps(y_pred, score, flags, updates, seen, mistakes)

    def relabel_many(self, xs: list, ys: list, mistakes: list[bool]) -> tuple[list[int], list[int]]:
        """:meth:`relabel <perceptron_stream.learning.Perceptron.relabel>` of each: :meth:`step_many` of the labeled
        events (its weights are those of one step after another), the events counted as they were when predicted
        (``seen`` as it was, one unlabeled fewer each) and the decisions' ``mistakes``. The model's updates and
        mistakes after each."""
        if not xs:
            return [], []
        seen, unlabeled, before = self.seen, self._unlabeled, self.mistakes
        updates = self.step_many(xs, ys).updates.tolist()
        counted = (before + np.cumsum(np.array(mistakes, dtype=bool))).tolist()
        self.seen, self._unlabeled, self.mistakes = seen, max(0, unlabeled - len(xs)), counted[-1]
        return updates, counted

    def _learnt(self, labeled: int, updates: int) -> None:
        """The batch's labeled events per update, for the next batch's choice of path (the recent counts most)."""
        if labeled:
            rate = labeled / updates if updates else float(labeled)
            self._events_per_update = (self._events_per_update + rate) / 2


class Batch:
    """The weights a batch steps, aligned with its columns (the model positions of the batch's values): the running
    ``w`` and ``b``; the model hands them over (its ``_batch``) and takes them back after (``_unbatch``). Each
    variant's subclass adds what it keeps beside them, and holds its loops:
    :meth:`fused` (``step``'s operations in one loop over aligned rows), :meth:`ragged` (the same over dicts of
    several shapes, on every weight) and the hooks of the NumPy windows (:func:`~.windows.run_windows`)."""

    __slots__ = ("b", "w")
    #: a correct prediction answers y itself (plain and margin), else the sign of the published score
    echo = False

    def __init__(self, w: list[float], b: float) -> None:
        self.w, self.b = w, b

    def values(self) -> list[float]:
        """Every number the batch starts from (a non-finite one sends the batch one event at a time)."""
        return [*self.w, self.b]

    def fused(self, rows: list, ys: list, dense: bool) -> tuple[list, list]:
        """The scores and update flags of ``rows`` (value lists aligned with ``w``), one event after another.
        ``dense``: the rows are lists (the list path's comparison, for the variants that make one)."""
        raise NotImplementedError

    def ragged(self, index: dict, xs: list[dict], ys: list) -> tuple[list, list]:
        """:meth:`fused` for dicts of several shapes, over a copy of all the model's weights: each event's looked up
        by its names (``index``), updated in place (:func:`learn_named`)."""
        raise NotImplementedError

    # The windows' hooks: the vectors scored (w first), each event's c (averaged), which rows update, the scores
    # published, what an update adds beside w, and the vectors read back.
    def vectors(self) -> list[list[float]]:
        return [[0.0, *self.w, self.b]]

    def begin(self, labeled: np.ndarray) -> None:
        pass

    def wrong(self, ys: np.ndarray, dense: bool) -> np.ndarray:
        """Which rows update, from y·(the running weights' score): the seeds' rule."""
        return ys <= 0.0

    def publish(self, yscore, sums, W, labeled, i: int, j: int, end: int, hit: bool) -> None:
        """Write y·(published score) of rows i..i+end-1 (and of row i+end when ``hit``: it updates) into ``yscore``;
        ``sums``: y·(each vector's score) of rows i..j-1."""
        raise NotImplementedError

    def updated(self, layout, W, row: int) -> None:
        """Row ``row`` updated w (added already): add what the variant keeps beside it."""

    def end(self, W: np.ndarray, n_labeled: int) -> None:
        w = W[0].tolist()
        self.w, self.b = w[1:-1], w[-1]


def learn_named(w: list[float], place, x: dict, y: int) -> None:
    """w += y·x for a dict, each weight by its name's position (``w[i] + v`` and ``w[i] - v``: the floats of
    ``w[i] += y·v``)."""
    if y == 1:
        for k, v in x.items():
            w[place(k)] += v
    else:
        for k, v in x.items():
            w[place(k)] -= v


def _columns(xs: list[dict], index: dict, windows: bool):
    """The columns of a batch of dicts, and its rows: ``(positions, rows, None)`` when the names come in one order
    in every event (the model positions of the names, each event's values in that order); else ragged. For the
    windows ``(positions, None, (local, lengths))``: the model positions the batch holds, sorted, each name's index
    among them (one flat array, event after event) and the events' lengths; for the fused loop ``(every position,
    None, index)``: it looks each name up as ``step`` does."""
    first = xs[0].keys()
    if all(map(first.__eq__, map(dict.keys, xs))) and list(map(list, xs)).count(list(first)) == len(xs):
        return [index[k] for k in first], [list(x.values()) for x in xs], None
    if not windows:
        return range(len(index)), None, index
    names = list(map(list, xs))
    lengths = list(map(len, names))
    pos = np.fromiter(map(index.__getitem__, chain.from_iterable(names)), dtype=np.intp, count=sum(lengths))
    uniq, local = np.unique(pos, return_inverse=True)
    return uniq.tolist(), None, (local, lengths)


def gather(w: list[float], cols) -> list[float]:
    return w[: len(cols)] if type(cols) is range else [w[c] for c in cols]


def scatter(w: list[float], cols, values) -> None:
    if type(values) is np.ndarray:
        values = values.tolist()
    if type(cols) is range:
        w[: len(cols)] = values
    else:
        for c, v in zip(cols, values):
            w[c] = v
