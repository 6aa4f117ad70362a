"""Everything that talks to Kafka, behind one small interface (:mod:`perceptron_stream.kafka.contract`).

The application sees :class:`Record` tuples, a :class:`Stream` (the poll
loop's consumer and producer), a few admin calls, and the service's own
errors: :class:`KafkaUnavailable` (wait and retry) and :class:`KafkaFatal`
(stop, naming what to fix). A stream opened with a transactional id writes
in Kafka transactions (:func:`open_stream`; contract.py says what one
covers), and adds :class:`Fenced` (stop: another instance owns the
partitions) and :class:`Aborted` (read the span again) to those errors. Two clients stand behind the stream, chosen by
the ``kafka_client`` setting, and share one delivery book-keeping
(:mod:`perceptron_stream.kafka.ledger`), one error vocabulary (:mod:`perceptron_stream.kafka.errors`),
one backoff (:mod:`perceptron_stream.kafka.backoff`) and one way of calling the
application's rebalance callbacks (:mod:`perceptron_stream.kafka.rebalance`):

- ``kafka-python`` (:mod:`perceptron_stream.kafka.kafka_python`, the default, pure Python);
- ``confluent`` (:mod:`perceptron_stream.kafka.confluent`, librdkafka through
  confluent-kafka, the ``confluent`` extra): the client's work in C, several
  times the throughput (bench/README.md).

Topic set-up, group membership, log ranges (:mod:`perceptron_stream.kafka.admin`) and
the compacted topics (checkpoints, mixes: :mod:`perceptron_stream.kafka.compacted`) use
kafka-python whichever client runs the poll loop: they are not on the hot
path. kafka-python's clients are built by :mod:`perceptron_stream.kafka.kp_options`,
with the mends of its bugs (:mod:`perceptron_stream.kafka.kp_mends`).
"""

from __future__ import annotations

from collections.abc import Callable

from perceptron_stream.config import KafkaSettings
from perceptron_stream.kafka.admin import (
    DEFAULT_MAX_MESSAGE_BYTES,
    TopicWatch,
    cluster_identity,
    committed_offsets,
    ensure_topics,
    group_members,
    log_ranges,
    partition_counts,
    record_limits,
    topic_configs,
)
from perceptron_stream.kafka.compacted import CompactedTopic, PartitionedLog, TopicTail
from perceptron_stream.kafka.contract import (
    BEGINNING,
    END,
    GROUP_TIMINGS,
    TRANSACTION_TIMEOUT_MS,
    Aborted,
    DeliveryError,
    Fenced,
    KafkaFatal,
    KafkaUnavailable,
    MissingTopicError,
    Record,
    RecordLimits,
    RecordTooLarge,
    Refused,
    Stream,
    TopicSpec,
    first_offsets,
    refuse_too_large,
)
from perceptron_stream.kafka.kafka_python import CountingProducer, KafkaIO
from perceptron_stream.kafka.kp_mends import close_producer, require_mends
from perceptron_stream.kafka.kp_options import client_options, make_producer, require_codecs

__all__ = [
    "BEGINNING",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "END",
    "GROUP_TIMINGS",
    "TRANSACTION_TIMEOUT_MS",
    "Aborted",
    "CompactedTopic",
    "CountingProducer",
    "DeliveryError",
    "Fenced",
    "KafkaFatal",
    "KafkaIO",
    "KafkaUnavailable",
    "MissingTopicError",
    "PartitionedLog",
    "Record",
    "RecordLimits",
    "RecordTooLarge",
    "Refused",
    "Stream",
    "TopicSpec",
    "TopicTail",
    "TopicWatch",
    "client_options",
    "close_producer",
    "cluster_identity",
    "committed_offsets",
    "ensure_topics",
    "first_offsets",
    "group_members",
    "log_ranges",
    "make_producer",
    "open_stream",
    "partition_counts",
    "record_limits",
    "refuse_too_large",
    "require_codecs",
    "require_mends",
    "topic_configs",
]


def open_stream(
    settings: KafkaSettings,
    client: str,
    *,
    group_id: str,
    topics: list[str],
    auto_offset_reset: str,
    on_assigned: Callable,
    on_revoked: Callable,
    max_poll_records: int,
    fetch_max_wait_ms: int,
    group_protocol: str = "classic",
    transactional_id: str | None = None,
    on_lost: Callable | None = None,
    client_id: str = "perceptron-stream",
    batch_bytes: int | None = None,
) -> Stream:
    """The poll loop's consumer and producer on the chosen client (``kafka-python`` or ``confluent``).

    ``on_assigned``/``on_revoked`` get sorted ``(topic, partition)`` lists and
    run inside ``poll``, between batches: the partitions added and taken away.
    The classic protocol takes every partition away and hands out the new
    assignment whole; the ``consumer`` protocol (KIP-848, confluent only) only
    the partitions that move. ``on_lost`` (by default ``on_revoked``) gets the
    partitions taken away after the group removed this member (its session
    expired while it was frozen or cut off): another member may own them now.

    ``transactional_id``: the stream's producer is transactional (idempotent,
    ``TRANSACTION_TIMEOUT_MS``), its transactions initialized at once (an open
    one an earlier producer of the id left is aborted): the stream writes
    between ``begin`` and ``commit_transaction`` (contract.py). One id per
    instance: the group's generation fences a zombie (KIP-447), so the id need
    not follow the partitions. Without one the stream is the at-least-once one.

    ``client_id``: what the group's members see of this one (DescribeGroups):
    the service says its model's policy there (runtime.partitions.OnePolicy).

    ``batch_bytes``: the largest record batch the producer builds (the smallest record limit among the topics it
    writes, :class:`RecordLimits`): librdkafka does not split a batch the brokers refuse as too large, so a topic
    with a small ``max.message.bytes`` would refuse whole batches of small records.
    """
    options = dict(
        group_id=group_id,
        topics=topics,
        auto_offset_reset=auto_offset_reset,
        on_assigned=on_assigned,
        on_revoked=on_revoked,
        on_lost=on_lost,
        max_poll_records=max_poll_records,
        fetch_max_wait_ms=fetch_max_wait_ms,
        client_id=client_id,
        batch_bytes=batch_bytes,
    )
    if transactional_id is not None:  # the at-least-once stream is built exactly as before
        options["transactional_id"] = transactional_id
    if client == "confluent":
        from perceptron_stream.kafka.confluent import ConfluentIO  # the optional extra: imported only when chosen

        return ConfluentIO(settings, **options, group_protocol=group_protocol)
    if group_protocol != "classic":
        raise ValueError("kafka-python speaks only the classic group protocol")
    return KafkaIO(settings, **options)
