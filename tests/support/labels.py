"""The delayed-label path in pure code, as its tests drive it: a group task with a joiner on in-memory pending
tables, point and label records of partition 0, and a ``send`` that keeps what was sent."""

from __future__ import annotations

import json

from perceptron_stream.kafka.contract import Record
from perceptron_stream.learning import make_learner
from perceptron_stream.pipeline.labels import Joiner
from perceptron_stream.pipeline.task import Task
from perceptron_stream.state.checkpoint import Owner
from perceptron_stream.state.pending import PendingTable
from perceptron_stream.wire.inputs import Decoder

#: The grace period of :func:`make_joiner` (seconds).
GRACE = 300.0


def make_joiner(max_early: int = 100) -> Joiner:
    return Joiner(
        lambda p: PendingTable(":memory:", ttl_seconds=1e9, max_pending=1000),
        ttl_seconds=1e9,
        max_pending=1000,
        outcome_topic="outcomes",
        dlq_topic="dlq",
        max_message_bytes=100_000,
        label_topic="labels",
        grace_seconds=GRACE,
        max_early=max_early,
    )


def make_task(joiner: Joiner | None) -> Task:
    return Task(
        "group",
        Owner("g", "points"),
        make_learner(),
        Decoder(100_000, 1000),
        {},
        joiner=joiner,
        outputs={
            "output_topic": "predictions",
            "dlq_topic": "dlq",
            "max_message_bytes": 100_000,
            "label_topic": "labels",
        },
    )


def point(offset: int, point_id: str, ms: int) -> Record:
    return Record("points", 0, offset, point_id.encode(), json.dumps({"id": point_id, "x": [1.0, -2.0]}).encode(), ms)


def label(offset: int, point_id: str, y: int, ms: int) -> Record:
    return Record("labels", 0, offset, point_id.encode(), json.dumps({"id": point_id, "y": y}).encode(), ms)


class Sent(list):
    """A ``send``: (topic, key, value as JSON) in order."""

    def __call__(self, topic, key, value):
        self.append((topic, key, json.loads(value)))

    def on(self, topic: str) -> list:
        return [value for t, _, value in self if t == topic]
