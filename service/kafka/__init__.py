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

from typing import Any

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
from perceptron_stream.kafka.compacted import CompactedTopic, PartitionedLog, TopicTail, read_partition
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
    StreamOptions,
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
    "StreamOptions",
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
    "read_partition",
    "record_limits",
    "refuse_too_large",
    "require_codecs",
    "require_mends",
    "topic_configs",
]


def open_stream(settings: KafkaSettings, client: str, options: StreamOptions | None = None, /, **fields: Any) -> Stream:
    """The poll loop's consumer and producer on the chosen client (``kafka-python`` or ``confluent``), opened with
    ``options`` (or the same as keyword arguments: :class:`StreamOptions` says what each means)."""
    options = StreamOptions.given(options, fields)
    if client == "confluent":
        from perceptron_stream.kafka.confluent import ConfluentIO  # the optional extra: imported only when chosen

        return ConfluentIO(settings, options)
    return KafkaIO(settings, options)
