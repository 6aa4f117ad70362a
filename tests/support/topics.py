"""Topics as a test writes and reads them, with kafka-python beside the service: create, produce, consume."""

from __future__ import annotations

import itertools
import json
import time

from tests.support.waiting import wait_until


def create_topic(bootstrap: str, name: str, partitions: int = 1, config: dict[str, str] | None = None) -> None:
    """``name`` with ``partitions`` partitions (replication 1) and topic ``config``; nothing when it exists."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1, topic_configs=config or {})])
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()


def produce(bootstrap: str, topic: str, values, keys=None, partition=None, timestamp_ms: int | None = None) -> None:
    """Write raw values (bytes, or dicts turned into JSON) and wait for the acks; stamped ``timestamp_ms`` (the
    records' CreateTime; None: the producer's clock).

    The topic is created with one partition when missing: the broker would
    auto-create it with four.
    """
    from kafka import KafkaProducer

    create_topic(bootstrap, topic)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        keys = keys or itertools.repeat(None)
        for value, key in zip(values, keys):
            raw = value if isinstance(value, (bytes, type(None))) else json.dumps(value).encode()
            producer.send(topic, value=raw, key=key, partition=partition, timestamp_ms=timestamp_ms)
        producer.flush()
    finally:
        producer.close()


def consume(bootstrap: str, topic: str, count: int, timeout: float = 60.0):
    """Read ``count`` records from the start of every partition of ``topic``."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        wait_until(lambda: consumer.partitions_for_topic(topic), timeout, what=f"topic {topic}")
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out: list = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            for messages in consumer.poll(timeout_ms=200).values():
                out.extend(messages)
        assert len(out) >= count, f"read {len(out)} of {count} records from {topic} in {timeout:.0f} s"
        return out
    finally:
        consumer.close()


def read_all(
    bootstrap: str, topic: str, read_committed: bool = False, quiet_polls: int = 3, timeout: float = 60.0
) -> list:
    """Every record of every partition of ``topic``, from its start: read to each partition's end offset as it
    was when reading began (its last stable offset for ``read_committed``: only what committed transactions
    wrote), then on until ``quiet_polls`` polls in a row bring nothing (the embedded broker's end offset may read
    short by a batch). A first fetch that comes back empty under load is not taken for the end."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        group_id=None,
        isolation_level="read_committed" if read_committed else "read_uncommitted",
    )
    try:
        wait_until(lambda: consumer.partitions_for_topic(topic), timeout, what=f"topic {topic}")
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        out, quiet, deadline = [], 0, time.monotonic() + timeout

        def behind() -> list:
            return [tp for tp in tps if consumer.position(tp) < ends[tp]]

        while quiet < quiet_polls or behind():
            assert time.monotonic() < deadline, f"{topic}: {behind()} not read to {ends} in {timeout:.0f} s"
            batch = consumer.poll(timeout_ms=300)
            quiet = 0 if batch else quiet + 1
            out += [m for tp in tps for m in batch.get(tp, [])]
        return out
    finally:
        consumer.close()


def end_offset(bootstrap: str, topic: str, partition: int = 0, read_committed: bool = False) -> int:
    """``topic``'s ``partition``'s end offset, as the brokers answer it now (``read_committed``: its last stable
    offset, where readers wait for the first open transaction; the embedded broker's may read short by a batch)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        group_id=None,
        isolation_level="read_committed" if read_committed else "read_uncommitted",
    )
    try:
        tp = TopicPartition(topic, partition)
        return consumer.end_offsets([tp])[tp]
    finally:
        consumer.close()


def stable_offsets(settings, group_id: str, topic: str, timeout: float = 60.0) -> dict[int, int]:
    """Consumer group ``group_id``'s committed offsets on ``topic`` as a read_committed restore reads them: the
    brokers refuse them while a transaction that commits them is not over (its markers may still be on their
    way), and they are asked again, as the service's restore does, for up to ``timeout`` s."""
    from perceptron_stream.kafka import KafkaUnavailable, committed_offsets

    deadline = time.monotonic() + timeout
    while True:
        try:
            return committed_offsets(settings, group_id, topic, stable=True)
        except KafkaUnavailable:
            if time.monotonic() > deadline:
                raise
