"""The join of a label with its point, and the label path's dead letters: what the delayed-label path publishes.

When a label meets its point (whichever came first), the model learns (x, y)
with its *current* weights (the update condition is the current y·score ≤ 0:
that keeps the (R/γ)² bound), the *published* prediction's outcome is counted
(the mistake rate is that of the decisions made, the challengers' theirs),
and an outcome message is published. A label that cannot be joined is a dead
letter. No Kafka here: messages go to a ``send`` callable.
"""

from __future__ import annotations

from perceptron_stream.wire.messages import Rejection
from perceptron_stream.wire.outputs import dead_letter_record, outcome


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
        mistake = point["y_pred"] != y
        learner.relabel(point["x"], y, mistake)
        if models is not None:
            predicted = point.get("challengers", {})
            for name, challenger in models.challengers.items():
                theirs = predicted.get(name)  # None: a challenger added since the point came (scored as a mistake)
                challenger.relabel(point["x"], y, theirs != y)
                tally.challenger_flags.setdefault(name, []).append(theirs != y)
        tally.labeled += 1
        tally.flags.append(mistake)
        tally.label_outcomes.append("joined")
        delay = max(0.0, at - point["at"])  # 0: the label came first
        tally.delays.append(delay)
        send(
            self.outcome_topic,
            key,
            outcome(
                label_id,
                y,
                point["y_pred"],
                point["score"],
                point["source"],
                topic,
                partition,
                offset,
                delay,
                learner.updates,
                learner.seen,
                learner.mistakes,
                replica,
            ),
        )

    def dead_letter(self, value, key, topic, partition, offset, rejection: Rejection, send, tally) -> None:
        """A label (its record's value, key and position) rejected: a dead letter, counted by reason."""
        key, value = dead_letter_record(rejection, value, key, topic, partition, offset, self.max_message_bytes)
        send(self.dlq_topic, key, value)
        tally.rejected.append(rejection.reason)
