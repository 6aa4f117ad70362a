"""The batch form's NumPy windows: score a window of events at once, find the first that updates, update there, and
go on from the event after it.

From any event on, the following events are scored by the current weights until the next update, so a window of
them is scored at once with NumPy (the exact in-order sums of :mod:`perceptron_stream.learning.many`'s definition:
products, then ``np.add.accumulate`` along each row), and only the first row that updates is learned from. The
loop here is the same for every variant; what a variant keeps beside the running weights (the averaged sums, the
pocket) it adds through the hooks of its :class:`~perceptron_stream.learning.many.Batch`: its vectors scored beside
w, the scores it publishes, what it adds on an update.

Windows pay when runs between updates are long (a clean or converged stream): reading Python floats into an array
costs about half a Python dot product per value, and a window about a dozen calls
(:data:`~perceptron_stream.learning.many.NUMPY_RUN` decides).
"""

from __future__ import annotations

from itertools import chain
from math import hypot

import numpy as np

#: The fewest rows a window scores after an update; windows follow the runs seen in the batch so far.
MIN_WINDOW = 16
#: NumPy's norm of a row is within this relative distance of math.hypot's (d·2⁻⁵³ for d values: 1e-10 at 10⁶).
NORM_TOLERANCE = 1e-7


class Layout:
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


def layout_of(xs: list, rows: list | None, ragged, width: int, labels: np.ndarray, labeled: np.ndarray) -> Layout:
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
    return Layout(V, pos, xs)


def _window(size: int, runs: int, rows: int) -> int:
    """The next window: a few times the mean run between updates so far in the batch (at least MIN_WINDOW)."""
    return max(MIN_WINDOW, 3 * rows // runs) if runs else size


def _sums(layout: Layout, W: np.ndarray, i: int, j: int) -> np.ndarray:
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


def add_row(layout: Layout, vector: np.ndarray, row: int, scale: float | None = None) -> None:
    """vector += (scale ·) the flipped row ``row``: w + y·x and b + y (or u + c·y·x and ub + c·y)."""
    v = layout.V[row] if scale is None else scale * layout.V[row]
    if layout.pos is None:
        vector += v
    else:
        vector[layout.pos[row]] += v  # the padding's repeated index 0 adds ±0.0 to +0.0: +0.0 whichever lands


def run_windows(batch, layout: Layout, labeled: np.ndarray, n_labeled: int, dense: bool):
    """The scores and update flags of the batch's rows by NumPy windows; ``batch`` (a variant's
    :class:`~perceptron_stream.learning.many.Batch`) is left as the model after the batch. ``dense``: the list path's
    comparison, for the variants that make one (:meth:`~perceptron_stream.learning.many.Batch.wrong`)."""
    n = layout.n
    W = np.array(batch.vectors(), dtype=np.float64)  # w first, then what the variant scores beside it
    lab = None if n_labeled == n else labeled
    batch.begin(labeled)
    yscore = np.empty(n, dtype=np.float64)
    upd = np.zeros(n, dtype=bool)
    i, size, runs = 0, n, 0
    while i < n:
        j = min(n, i + size)
        sums = _sums(layout, W, i, j)
        cond = batch.wrong(sums[0], dense)
        if lab is not None:
            cond &= lab[i:j]
        k = int(cond.argmax()) if n_labeled else 0
        hit = bool(n_labeled) and bool(cond[k])
        end = k if hit else j - i  # rows i..i+end-1 do not update
        batch.publish(yscore, sums, W, labeled, i, j, end, hit)
        if not hit:
            i = j
            continue
        upd[i + k] = True
        add_row(layout, W[0], i + k)
        batch.updated(layout, W, i + k)
        i += k + 1
        runs += 1
        size = _window(size, runs, i)
    batch.end(W, n_labeled)
    return yscore * layout.V[:, -1] + 0.0, upd  # y·(y·score), and a flipped zero back to +0.0
