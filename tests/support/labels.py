"""The delayed-label path as its tests drive it: in pure code, a group task with a joiner on in-memory pending
tables, point and label records of partition 0, and a ``send`` that keeps what was sent; against a broker, points
and their labels sent to topics of a test's own, and the offline replay a run must equal."""

from __future__ import annotations

import json
import math

from perceptron_stream.kafka.contract import Record, RecordLimits
from perceptron_stream.learning import make_learner
from perceptron_stream.learning.labels import is_mistake
from perceptron_stream.pipeline.labels import Joiner
from perceptron_stream.pipeline.task import Task
from perceptron_stream.state.checkpoint import Owner
from perceptron_stream.state.pending import PendingTable
from perceptron_stream.streams import separable
from perceptron_stream.wire.inputs import Decoder

from tests.support.topics import create_topic, produce

#: The grace period of :func:`make_joiner` (seconds).
GRACE = 300.0


def make_joiner(
    max_early: int = 100,
    changelog=None,
    *,
    ttl_seconds: float = 1e9,
    max_clock_skew: float = math.inf,
    wall=None,
) -> Joiner:
    """A joiner on in-memory tables (and ``changelog``); with ``max_clock_skew``, timestamps bounded against
    ``wall`` (a clock in seconds; None: the real one)."""
    return Joiner(
        lambda p: PendingTable(":memory:", ttl_seconds=ttl_seconds, max_pending=1000),
        ttl_seconds=ttl_seconds,
        max_pending=1000,
        outcome_topic="outcomes",
        dlq_topic="dlq",
        max_message_bytes=100_000,
        label_topic="labels",
        grace_seconds=GRACE,
        max_early=max_early,
        max_clock_skew=max_clock_skew,
        wall=wall,
        changelog=changelog,
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


class MemoryLog:
    """What Changelog uses of PartitionedLog, in memory."""

    topic = "pending"
    limits: RecordLimits | None = None  # the topics' RecordLimits, as start-up sets them

    def __init__(self):
        self.records: dict[int, list] = {}
        self.flushes = 0

    def send(self, partition, key, value):
        self.records.setdefault(partition, []).append((key, value))

    def flush(self):
        self.flushes += 1

    def read(self, partition):
        return list(self.records.get(partition, []))


class Sent(list):
    """A ``send``: (topic, key, value as JSON) in order."""

    def __call__(self, topic, key, value):
        self.append((topic, key, json.loads(value)))

    def on(self, topic: str) -> list:
        return [value for t, _, value in self if t == topic]


def labeled_points(count: int, seed: int, start: int = 0) -> list[dict]:
    """Points ``p-<n>`` (d = 5) with their label aside in ``_y``: sent without it, labeled later."""
    return [
        {"id": f"p-{start + i}", "x": e["x"], "_y": e["y"]}
        for i, (e, _) in enumerate(zip(separable(dimensions=5, noise=0.05, seed=seed), range(count)))
    ]


def send_points(broker, topic: str, points: list[dict], at_ms: int | None = None) -> None:
    """The points without their label, keyed by id (stamped ``at_ms``: None, the producer's clock)."""
    produce(
        broker.bootstrap_servers,
        topic,
        [{"id": p["id"], "x": p["x"]} for p in points],
        keys=[p["id"].encode() for p in points],
        timestamp_ms=at_ms,
    )


def send_labels(broker, topic: str, labels: list[tuple[str, int]], at_ms: int | None = None) -> None:
    """Labels (id, y), keyed by id (stamped ``at_ms``: None, the producer's clock)."""
    produce(
        broker.bootstrap_servers,
        topic,
        [{"id": i, "y": y} for i, y in labels],
        keys=[i.encode() for i, _ in labels],
        timestamp_ms=at_ms,
    )


def label_topics(broker, topics: dict) -> dict:
    """``topics`` with a label and an outcome topic of their own; every topic created with one partition."""
    out = {
        **topics,
        "label_topic": topics["input_topic"] + "-labels",
        "outcome_topic": topics["output_topic"] + "-outcomes",
    }
    for name in ("input_topic", "label_topic", "outcome_topic", "output_topic", "dlq_topic"):
        create_topic(broker.bootstrap_servers, out[name])
    return out


def replay_labels(points, labels_in_order, then=(), challenger=None, max_features: int | None = 50_000):
    """Offline: predictions of the points, outcomes of the labels (in their order), predictions of ``then``
    (and a challenger variant scored on the same points and labels); ``max_features``: the service's
    --max-model-features (None: 0, no cap)."""
    learner = make_learner(max_features=max_features)
    other = make_learner(challenger, max_features=50_000) if challenger else None
    published, theirs, by_id = {}, {}, {p["id"]: p for p in points + list(then)}
    for p in points:
        published[p["id"]] = learner.step(p["x"], None)
        if other is not None:
            theirs[p["id"]] = other.step(p["x"], None)[1]  # its score
    outcomes = []
    for point_id, y in labels_in_order:
        y_pred, score, _ = published[point_id]
        learner.relabel(by_id[point_id]["x"], y, is_mistake(y, score))
        if other is not None:
            other.relabel(by_id[point_id]["x"], y, is_mistake(y, theirs[point_id]))
        outcomes.append((point_id, y, y_pred, score, is_mistake(y, score)))
    later = [learner.step(p["x"], None) for p in then]
    if other is not None:
        for p in then:
            other.step(p["x"], None)
        learner.challenger = other  # type: ignore[union-attr]  # the replay's challenger, carried by its champion
    return published, outcomes, later, learner
