"""Reason codes for a batch of events at once: each event's K largest parts of its score, read from the weights
that scored it, without stepping the events one at a time.

One event at a time, :meth:`Perceptron.explain <perceptron_stream.learning.Perceptron.explain>` reads the
predicting weight of each of the event's features before its step. A batch (:meth:`step_many
<perceptron_stream.learning.many.ManySteps.step_many>`) moves the weights only on its updates, each an addition of
the updating event's signed values (``w + x`` or ``w - x``, ``b + y``). So the weights before every event of the
batch are the batch's first weights followed by the updates, added in order:
``np.add.accumulate`` down the rows ``[w0, ±x_u1, ±x_u2, ...]`` is that very sequence of additions, one IEEE
addition per weight and update, the floats the learner held (a prefix sum is never reassociated). A weight an
update does not touch gets ``-0.0`` added, the one number whose addition changes no float (``+0.0 + -0.0`` is
``+0.0``, ``-0.0 + -0.0`` is ``-0.0``). Each event's parts are then ``weight × value`` (the products its score
added) and the largest by magnitude are taken by a stable sort, ties in the event's order, as ``sorted`` ranks the
one-at-a-time parts.

For the variants whose running weights publish (plain and margin): the averaged and pocket variants predict with
other weights, and a scaler or hashing changes what the model sees; those explain one event at a time.

>>> import numpy as np
>>> reasons = top_parts([[1.0, -2.0], [3.0, 0.5]], [1, 1], np.array([True, False]), [0.0, 0.0], 0.0, 1)
>>> reasons[0], reasons[1]   # (feature, value, weight, contribution) largest first, and the bias: after w + x
(([(0, 1.0, 0.0, 0.0)], 0.0), ([(0, 3.0, 1.0, 3.0)], 1.0))
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate, chain

import numpy as np


class Reasons:
    """Each event's K largest parts, largest first, and its bias, in flat columns (what a message builder writes
    at once): ``features`` (a list, or an int array of a dense list's positions), ``values``, ``weights`` and
    ``contributions`` (float64 arrays), event after event, ``per_event`` parts each (or ``counts``, one per event,
    where events have fewer parts than K), and ``bias`` (one per event)."""

    __slots__ = ("bias", "contributions", "counts", "features", "per_event", "starts", "values", "weights")

    def __init__(self, features, values, weights, contributions, bias, per_event: int, counts: list[int] | None):
        self.features, self.values, self.weights, self.contributions = features, values, weights, contributions
        self.bias, self.per_event, self.counts = bias, per_event, counts
        self.starts = None if counts is None else [0, *accumulate(counts)]  # where each event's parts begin

    def __getitem__(self, i: int) -> tuple[list[tuple], float]:
        """Event ``i``'s parts ``(feature, value, weight, contribution)`` and bias, as ``explain`` ranks them."""
        if self.starts is None:
            start, stop = i * self.per_event, (i + 1) * self.per_event
        else:
            start, stop = self.starts[i], self.starts[i + 1]
        columns = [column[start:stop] for column in (self.features, self.values, self.weights, self.contributions)]
        columns = [c.tolist() if hasattr(c, "tolist") else c for c in columns]
        return list(zip(*columns)), float(self.bias[i])


def top_parts(xs: list, ys: list, updated: np.ndarray, w0: list[float], b0: float, k: int, index=None) -> Reasons:
    """The ``k`` largest parts of each event of ``xs`` (dense lists of one length, or dicts whose names ``index``
    places in the model) scored by the weights ``w0``, bias ``b0`` (the model's, all of them, before the batch)
    and the updates of the rows ``updated`` marks (each ``w ± x``, ``b ± 1`` by its label ``ys``)."""
    rows = np.flatnonzero(updated)
    signs = np.array([ys[i] for i in rows.tolist()], dtype=np.float64)
    before = np.cumsum(updated) - updated  # updates before each event
    bias = np.add.accumulate(np.concatenate(([b0], signs)))[before]
    cols: Sequence[int]
    if type(xs[0]) is list:
        names, cols, flat = None, range(len(xs[0])), chain.from_iterable(xs)
    else:
        first = xs[0].keys()
        if not (all(map(first.__eq__, map(dict.keys, xs))) and list(map(list, xs)).count(list(first)) == len(xs)):
            return _ragged(xs, updated, rows, signs, before, bias, w0, k, index)
        names = list(first)  # every event's names in one order: a table, as dense lists are
        cols = list(map(index.__getitem__, names))
        flat = chain.from_iterable(map(dict.values, xs))
    # (fromiter over the flat values: 0.39 ms for 1,000 rows of 10, np.array of the rows 0.62)
    x = np.fromiter(flat, dtype=np.float64, count=len(xs) * len(cols)).reshape(len(xs), len(cols))
    # the weights before each event: the first row the batch's, one row more after each update (see above)
    steps = np.empty((len(rows) + 1, x.shape[1]))
    steps[0] = [w0[c] for c in cols]
    steps[1:] = signs[:, None] * x[rows]
    weight = np.add.accumulate(steps, axis=0)[before]
    contribution = weight * x
    top = np.argsort(-np.abs(contribution), axis=1, kind="stable")[:, :k]  # ties in the event's order
    take = np.take_along_axis
    features = top.ravel() if names is None else [names[i] for i in top.ravel().tolist()]
    parts = (take(x, top, 1).ravel(), take(weight, top, 1).ravel(), take(contribution, top, 1).ravel())
    return Reasons(features, *parts, bias, top.shape[1], None)


def _ragged(xs: list[dict], updated, rows, signs, before, bias, w0: list[float], k: int, index: dict) -> Reasons:
    """:func:`top_parts` of dicts of several shapes: one flat column of their parts, event after event."""
    n = len(xs)
    lens = np.fromiter(map(len, xs), dtype=np.int64, count=n)
    names_flat = list(chain.from_iterable(xs))
    pos = np.fromiter(map(index.__getitem__, names_flat), dtype=np.int64, count=len(names_flat))
    values = np.fromiter(chain.from_iterable(map(dict.values, xs)), dtype=np.float64, count=len(names_flat))
    row = np.repeat(np.arange(n), lens)
    starts = np.cumsum(lens) - lens
    columns, column = np.unique(pos, return_inverse=True)  # the batch's model positions; each part's among them
    # an untouched weight gets -0.0 added: the one addition that changes no float (see above)
    steps = np.full((len(rows) + 1, len(columns)), -0.0)
    steps[0] = [w0[p] for p in columns.tolist()]
    touched = updated[row]
    ordinal = np.cumsum(updated) - 1  # an update row's place among the updates
    steps[ordinal[row[touched]] + 1, column[touched]] = signs[ordinal[row[touched]]] * values[touched]
    weight = np.add.accumulate(steps, axis=0)[before[row], column]
    contribution = weight * values
    # the k largest magnitudes of each event, ties in its order (padding past a shorter event's parts last)
    keys = np.full((n, int(lens.max())), np.inf)
    keys[row, np.arange(len(row)) - starts[row]] = -np.abs(contribution)
    top = np.argsort(keys, axis=1, kind="stable")[:, :k]
    valid = top < lens[:, None]
    chosen = (starts[:, None] + top)[valid]
    counts = None if bool(valid.all()) else valid.sum(axis=1).tolist()
    features = [names_flat[i] for i in chosen.tolist()]
    return Reasons(features, values[chosen], weight[chosen], contribution[chosen], bias, top.shape[1], counts)
