"""What the application sees of Kafka, whichever client is behind it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

#: Group timings that let a consumer join the embedded broker's group in
#: seconds (see DESIGN.md); Apache Kafka is happy with them too.
GROUP_TIMINGS = {"max_poll_interval_ms": 300_000, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}


#: Offsets of ``seek`` that mean the start and the end of a partition.
BEGINNING, END = -2, -1


class Record(NamedTuple):
    """A consumed message, as the poll loop reads it.

    A client may hand over its own record type when it has these attributes:
    kafka-python's ConsumerRecord passes as it is (a copy cost 0.7 µs an event).
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int  # ms since the epoch


def first_offsets(positions: Iterable[tuple[str, int, int]]) -> dict[tuple[str, int], int]:
    """The first offset of each partition among ``(topic, partition, offset)`` in read order:
    where to seek back so that records in hand are read again.

    >>> first_offsets([("t", 0, 5), ("t", 1, 9), ("t", 0, 6)])
    {('t', 0): 5, ('t', 1): 9}
    """
    first: dict[tuple[str, int], int] = {}
    for topic, partition, offset in positions:
        first.setdefault((topic, partition), offset)
    return first


class TopicSpec(NamedTuple):
    name: str
    partitions: int
    replication_factor: int
    config: dict[str, str] = {}


class DeliveryError(RuntimeError):
    """The broker did not acknowledge some messages; nothing was committed."""


class MissingTopicError(RuntimeError):
    """Topics the service needs do not exist and it may not create them."""


def _errors(*names: str) -> tuple[type, ...]:
    import kafka.errors

    return tuple(getattr(kafka.errors, name) for name in names if hasattr(kafka.errors, name))


#: The brokers rejected the SASL mechanism (error 33), the SASL exchange (34)
#: or the credentials (58): sasl_mechanism, sasl_username or sasl_password must change.
AUTHENTICATION_ERRORS = _errors("UnsupportedSaslMechanismError", "IllegalSaslStateError", "SaslAuthenticationFailedError")

#: Errors that retrying cannot cure: a setting or the brokers' permissions
#: must change. The service stops with the error instead of retrying forever.
FATAL_ERRORS = _errors(
    "AuthorizationError", "SaslAuthenticationFailedError", "UnsupportedSaslMechanismError", "IllegalSaslStateError",
    "InvalidReplicationFactorError", "InvalidPartitionsError", "InvalidTopicError", "PolicyViolationError",
    "KafkaConfigurationError",  # e.g. librdkafka refusing an unreadable PEM file
)

#: Errors of one message that sending it again cannot cure: the brokers
#: refuse it for good (larger than the topic allows, invalid).
REFUSED_ERRORS = _errors("MessageSizeTooLargeError", "RecordListTooLargeError", "InvalidRecordError", "CorruptRecordError")


class Refused(NamedTuple):
    """A message the brokers refused for good, returned by ``flush``."""

    topic: str
    key: bytes | None
    value: bytes
    error: Exception
