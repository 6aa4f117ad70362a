"""What does a task's batch do with delayed labels? One hook per batch, :class:`SpanLabels`, answers.

A task (:class:`~perceptron_stream.pipeline.task.Task`) with a
:class:`~perceptron_stream.pipeline.labels.joiner.Joiner` obtains one hook per
batch (:meth:`Joiner.span`) and tells it what happened, in the words of its
own paths; the hook does the rest, in the order the outputs must go:

- a point without its label, predicted and published one at a time
  (:meth:`SpanLabels.published`): kept until its label comes, or, its label
  having come first, joined now;
- the batch form: which of a span's points find their label waiting
  (:meth:`SpanLabels.waiting`: the task's ``step_many`` learns their joins in
  the same pass), then the span's predictions sent in record order, each
  point kept and each join published right after its point
  (:meth:`SpanLabels.published_many`);
- the end of a batch of points (:meth:`SpanLabels.points_done`): the points
  too large to keep dead-lettered, the grace clock moved on;
- a batch of labels (:meth:`SpanLabels.labels`): joined, held early, or dead
  letters, together or one at a time.

The task's learning through the batch (``run``) is what the hook asks of the
task for a batch of labels: its ``learner``, ``stamp()`` (the replica's mixes,
as an output made now carries them) and ``passed(r, learned, send)`` (the
position past record ``r``; a mix made if it learned and one is due).
"""

from __future__ import annotations

import logging

from perceptron_stream.wire.messages import Rejection
from perceptron_stream.wire.outputs import dead_letter_value

log = logging.getLogger("perceptron_stream")


class SpanLabels:
    """One batch of one task and the delayed labels: what its points and its labels do to the pending tables,
    and what that sends (through ``send``) and counts (in ``tally``). ``replica``: the task's replica stamp, the
    same dict its predictions carry; ``models``: its challengers (None: none)."""

    __slots__ = ("joiner", "models", "replica", "send", "tally")

    def __init__(self, joiner, send, tally, replica: dict | None, models=None):
        self.joiner, self.send, self.tally, self.replica, self.models = joiner, send, tally, replica, models

    # points, one at a time ------------------------------------------------
    def published(self, r, event_id, x, y_pred: int, score: float, learner, others: dict | None) -> bool:
        """Point ``r`` predicted without its label by ``learner`` and its prediction sent (``others``: the
        challengers' steps of it, or None): kept until its label comes; joined now when its label came first
        (then True: the model learned, a mix may be due). A point without an id is never labeled."""
        if event_id is None:
            return False
        joiner = self.joiner
        early = joiner.keep(
            r,
            event_id,
            x,
            y_pred,
            score,
            learner.updates,
            None if others is None else {n: o[1] for n, o in others.items()},  # their scores
        )
        if early is None:
            return False
        joiner.join_early(r, *early, learner, self.send, self.tally, self.replica, self.models)
        return True

    # points, a span at once -----------------------------------------------
    def waiting(self, partition: int, ids: list, ys: list) -> list[tuple[int, int]]:
        """(index, label's y) of the events (``ids``, labels ``ys``) of a batch of ``partition`` whose label waits
        for them: the task's ``step_many`` learns each join right after its point, as :meth:`published` would."""
        return self.joiner.labels_waiting(partition, ids, ys)

    def published_many(
        self, records, at, ids: list, xs: list, ys: list, steps, others: dict | None, joins: list, values, topic, before
    ) -> None:
        """A span's predictions ``values`` sent to ``topic`` in record order (record ``records[at[k]]`` for event
        ``k``; ``before(i)`` sends the dead letters of the records before record ``i`` first), each point without
        its label kept and each join of the span (``joins``: (k, label's y), learned by ``steps``, the champion's
        ``step_many``, and ``others``, the challengers') published right after its point."""
        joiner, send, tally, replica = self.joiner, self.send, self.tally, self.replica
        y_pred, score, version = steps.y_pred.tolist(), steps.score.tolist(), steps.updates.tolist()  # (not NumPy's)
        their_scores = {c: o.score.tolist() for c, o in (others or {}).items()}
        joined = iter(steps.joined)  # the counters after each join, in order
        label_of = dict(joins)
        # the span's points believed against one reading of the wall clock, its bound taken once (a point has no
        # earlier bound), where each point's keep() called believed() and so label_bounds()
        latest = joiner.label_bounds(joiner.wall_ms(), None)[0]
        for k, (i, value) in enumerate(zip(at, values)):
            before(i)
            early = None
            r = records[i]
            if ys[k] is None and ids[k] is not None:
                early = joiner.keep(
                    r,
                    ids[k],
                    xs[k],
                    y_pred[k],
                    score[k],
                    version[k],
                    None if others is None else {c: their[k] for c, their in their_scores.items()},
                    latest,
                )
                # what the table holds now is what waiting() read before the step (nothing came between): a
                # mismatch would publish one label's join with another's learning
                if (early is not None) != (k in label_of) or (early is not None and early[1]["y"] != label_of[k]):
                    raise RuntimeError(f"point {ids[k]!r}: its label was not the one that waited")
            send(topic, r.key, value)
            if early is not None:  # its label came first: its join (learned with the span) published now
                joiner.publish_early(r, *early, next(joined), {}, send, tally, replica)

    def points_done(self, records) -> None:
        """A batch of points processed: those too large for the pending changelog (kept by none) each an
        ``output_refused`` dead letter, after its prediction (its label, when it comes, finds no point); the
        clocks moved to the batch's last point."""
        joiner = self.joiner
        if joiner.refused:
            refused, joiner.refused = joiner.refused, []
            for r, why in refused:
                error = f"this event's prediction was published, but {why}: its label will not be joined"
                log.error("%s (input at %s[%d] offset %d)", error, r.topic, r.partition, r.offset)
                value = dead_letter_value(  # no key, no raw: as every output_refused letter (the input is at source)
                    Rejection("output_refused", error),
                    None,
                    r.topic,
                    r.partition,
                    r.offset,
                    max_bytes=joiner.max_message_bytes,
                )
                self.send(joiner.join.dlq_topic, None, value)
                self.tally.rejected.append("output_refused")
        if records:
            joiner.saw_point(records[0].partition, records[-1].timestamp)

    # labels ---------------------------------------------------------------
    def labels(self, records, run, each: bool = False) -> None:
        """A batch of labels: each joins its pending point (the model learns, the decision is scored), waits for
        its point, or is a dead letter; ``run``: the task's learning through the batch (see the module). The joins
        learn together (:meth:`Joiner.label_many`), or, ``each``, one label at a time (the reference; and with
        mixing, as a mix may come after any join)."""
        joiner, send, tally, replica, models = self.joiner, self.send, self.tally, self.replica, self.models
        if not each:
            run.stamp()
            joiner.label_many(records, joiner.read(records, tally), run.learner, send, tally, replica, models)
            for r in records:
                run.passed(r, False, send)
            return
        for r, label in zip(records, joiner.read(records, tally)):
            run.stamp()
            before = tally.joined
            joiner.label(r, label, run.learner, send, tally, replica, models)
            run.passed(r, tally.joined > before, send)
