"""The join of a label with its point, and the label path's dead letters: what the delayed-label path publishes.

When a label meets its point (whichever came first), the model learns (x, y)
with its *current* weights (the update condition is the current y·score ≤ 0:
that keeps the (R/γ)² bound), the *published* prediction's outcome is counted
(the mistake rate is that of the decisions made, the challengers' theirs: a
mistake is the published score against the label, y·score ≤ 0, as for a
labeled event: :func:`~perceptron_stream.learning.labels.is_mistake`),
and an outcome message is published. A label that cannot be joined is a dead
letter. No Kafka here: messages go to a ``send`` callable.
"""

from __future__ import annotations

import math

from perceptron_stream.learning.labels import is_mistake
from perceptron_stream.learning.many import relabel_many
from perceptron_stream.wire.messages import Rejection
from perceptron_stream.wire.outputs import dead_letter_record, outcome


def _kept_wrong(score: float | None, y: int) -> bool:
    """A score kept with a pending point against its label ``y``, as a labeled event's is scored (a non-finite
    score, kept as JSON null, is NaN's: no mistake)."""
    return is_mistake(y, math.nan if score is None else score)


def decided_wrong(point: dict, y: int) -> bool:
    """Whether the decision published for ``point`` (a pending row) was a mistake on its label ``y``."""
    return _kept_wrong(point["score"], y)


def challenger_wrong(point: dict, name: str, y: int) -> bool:
    """Whether challenger ``name``'s decision on ``point`` was a mistake on ``y``: its score kept with the point
    (a row kept before scores were holds its prediction ±1, whose sign is its score's: the same verdict but at a
    score of exactly 0); a challenger added since the point came, with nothing kept, is scored as a mistake."""
    scores = point.get("challengers", {})
    return name not in scores or _kept_wrong(scores[name], y)


class Join:
    """The messages of the label path: outcomes on ``outcome_topic``, dead letters on ``dlq_topic``."""

    def __init__(self, outcome_topic: str, dlq_topic: str, max_message_bytes: int):
        self.outcome_topic, self.dlq_topic, self.max_message_bytes = outcome_topic, dlq_topic, max_message_bytes

    def joined(
        self,
        label_id,
        y: int,
        point: dict,
        key,
        topic: str,
        partition: int,
        offset: int,
        at: float,
        learner,
        send,
        tally,
        replica,
        models,
    ) -> None:
        """Learn (x, y) with the current weights, count the published decision's outcome, publish it.

        ``point`` is the pending row (:meth:`~perceptron_stream.pipeline.labels.joiner.Joiner.keep`); ``topic``, ``partition``,
        ``offset`` and ``at`` (seconds) are the label's."""
        learner.relabel(point["x"], y, decided_wrong(point, y))
        theirs = {}
        if models is not None:
            for name, challenger in models.challengers.items():
                wrong = challenger_wrong(point, name, y)
                challenger.relabel(point["x"], y, wrong)
                theirs[name] = wrong
        counters = (learner.updates, learner.seen, learner.mistakes)
        self.publish(label_id, y, point, key, topic, partition, offset, at, counters, theirs, send, tally, replica)

    def learn_many(self, points: list[dict], ys: list[int], learner, models) -> list[tuple]:
        """:meth:`joined`'s learning for many joins in order, each learner's by ``relabel_many`` (the same floats as
        one relabel at a time): per join, the champion's (updates, seen, mistakes) after it, the challengers'
        mistakes on its decision and whether the published decision was one, for :meth:`publish` (its
        ``mistake``: decided once a join, not again as it is published)."""
        xs = [point["x"] for point in points]
        decided = [decided_wrong(point, y) for point, y in zip(points, ys)]
        updates, mistakes = relabel_many(learner, xs, ys, decided)
        seen = learner.seen
        wrong: dict[str, list[bool]] = {}
        for name, challenger in ({} if models is None else models.challengers).items():
            wrong[name] = [challenger_wrong(point, name, y) for point, y in zip(points, ys)]
            relabel_many(challenger, xs, ys, wrong[name])
        names = list(wrong)
        theirs = [dict(zip(names, flags)) for flags in zip(*wrong.values())] if names else [{} for _ in xs]
        return [((u, seen, m), t, d) for u, m, t, d in zip(updates, mistakes, theirs, decided)]

    def publish(
        self,
        label_id,
        y: int,
        point: dict,
        key,
        topic,
        partition,
        offset,
        at,
        counters,
        theirs,
        send,
        tally,
        replica,
        counted: bool = False,
        mistake: bool | None = None,
    ) -> None:
        """A joined decision counted and its outcome sent: ``counters`` the model's (updates, seen, mistakes) after
        the join learned, ``theirs`` the challengers' mistakes on it (``counted``: their flags and the decision's
        are in the tally already); ``mistake``: whether the decision was one (None: decided here)."""
        if mistake is None:
            mistake = decided_wrong(point, y)
        if not counted:
            for name, wrong in theirs.items():
                tally.challenger_flags.setdefault(name, []).append(wrong)
            tally.flags.append(mistake)
        tally.joined += 1  # a decision scored; its point was counted as an event when it came (not again here)
        tally.label_outcomes.append("joined")
        delay = max(0.0, at - point["at"])  # 0: the label came first
        tally.delays.append(delay)
        updates, seen, mistakes = counters
        send(
            self.outcome_topic,
            key,
            outcome(
                label_id,
                y,
                point["y_pred"],
                point["score"],
                mistake,
                point["source"],
                topic,
                partition,
                offset,
                delay,
                updates,
                seen,
                mistakes,
                replica,
            ),
        )

    def dead_letter(self, value, key, topic, partition, offset, rejection: Rejection, send, tally) -> None:
        """A label (its record's value, key and position) rejected: a dead letter, counted by reason."""
        key, value = dead_letter_record(rejection, value, key, topic, partition, offset, self.max_message_bytes)
        send(self.dlq_topic, key, value)
        tally.rejected.append(rejection.reason)
