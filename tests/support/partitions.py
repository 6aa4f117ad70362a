"""An input topic of several partitions, as the ``--model-scope partition`` tests feed it and read its replicas back.

Events are dealt round-robin over the partitions, each keyed by its id
(:func:`dealt_events`, :func:`produce_dealt`); a replica learns its partition's
events alone, so what it should hold is the offline replay of those
(:func:`replay`); :func:`replicas` reads each replica's newest checkpoint.
"""

from __future__ import annotations

import json
import re

from perceptron_stream.config import ServeSettings, load
from perceptron_stream.kafka import CompactedTopic
from perceptron_stream.learning import make_learner
from perceptron_stream.state.kafka_store import KafkaStore
from perceptron_stream.streams import separable

from tests.support.topics import create_topic, produce, stable_offsets

#: The partition count of the scale-out tests' input topic.
PARTITIONS = 6


def dealt_events(count: int, seed: int, partitions: int = PARTITIONS) -> list[tuple[int, dict]]:
    """(partition, event) dealt round-robin over the partitions, each event keyed by its id (in offset order per
    partition however the list is cut and produced)."""
    return [
        (i % partitions, e)
        for i, (e, _) in enumerate(zip(separable(dimensions=6, noise=0.05, seed=seed), range(count)))
    ]


def produce_dealt(bootstrap: str, topic: str, events: list[tuple[int, dict]], partitions: int = PARTITIONS) -> None:
    """``events`` written to their partitions (the topic created with ``partitions`` when missing), keyed by id."""
    create_topic(bootstrap, topic, partitions=partitions)
    for p in range(partitions):
        mine = [e for q, e in events if q == p]
        if mine:
            produce(bootstrap, topic, mine, keys=[e["id"].encode() for e in mine], partition=p)


def of_partition(events: list[tuple[int, dict]], partition: int) -> list[dict]:
    """The events of ``partition``, in offset order."""
    return [e for q, e in events if q == partition]


def replay(events: list[dict]):
    """A fresh learner (the service's default cap) stepped over ``events``, and what it published for each: the
    prediction's (y_pred, score, mistake) and model numbers of a replica, whatever its partition."""
    learner = make_learner(max_features=ServeSettings.model_fields["max_model_features"].default)
    published = []
    for e in events:
        y_pred, score, mistake = learner.step(e["x"], e["y"])
        published.append(
            (y_pred, score, mistake, {"version": learner.updates, "seen": learner.seen, "mistakes": learner.mistakes})
        )
    return learner, published


def replicas(args: list[str], partitions: int = PARTITIONS, committed: bool = False) -> dict:
    """Each replica's newest checkpoint in the Kafka store (``committed``: the one committed with the group's
    offsets, as an exactly-once restart restores it)."""
    s = load(ServeSettings, args)
    if s.state_store == "local":
        from perceptron_stream.state.local import LocalStore

        local = LocalStore(s.state_dir, s.group_id)
        return {p: local.load(f"partition-{p}") for p in range(partitions)}
    positions = None
    if committed:
        positions = {(s.input_topic, p): o for p, o in stable_offsets(s, s.group_id, s.input_topic).items()}
    store = KafkaStore(CompactedTopic(s, s.checkpoint_topic), s.group_id)
    try:
        return {p: store.load(f"partition-{p}", committed=positions) for p in range(partitions)}
    finally:
        store.close()


def held_partitions(log: str) -> set[int]:
    r"""The partitions a service held at the end of (a part of) its log: its "assigned" and "revoked" lines in order.

    >>> held_partitions("a assigned in[0], in[1]\nb revoked in[1]\nc assigned in[2]")
    {0, 2}
    """
    held: set[int] = set()
    for line in log.splitlines():
        for what, change in ((" assigned ", held.update), (" revoked ", held.difference_update)):
            if what in line:
                change({int(p) for p in re.findall(r"\[(\d+)\]", line.split(what, 1)[1])})
    return held


def check_partition_outputs(by_source: dict, events: list[tuple[int, dict]], partitions: int = PARTITIONS) -> int:
    """Every (partition, offset) predicted, each copy byte for byte the first, each the offline replay of its
    partition's events alone (a replica that never mixes); the repeats (``by_source``: an OutputWatcher's, by
    :func:`~tests.support.service.source_partition_offset`)."""
    repeats = 0
    for p in range(partitions):
        mine = of_partition(events, p)
        _, published = replay(mine)
        for offset, (e, (y_pred, score, mistake, model)) in enumerate(zip(mine, published)):
            outputs = by_source.get((p, offset))
            assert outputs, f"partition {p} offset {offset}: no prediction"
            assert len(set(outputs)) == 1, f"partition {p} offset {offset}: repeats differ"
            repeats += len(outputs) - 1
            got = json.loads(outputs[0])
            assert (got["id"], got["y_pred"], got["score"], got["mistake"]) == (e["id"], y_pred, score, mistake)
            assert got["model"] == {"scope": "partition", "partition": p, "mixes": 0, **model}, (p, offset)
    expected = {(p, o) for p in range(partitions) for o in range(len(of_partition(events, p)))}
    assert set(by_source) == expected, f"predictions of inputs never produced: {sorted(set(by_source) - expected)[:5]}"
    return repeats


class DealtFlow:
    """Dealt events written at ``per_second`` from a thread, in their order, until :meth:`stop` (or the list's end):
    a keyed stream that keeps coming while instances die, join and freeze. :meth:`stop` returns what was written."""

    def __init__(self, bootstrap: str, topic: str, events: list[tuple[int, dict]], per_second: float):
        import threading

        self.bootstrap, self.topic, self.events, self.per_second = bootstrap, topic, events, per_second
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> DealtFlow:
        self._thread.start()
        return self

    def _run(self) -> None:
        import time

        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=self.bootstrap, acks="all", linger_ms=5)
        try:
            began = time.monotonic()
            while self.sent < len(self.events) and not self._stop.is_set():
                due = min(len(self.events), int((time.monotonic() - began) * self.per_second) + 1)
                for p, e in self.events[self.sent : due]:
                    producer.send(self.topic, json.dumps(e).encode(), key=e["id"].encode(), partition=p)
                producer.flush()
                self.sent = max(self.sent, due)
                time.sleep(0.05)
        finally:
            producer.close()

    def stop(self) -> list[tuple[int, dict]]:
        self._stop.set()
        self._thread.join(60)
        return self.events[: self.sent]
