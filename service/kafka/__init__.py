"""Everything that talks to Kafka, behind one small interface.

The application sees :class:`Record` tuples, a stream object with ``poll`` /
``send`` / ``flush`` (returns the messages refused for good) / ``commit`` /
``seek`` (to an offset, BEGINNING or END) / ``lag`` / ``group_members`` /
``close``, and plain exceptions (kafka-python's ``KafkaError`` family, which
every client here raises). Two clients stand behind it, chosen by the
``kafka_client`` setting:

- ``kafka-python`` (:mod:`service.kafka.kafka_python`, the default, pure Python);
- ``confluent`` (:mod:`service.kafka.confluent`, librdkafka through
  confluent-kafka, the ``confluent`` extra): the client's work in C, several
  times the throughput (bench/README.md).

Topic set-up, group membership and the checkpoint topic use kafka-python
whichever client runs the poll loop: they are not on the hot path.
"""

from __future__ import annotations

from collections.abc import Callable

from service.config import KafkaSettings
from service.kafka.kafka_python import (
    CompactedTopic,
    KafkaIO,
    client_options,
    close_producer,
    cluster_identity,
    committed_offsets,
    ensure_topics,
    group_members,
    log_ranges,
    make_producer,
)
from service.kafka.types import (
    AUTHENTICATION_ERRORS,
    BEGINNING,
    END,
    FATAL_ERRORS,
    GROUP_TIMINGS,
    REFUSED_ERRORS,
    DeliveryError,
    MissingTopicError,
    Record,
    Refused,
    TopicSpec,
    first_offsets,
)

__all__ = [
    "AUTHENTICATION_ERRORS",
    "BEGINNING",
    "END",
    "FATAL_ERRORS",
    "GROUP_TIMINGS",
    "REFUSED_ERRORS",
    "Refused",
    "committed_offsets",
    "CompactedTopic",
    "DeliveryError",
    "KafkaIO",
    "MissingTopicError",
    "Record",
    "TopicSpec",
    "client_options",
    "close_producer",
    "cluster_identity",
    "ensure_topics",
    "first_offsets",
    "group_members",
    "log_ranges",
    "make_producer",
    "open_stream",
]


def open_stream(settings: KafkaSettings, client: str, *, group_id: str, input_topic: str, auto_offset_reset: str,
                on_assigned: Callable, on_revoked: Callable, max_poll_records: int, fetch_max_wait_ms: int):
    """The poll loop's consumer and producer on the chosen client (``kafka-python`` or ``confluent``).

    ``on_assigned``/``on_revoked`` get sorted ``(topic, partition)`` lists and
    run inside ``poll``, between batches.
    """
    options = dict(group_id=group_id, input_topic=input_topic, auto_offset_reset=auto_offset_reset, on_assigned=on_assigned,
                   on_revoked=on_revoked, max_poll_records=max_poll_records, fetch_max_wait_ms=fetch_max_wait_ms)
    if client == "confluent":
        from service.kafka.confluent import ConfluentIO  # the optional extra: imported only when chosen

        return ConfluentIO(settings, **options)
    return KafkaIO(settings, **options)
