"""What a batch of steps answers, and the one-at-a-time reference it must equal.

:class:`Steps` holds one column per result of ``step`` and the model's counters after each event (what a prediction
publishes beside them). :func:`step_each` is the reference: ``step`` one event at a time, as :class:`Steps`, for any
learner; a batch form (:meth:`~perceptron_stream.learning.many.ManySteps.step_many`) answers exactly what it answers.
Delayed labels take part here too: a point whose label came first is relabeled right after its step
(:func:`as_joins` counts a batch of those as ``relabel`` counts), and labels that come after their points' decisions
are learned by :func:`relabel_many`.
"""

from __future__ import annotations

import numpy as np
from perceptron_stream.learning.labels import is_mistake

_NoneType = type(None)


class Steps:
    """What :meth:`~perceptron_stream.learning.many.ManySteps.step_many` answers: one column per result of ``step``, and the model's counters after
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


def interleave(xs: list, ys: list, joins: list) -> tuple[list, list, np.ndarray, np.ndarray]:
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
    """``steps`` of events interleaved with relabels (:func:`interleave`) counted as ``relabel`` counts: a relabel
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
