"""An input topic of several partitions, as the ``--model-scope partition`` tests feed it and read its replicas back.

Events are dealt round-robin over the partitions, each keyed by its id
(:func:`dealt_events`, :func:`produce_dealt`); a replica learns its partition's
events alone, so what it should hold is the offline replay of those
(:func:`replay`); :func:`replicas` reads each replica's newest checkpoint.
"""

from __future__ import annotations

from perceptron_stream.config import ServeSettings, load
from perceptron_stream.kafka import CompactedTopic, committed_offsets
from perceptron_stream.learning import make_learner
from perceptron_stream.state.kafka_store import KafkaStore
from perceptron_stream.streams import separable

from tests.support.topics import create_topic, produce

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
    only = {}
    if committed:
        offsets = committed_offsets(s, s.group_id, s.input_topic)
        only = {"committed": {(s.input_topic, p): o for p, o in offsets.items()}}
    store = KafkaStore(CompactedTopic(s, s.checkpoint_topic), s.group_id)
    try:
        return {p: store.load(f"partition-{p}", **only) for p in range(partitions)}
    finally:
        store.close()
