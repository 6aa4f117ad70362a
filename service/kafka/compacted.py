"""Compacted topics, on kafka-python whichever client runs the poll loop: a key → value store (checkpoints),
a tail followed a few records a turn (mixes), and a log partitioned like the input (the pending changelog).

Every reader here reads committed records only (``ISOLATION_LEVEL``), as the
poll loop does: under exactly-once a checkpoint, a mix record or a changelog
record is written in the transaction of its span, and one of an aborted
transaction (or of a zombie's, fenced) must never be restored. Their end is
then the last stable offset: a transaction left open (its instance crashed)
holds a reader back until the coordinator aborts it
(``TRANSACTION_TIMEOUT_MS``). A read from the beginning (checkpoints,
changelog) ends only past the high watermark its first fetch saw
(:class:`_ReadEnd`), not at the last stable offset: every transaction that had
written to the topic when the read began is over (committed or aborted) before
it ends. Several instances share the one-partition checkpoint topic; stopping at
the last stable offset, held back by a crashed instance's open transaction,
would miss a checkpoint another instance committed after it (the one a
partition moving between live instances is restored from), and a commit whose
markers are not written yet. With no transactions on these topics (the
at-least-once service) they read exactly what they read before. The embedded
broker shows aborted records even so (tests/integration/test_transactions.py).
"""

from __future__ import annotations

import time

from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError
from perceptron_stream.config import KafkaSettings
from perceptron_stream.kafka.contract import RecordLimits, refuse_too_large
from perceptron_stream.kafka.errors import service_error, translated
from perceptron_stream.kafka.kp_mends import close_consumer, close_producer
from perceptron_stream.kafka.kp_options import (
    ISOLATION_LEVEL,
    READ_FETCH_MAX_WAIT_MS,
    kafka_python_options,
    make_producer,
)

#: The state topics' own clients never create a topic: one deleted under the service is not brought back by them with
#: the brokers' defaults (cleanup.policy=delete) at their next write or read; the service notices and stops
#: (runtime/state_topics.py). The poll loop's producer, which writes mix records and, under exactly-once, checkpoints
#: and changes in its transactions, may still create one (auto-creation on, for the output topics): a restart then
#: refuses it for its cleanup.policy. kafka-python honours it through kp_mends.net_client.
NO_AUTO_CREATE = {"allow_auto_create_topics": False}


class _ReadEnd:
    """Where a read_committed read of ``tps`` from their beginning ends: past the high watermark of the first fetch
    (every record written when the read began), so that every transaction open then is over; the last stable offset
    until that fetch tells it. That high watermark is never below a true last stable offset asked before it, and
    the embedded broker's ListOffsets is wrong both ways: short of the end (README "Brokers"), and, for a topic
    deleted and created again, the old topic's end, which a fetch never reaches (a restart read the checkpoint
    topic until its 30 s timeout, tests/integration/test_state_topics.py): its fetch tells the end."""

    def __init__(self, consumer: KafkaConsumer, tps: list[TopicPartition]):
        self.consumer, self.tps = consumer, tps
        self.ends = dict(consumer.end_offsets(tps))  # read_committed: the last stable offsets
        self.seen: set[TopicPartition] = set()  # whose first fetch's high watermark is in ``ends``

    def reached(self) -> bool:
        """After a poll: whether every partition's position is past its end."""
        for tp in self.tps:
            if tp not in self.seen and (high := self.consumer.highwater(tp)) is not None:
                self.ends[tp] = high
                self.seen.add(tp)
        return len(self.seen) == len(self.tps) and all(self.consumer.position(tp) >= self.ends[tp] for tp in self.tps)


class CompactedTopic:
    """A compacted topic used as a small key → value store (the Kafka checkpoint store)."""

    @translated
    def __init__(self, settings: KafkaSettings, topic: str, limits: RecordLimits | None = None):
        self.settings, self.topic, self.limits = settings, topic, limits
        self.producer = make_producer(settings, linger_ms=0, max_request_size=16 * 1024 * 1024, **NO_AUTO_CREATE)

    @translated
    def put(self, key: bytes, value: bytes, timeout_s: float = 10.0) -> None:
        """Write and wait for the broker's acknowledgement (RecordTooLarge, before sending, for a record the topic
        would refuse for good)."""
        refuse_too_large(self.limits, self.topic, key, value)
        self.producer.send(self.topic, key=key, value=value).get(timeout=timeout_s)

    @translated
    def read_latest(self, wanted: set[bytes], timeout_s: float = 30.0) -> dict[bytes, bytes | None]:
        """The last value of each key in ``wanted``, reading every partition from its beginning (as compaction would keep).

        Memory stays at about one value per wanted key: fetches are capped at
        1 MiB (a larger record still comes, alone), few records are handed over
        per poll, and the values of other keys are dropped as they come.
        """
        consumer = KafkaConsumer(
            **kafka_python_options(self.settings),
            enable_auto_commit=False,
            group_id=None,
            isolation_level=ISOLATION_LEVEL,
            **NO_AUTO_CREATE,
            fetch_max_bytes=1024 * 1024,
            max_partition_fetch_bytes=1024 * 1024,
            max_poll_records=16,
            fetch_max_wait_ms=READ_FETCH_MAX_WAIT_MS,
        )
        try:
            partitions = consumer.partitions_for_topic(self.topic) or set()
            tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
            if not tps:  # the service made sure it exists: not "no checkpoint", which would start a new model
                raise KafkaError(
                    f"the checkpoint topic {self.topic} shows no partitions (metadata not there yet, "
                    "or the topic is not visible to this client: check its ACLs)"
                )
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            end = _ReadEnd(consumer, tps)
            out: dict[bytes, bytes | None] = {}
            deadline, quiet_polls = time.monotonic() + timeout_s, 0
            # read until past the end AND one poll came back empty
            while time.monotonic() < deadline:
                batches = consumer.poll(timeout_ms=200)
                empty = not batches
                for messages in batches.values():
                    for m in messages:
                        if m.key in wanted:
                            out[m.key] = m.value
                batches = messages = None  # the values of other keys go now, not at the next poll
                done = end.reached()
                quiet_polls = quiet_polls + 1 if empty else 0
                if done and quiet_polls >= 1:
                    return out
            raise KafkaError(f"reading {self.topic} did not finish within {timeout_s:.0f} s")
        finally:
            close_consumer(consumer)

    def close(self) -> None:
        close_producer(self.producer, 5.0)


class TopicTail:
    """A compacted topic read from its beginning and then followed, a few records a turn (the mix topic).

    Fetches are capped (1 MiB; a larger record still comes, alone), so a turn
    holds little in memory; the caller keeps only the latest value per key.
    """

    @translated
    def __init__(self, settings: KafkaSettings, topic: str):
        self.settings, self.topic = settings, topic
        self.consumer = KafkaConsumer(
            **kafka_python_options(settings),
            enable_auto_commit=False,
            group_id=None,
            isolation_level=ISOLATION_LEVEL,
            **NO_AUTO_CREATE,
            fetch_max_bytes=1024 * 1024,
            max_partition_fetch_bytes=1024 * 1024,
            max_poll_records=64,
            fetch_max_wait_ms=READ_FETCH_MAX_WAIT_MS,
        )
        try:
            partitions = self.consumer.partitions_for_topic(topic) or set()
            if not partitions:
                raise KafkaError(
                    f"topic {topic} shows no partitions (metadata not there yet, or not visible to this client)"
                )
            tps = [TopicPartition(topic, p) for p in sorted(partitions)]
            self.consumer.assign(tps)
            self.consumer.seek_to_beginning(*tps)
        except BaseException:
            close_consumer(self.consumer)
            raise

    @translated
    def poll(self, timeout_ms: int = 0) -> list[tuple[bytes | None, bytes | None]]:
        """The (key, value) of the records that came since the last call, in order."""
        return [(m.key, m.value) for messages in self.consumer.poll(timeout_ms=timeout_ms).values() for m in messages]

    def close(self) -> None:
        close_consumer(self.consumer)


class PartitionedLog:
    """A compacted topic partitioned like the input, written and read one partition at a time (the pending changelog)."""

    @translated
    def __init__(self, settings: KafkaSettings, topic: str):
        self.settings, self.topic = settings, topic
        self.limits: RecordLimits | None = None  # set once start-up read them
        self.producer = make_producer(settings, linger_ms=50, max_request_size=4 * 1024 * 1024, **NO_AUTO_CREATE)
        self._futures: list = []

    @translated
    def send(self, partition: int, key: bytes, value: bytes) -> None:
        refuse_too_large(self.limits, self.topic, key, value)
        self._futures.append(self.producer.send(self.topic, key=key, value=value, partition=partition))

    @translated
    def flush(self, timeout_s: float = 30.0) -> None:
        """Every record sent acknowledged, or the first failure raised."""
        futures, self._futures = self._futures, []
        self.producer.flush(timeout=timeout_s)
        for future in futures:
            future.get(timeout=0)

    def read(self, partition: int, timeout_s: float = 120.0):
        """(key, value) of every record of ``partition``, from its beginning to its end, in order (a generator)."""
        for _, key, value in read_partition(self.settings, self.topic, partition, timeout_s=timeout_s):
            yield key, value

    def close(self) -> None:
        close_producer(self.producer, 5.0)


def read_partition(
    settings: KafkaSettings, topic: str, partition: int, start: int | None = None, timeout_s: float = 120.0
):
    """(offset, key, value) of the committed records of ``topic[partition]`` from ``start`` (None: its beginning)
    to its end, in order (a generator; the service's errors, :func:`~perceptron_stream.kafka.errors.service_error`)."""
    try:
        yield from _read_partition(settings, topic, partition, start, timeout_s)
    except KafkaError as exc:
        raise service_error(exc, settings) from exc


def _read_partition(settings: KafkaSettings, topic: str, partition: int, start: int | None, timeout_s: float):
    consumer = KafkaConsumer(
        **kafka_python_options(settings),
        enable_auto_commit=False,
        group_id=None,
        isolation_level=ISOLATION_LEVEL,
        **NO_AUTO_CREATE,
        fetch_max_bytes=4 * 1024 * 1024,
        max_partition_fetch_bytes=4 * 1024 * 1024,
        fetch_max_wait_ms=READ_FETCH_MAX_WAIT_MS,
    )
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        if start is None:
            consumer.seek_to_beginning(tp)
        else:
            consumer.seek(tp, start)
        end = _ReadEnd(consumer, [tp])
        deadline, quiet = time.monotonic() + timeout_s, 0
        while time.monotonic() < deadline:
            batches = consumer.poll(timeout_ms=200)
            for messages in batches.values():
                for m in messages:
                    yield m.offset, m.key, m.value
            quiet = quiet + 1 if not batches else 0
            if end.reached() and quiet >= 1:  # one quiet poll too (the embedded broker)
                return
        raise KafkaError(f"reading {topic}[{partition}] did not finish within {timeout_s:.0f} s")
    finally:
        close_consumer(consumer)
