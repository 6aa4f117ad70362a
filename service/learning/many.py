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
  :data:`NORM_TOLERANCE`, and ``math.hypot`` of the rows that could beat the maximum only.
"""

from __future__ import annotations

import sys
from itertools import chain, starmap
from math import hypot
from operator import add, mul, sub
from typing import Any

import numpy as np
from perceptron_stream.learning.labels import is_mistake

#: Windows pay when the model's recent batches ran at least this many labeled events between updates.
NUMPY_RUN = 32
#: The fewest rows a window scores after an update; windows follow the runs seen in the batch so far.
MIN_WINDOW = 16
#: NumPy's norm of a row is within this relative distance of math.hypot's (d·2⁻⁵³ for d values: 1e-10 at 10⁶).
NORM_TOLERANCE = 1e-7
_NoneType = type(None)


def _loop_sum(values: Any) -> float:
    """sum() as Python up to 3.11 does it for floats: left to right from 0, no compensation."""
    s = 0.0
    for v in values:
        s += v
    return s


#: The in-order sum of the definition: ``sum`` up to 3.11, a loop from 3.12 (whose sum compensates rounding).
in_order_sum = sum if sys.version_info < (3, 12) else _loop_sum


class Steps:
    """What :meth:`ManySteps.step_many` answers: one column per result of ``step``, and the model's counters after
    each event (what a prediction publishes beside them).

    ``y_pred`` (int64) and ``score`` (float64: the floats ``step`` returns) are NumPy arrays, ``mistake`` a list
    (True/False, None for an unlabeled event); ``updates``, ``seen`` and ``mistakes`` int64 arrays.
    """

    __slots__ = ("joined", "learned", "mistake", "mistakes", "score", "seen", "updates", "y_pred")

    def __init__(self, y_pred, score, mistake, updates, seen, mistakes):
        self.y_pred, self.score, self.mistake = y_pred, score, mistake
        self.updates, self.seen, self.mistakes = updates, seen, mistakes
        self.joined: list[tuple[int, int, int]] = []  # with joins: the counters (updates, seen, mistakes) after each
        self.learned: list[bool] | None = None  # with joins: the mistakes counted, labeled events' and joins', in order

    def __len__(self) -> int:
        return len(self.mistake)

    def __getitem__(self, i: int) -> tuple[int, float, bool | None]:
        """Event ``i``'s ``(y_pred, score, mistake)``, as ``step`` returned it."""
        return (int(self.y_pred[i]), float(self.score[i]), self.mistake[i])

    def flags(self) -> list[bool]:
        """The mistakes of the labeled events, in order (with joins: theirs and the joined decisions', in order)."""
        if self.learned is not None:
            return self.learned
        return [m for m in self.mistake if m is not None]

    @classmethod
    def of(cls, results: list, updates: list, seen: int, mistakes: list) -> Steps:
        """From ``step``'s results one at a time, and the counters read after each."""
        n = len(results)
        return cls(
            np.array([r[0] for r in results], dtype=np.int64),
            np.array([r[1] for r in results], dtype=np.float64),
            [r[2] for r in results],
            np.array(updates, dtype=np.int64),
            np.arange(seen + 1, seen + n + 1, dtype=np.int64),
            np.array(mistakes, dtype=np.int64),
        )


def signed_labels(ys: list) -> bool:
    """Whether every label is -1, +1 or None (ints: a bool or a float goes one event at a time, as ``step`` takes it)."""
    return not set(map(type, ys)) - {int, _NoneType} and ys.count(1) + ys.count(-1) + ys.count(None) == len(ys)


def step_each(learner, xs: list, ys: list, joins: list | None = None) -> Steps:
    """``learner.step`` one event at a time (the reference), as :class:`Steps`: any learner with ``step``.

    ``joins``: (index, y) of events whose label came before them (unlabeled, each once): right after the event's
    step, ``learner.relabel(x, y, its prediction's mistake)``, as a point's join with its early label learns."""
    step, results, updates, mistakes = learner.step, [], [], []
    seen = learner.seen
    if not joins:
        for x, y in zip(xs, ys):
            results.append(step(x, y))
            updates.append(learner.updates)
            mistakes.append(learner.mistakes)
        return Steps.of(results, updates, seen, mistakes)
    label_of, joined, learned = dict(joins), [], []
    for i, (x, y) in enumerate(zip(xs, ys)):
        results.append(step(x, y))
        updates.append(learner.updates)
        mistakes.append(learner.mistakes)
        if results[-1][2] is not None:
            learned.append(results[-1][2])
        if i in label_of:
            wrong = is_mistake(label_of[i], results[-1][1])  # the published decision's score against the label
            learner.relabel(x, label_of[i], wrong)
            joined.append((learner.updates, learner.seen, learner.mistakes))
            learned.append(wrong)
    steps = Steps.of(results, updates, seen, mistakes)
    steps.joined, steps.learned = joined, learned
    return steps


def _interleave(xs: list, ys: list, joins: list) -> tuple[list, list, np.ndarray, np.ndarray]:
    """The events with each join's relabel right after its event: rows, labels, and where the events and the joins
    are among them (``joins`` in event order)."""
    rows: list = []
    labels: list = []
    done = 0
    for i, y in joins:
        rows += xs[done : i + 1]
        rows.append(xs[i])
        labels += ys[done : i + 1]
        labels.append(y)
        done = i + 1
    rows += xs[done:]
    labels += ys[done:]
    at = np.array([i for i, _ in joins], dtype=np.int64)
    events_at = np.arange(len(xs)) + np.searchsorted(at, np.arange(len(xs)), side="left")
    return rows, labels, events_at, at + np.arange(1, len(at) + 1)


def as_joins(steps: Steps, events_at: np.ndarray, joins_at: np.ndarray, labels: np.ndarray, seen: int, mistakes: int):
    """``steps`` of events interleaved with relabels (:func:`_interleave`) counted as ``relabel`` counts: a relabel
    is no event seen, and counts its decision's mistake (its event's published score against the label), not its own.
    The events' :class:`Steps`, with the joins' counters (``joined``) and the mistakes counted in order
    (``learned``); the model's seen and mistakes after them all."""
    n_all = len(steps)
    own = np.diff(steps.mistakes, prepend=mistakes)  # each row's own mistake, 0 or 1
    wrong = is_mistake(labels, steps.score[joins_at - 1])  # the joined decision's (its event's row is just before it)
    own[joins_at] = wrong
    counted = mistakes + np.cumsum(own)
    is_event = np.zeros(n_all, dtype=bool)
    is_event[events_at] = True
    seen_at = seen + np.cumsum(is_event)
    learned_rows = np.sort(np.concatenate([events_at[[steps.mistake[i] is not None for i in events_at]], joins_at]))
    out = Steps(
        steps.y_pred[events_at],
        steps.score[events_at],
        [steps.mistake[i] for i in events_at.tolist()],
        steps.updates[events_at],
        seen_at[events_at],
        counted[events_at],
    )
    out.joined = list(zip(steps.updates[joins_at].tolist(), seen_at[joins_at].tolist(), counted[joins_at].tolist()))
    out.learned = (own[learned_rows] != 0).tolist()
    return out, int(seen_at[-1]), int(counted[-1])


def relabel_many(learner, xs: list, ys: list, mistakes: list[bool]) -> tuple[list[int], list[int]]:
    """``learner.relabel(x, y, mistake)`` of each (labels that came after their points' predictions): the learner's
    ``relabel_many`` where it has one, else one at a time. The model's updates and mistakes after each."""
    if hasattr(learner, "relabel_many"):
        return learner.relabel_many(xs, ys, mistakes)
    return relabel_each(learner, xs, ys, mistakes)


def relabel_each(learner, xs: list, ys: list, mistakes: list[bool]) -> tuple[list[int], list[int]]:
    """``learner.relabel`` one at a time (the reference): the model's updates and mistakes after each."""
    updates, counted = [], []
    for x, y, mistake in zip(xs, ys, mistakes):
        learner.relabel(x, y, mistake)
        updates.append(learner.updates)
        counted.append(learner.mistakes)
    return updates, counted


class ManySteps:
    """:meth:`step_many`, the batch form of ``step``, for :class:`~perceptron_stream.learning.Perceptron`."""

    # the Perceptron's state, as this mixin reads and writes it
    _w: list[float]
    _u: list[float]
    _p: list[float]
    _b: float
    _ub: float
    _pb: float
    _c: int
    _run: int
    _best: int
    _p_is_w: bool
    _thr: float
    _mode: int
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
            rows, labels, events_at, joins_at = _interleave(xs, ys, joins)
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
        variant = self._mode
        st = _State(variant, self._thr, _gather(self._w, cols), self._b)
        if variant == 1:
            st.o, st.ob, st.c = _gather(self._u, cols), self._ub, self._c
        elif variant == 2:
            st.o, st.ob, st.run, st.best, st.same = (
                _gather(self._p, cols),
                self._pb,
                self._run,
                self._best,
                self._p_is_w,
            )
        if not np.isfinite([*st.w, *st.o, st.b, st.ob]).all():
            return step_each(self, xs, ys)
        if windows:
            layout = _layout(xs, rows, ragged, len(cols), labels, labeled)
            score, upd = _windows(st, layout, labeled, n_labeled, kind is list)
            xmax = layout.norms()
        else:
            score, upd = _fused(st, rows, ragged, xs, ys, kind is list)
            xmax = max(starmap(hypot, rows if rows is not None else map(dict.values, xs)))  # hypot(*x) each, in C
        # the model after the batch
        self._b = st.b
        _scatter(self._w, cols, st.w)
        if variant == 1:
            _scatter(self._u, cols, st.o)
            self._ub, self._c = st.ob, st.c
        elif variant == 2:
            if st.took:  # the pocket took the running weights whole at its last swap: those outside the columns too
                self._p[:] = self._w
            _scatter(self._p, cols, st.o)
            self._pb, self._run, self._best, self._p_is_w = st.ob, st.run, st.best, st.same
        if xmax > self._xmax:
            self._xmax = xmax
        mistake = labeled & is_mistake(np.where(labeled, labels, 1), score)
        if variant == 0:  # plain and margin echo y when right (y too for a NaN score, as step does)
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


class _State:
    """The weights a batch steps, aligned with its columns: running ``w``, ``b``; the averaged variant's lazy sums
    (``o``, ``ob``) and count ``c``, or the pocket's weights (``o``, ``ob``), its runs and whether it holds the
    running weights (``same``); ``took``: the pocket took the running weights in this batch."""

    __slots__ = ("b", "best", "c", "o", "ob", "run", "same", "thr", "took", "variant", "w")

    def __init__(self, variant: int, thr: float, w: list, b: float):
        self.variant, self.thr, self.w, self.b = variant, thr, w, b
        self.o: list = []
        self.ob, self.c, self.run, self.best, self.same, self.took = 0.0, 1, 0, 0, True, False


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


def _gather(w: list[float], cols) -> list[float]:
    return w[: len(cols)] if type(cols) is range else [w[c] for c in cols]


def _scatter(w: list[float], cols, values) -> None:
    if type(values) is np.ndarray:
        values = values.tolist()
    if type(cols) is range:
        w[: len(cols)] = values
    else:
        for c, v in zip(cols, values):
            w[c] = v


# --------------------------------------------------------------------------- the fused loop (no NumPy per event)
def _fused(st: _State, rows: list | None, ragged, xs: list, ys: list, dense: bool) -> tuple[np.ndarray, np.ndarray]:
    """``step``'s operations in one loop over ``rows`` (value lists aligned with ``st.w``): the scores and update
    flags; ``st`` is left as the model after the batch. ``dense``: the list path's comparison (``not y·s > γ``:
    a NaN score updates there; the dict path's ``y·s <= γ`` does not). Ragged dicts: :func:`_fused_ragged`."""
    if rows is None:
        return _fused_ragged(st, ragged, xs, ys)
    n = len(rows)
    score = [0.0] * n
    upd = [False] * n
    w, o, b, ob = st.w, st.o, st.b, st.ob
    i = 0
    if st.variant == 0:
        thr = st.thr
        for x, y in zip(rows, ys):
            s = in_order_sum(map(mul, w, x)) + b
            score[i] = s
            if y is not None:
                ys_ = y * s
                if (not ys_ > thr) if dense else ys_ <= thr:
                    w = list(map(add if y == 1 else sub, w, x))
                    b += y
                    upd[i] = True
            i += 1
    elif st.variant == 1:
        c = st.c
        for x, y in zip(rows, ys):
            s = in_order_sum(map(mul, w, x)) + b
            score[i] = s - (in_order_sum(map(mul, o, x)) + ob) / c
            if y is not None:
                if y * s <= 0.0:
                    w = list(map(add if y == 1 else sub, w, x))
                    yc = float(y * c)
                    o = [ui + yc * xi for ui, xi in zip(o, x)]
                    b += y
                    ob += y * c
                    upd[i] = True
                c += 1
            i += 1
        st.c = c
    else:
        run, best, same, took = st.run, st.best, st.same, st.took
        for x, y in zip(rows, ys):
            s = in_order_sum(map(mul, w, x)) + b
            score[i] = s if same else in_order_sum(map(mul, o, x)) + ob
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
                            o, ob, same, took = w, b, True, True  # w is never changed in place: a new list on update
            i += 1
        st.run, st.best, st.same, st.took = run, best, same, took
    st.w, st.o, st.b, st.ob = w, o, b, ob
    return np.array(score, dtype=np.float64), np.array(upd, dtype=bool)


def _fused_ragged(st: _State, index: dict, xs: list[dict], ys: list) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_fused` for dicts of several shapes, over a copy of all the model's weights: each event's looked up by
    its names, updated in place (``w[i] + v`` and ``w[i] - v``: the floats of ``w[i] += y·v``)."""
    n = len(xs)
    score = [0.0] * n
    upd = [False] * n
    w, o, b, ob, thr, variant = st.w, st.o, st.b, st.ob, st.thr, st.variant
    c, run, best, same, took = st.c, st.run, st.best, st.same, st.took
    place = index.__getitem__
    for i, (x, y) in enumerate(zip(xs, ys)):
        s = in_order_sum(map(mul, map(w.__getitem__, map(place, x)), x.values())) + b
        if variant == 0:
            score[i] = s
            if y is None or not y * s <= thr:
                continue
        elif variant == 1:
            score[i] = s - (in_order_sum(map(mul, map(o.__getitem__, map(place, x)), x.values())) + ob) / c
            if y is None:
                continue
            c += 1
            if not y * s <= 0.0:
                continue
            yc = float(y * (c - 1))
            for k, v in x.items():
                o[place(k)] += yc * v
            ob += y * (c - 1)
        else:
            score[i] = s if same else in_order_sum(map(mul, map(o.__getitem__, map(place, x)), x.values())) + ob
            if y is None:
                continue
            if not y * s <= 0.0:
                run += 1
                if run > best:
                    best = run
                    if not same:
                        o, ob, same, took = w[:], b, True, True  # a copy: w changes in place
                continue
            run, same = 0, False
        if y == 1:
            for k, v in x.items():
                w[place(k)] += v
        else:
            for k, v in x.items():
                w[place(k)] -= v
        b += y
        upd[i] = True
    st.w, st.o, st.b, st.ob, st.c, st.run, st.best, st.same, st.took = w, o, b, ob, c, run, best, same, took
    return np.array(score, dtype=np.float64), np.array(upd, dtype=bool)


# --------------------------------------------------------------------------- NumPy windows
class _Layout:
    """A batch's rows as the windows read them, each flipped by its label: ``V[i] = [+0.0, y·x..., y·1.0]``.

    Aligned rows (lists, or dicts whose names come in one order): column j + 1 is weight j of the window's vector
    ``[+0.0, w..., b]``. Ragged rows (dicts of several shapes): ``pos`` (n × (K + 2)) indexes that vector; a row
    shorter than K is padded with the value 0 at index 0 (weight +0.0): a product of ±0.0 added to a sum from +0.0
    changes nothing.
    """

    __slots__ = ("V", "n", "pos", "xs")

    def __init__(self, V: np.ndarray, pos: np.ndarray | None, xs: list):
        self.V, self.pos, self.xs = V, pos, xs
        self.n = len(V)

    def norms(self) -> float:
        """The largest ‖x‖ of the rows, as ``math.hypot`` computes it (the per-event path's R)."""
        x = self.V[:, 1:-1]
        est = np.sqrt(np.einsum("ij,ij->i", x, x))
        best = self._norm(int(est.argmax()))
        candidates: range | list[int] = range(self.n)
        if best >= 1e-100:  # below, squares lose their relative precision: no bound, every row exactly
            candidates = np.flatnonzero(est * (1.0 + NORM_TOLERANCE) >= best).tolist()
        for i in candidates:
            r = self._norm(i)
            if r > best:
                best = r
        return best

    def _norm(self, i: int) -> float:
        x = self.xs[i]
        return hypot(*(x if type(x) is list else x.values()))


def _layout(xs: list, rows: list | None, ragged, width: int, labels: np.ndarray, labeled: np.ndarray) -> _Layout:
    """``xs`` as the windows read them: ``rows`` their values aligned with the columns, or ``ragged`` (each name's
    column, the events' lengths: see :func:`_columns`) over ``width`` columns."""
    n = len(xs)
    if rows is not None:
        k = width
        V = np.empty((n, k + 2), dtype=np.float64)
        V[:, 1:-1] = np.fromiter(chain.from_iterable(rows), dtype=np.float64, count=n * k).reshape(n, k)
        pos = None
    else:
        local, lengths = ragged
        total = len(local)
        values = np.fromiter(chain.from_iterable(map(dict.values, xs)), dtype=np.float64, count=total)
        rows_of = np.repeat(np.arange(n), lengths)
        at = np.arange(total) - np.repeat(np.cumsum(lengths) - lengths, lengths) + 1
        V = np.zeros((n, max(lengths) + 2), dtype=np.float64)
        pos = np.zeros(V.shape, dtype=np.intp)
        V[rows_of, at] = values
        pos[rows_of, at] = local + 1
        pos[:, -1] = width + 1
    V[:, 0] = 0.0
    V[:, -1] = 1.0
    V[:, 1:] *= np.where(labeled, labels, 1).astype(np.float64)[:, None]
    return _Layout(V, pos, xs)


def _window(size: int, runs: int, rows: int) -> int:
    """The next window: a few times the mean run between updates so far in the batch (at least MIN_WINDOW)."""
    return max(MIN_WINDOW, 3 * rows // runs) if runs else size


def _sums(layout: _Layout, W: np.ndarray, i: int, j: int) -> np.ndarray:
    """y·(each weight vector's score) of rows i..j-1: one row of sums per vector of ``W`` (K × (j - i))."""
    V = layout.V[i:j]
    if layout.pos is not None:
        P = W[:, layout.pos[i:j]] * V
    elif len(W) == 1:
        P = (V * W[0])[None]
    else:
        P = W[:, None, :] * V
    np.add.accumulate(P, axis=2, out=P)
    return P[:, :, -1]


def _add(layout: _Layout, vector: np.ndarray, row: int, scale: float | None = None) -> None:
    """vector += (scale ·) the flipped row ``row``: w + y·x and b + y (or u + c·y·x and ub + c·y)."""
    v = layout.V[row] if scale is None else scale * layout.V[row]
    if layout.pos is None:
        vector += v
    else:
        vector[layout.pos[row]] += v  # the padding's repeated index 0 adds ±0.0 to +0.0: +0.0 whichever lands


def _windows(st: _State, layout: _Layout, labeled: np.ndarray, n_labeled: int, dense: bool):
    """The scores and update flags by NumPy windows; ``st`` is left as the model after the batch."""
    n, variant = layout.n, st.variant
    W = np.array([[0.0, *st.w, st.b]] + ([[0.0, *st.o, st.ob]] if variant else []), dtype=np.float64)
    lab = None if n_labeled == n else labeled
    if variant == 1:
        c = (st.c + np.cumsum(labeled) - labeled).astype(np.float64)  # each event's c: 1 + labeled events before
    yscore = np.empty(n, dtype=np.float64)
    upd = np.zeros(n, dtype=bool)
    run, best, same = st.run, st.best, st.same
    i, size, runs = 0, n, 0
    while i < n:
        j = min(n, i + size)
        sums = _sums(layout, W, i, j)
        ys = sums[0]
        if variant == 0:
            cond = ~(ys > st.thr) if dense else ys <= st.thr
        else:
            cond = ys <= 0.0
        if lab is not None:
            cond &= lab[i:j]
        k = int(cond.argmax()) if n_labeled else 0
        hit = bool(n_labeled) and bool(cond[k])
        end = k if hit else j - i  # rows i..i+end-1 do not update
        if variant == 0:
            yscore[i : i + end + hit] = ys[: end + hit]
        elif variant == 1:
            yscore[i : i + end + hit] = (ys - sums[1] / c[i:j])[: end + hit]  # y·(s - t/c) = y·s - (y·t)/c
        else:  # pocket: its labeled rows before `end` lengthen the run; the first beyond the best takes w
            counted = np.cumsum(labeled[i : i + end])
            total = int(counted[-1]) if end else 0
            q = end
            if not same and run + total > best:
                q = int(np.searchsorted(counted, max(1, best - run + 1)))
            yp = sums[1]
            yscore[i : i + min(q + 1, end)] = (ys if same else yp)[: min(q + 1, end)]
            if q < end:
                yscore[i + q + 1 : i + end] = ys[q + 1 : end]
                W[1] = W[0]
                same = st.took = True
            run += total
            if run > best:
                best = run
            if hit:
                yscore[i + k] = ys[k] if same else yp[k]
                run, same = 0, False
        if not hit:
            i = j
            continue
        upd[i + k] = True
        _add(layout, W[0], i + k)
        if variant == 1:
            _add(layout, W[1], i + k, c[i + k])  # u + (y·c)·x: c·(y·x), one product up to its sign
        i += k + 1
        runs += 1
        size = _window(size, runs, i)
    if variant == 1:
        st.c += n_labeled
    st.run, st.best, st.same = run, best, same
    w, o = W[0].tolist(), W[1].tolist() if variant else []
    st.w, st.b = w[1:-1], w[-1]
    if variant:
        st.o, st.ob = o[1:-1], o[-1]
    return yscore * layout.V[:, -1] + 0.0, upd  # y·(y·score), and a flipped zero back to +0.0
