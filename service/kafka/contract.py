"""What the application sees of Kafka, whichever client is behind it: records, the stream, and the service's own errors.

No client's exception crosses this line: each client translates what it
raises into :class:`KafkaUnavailable` (wait and retry) or :class:`KafkaFatal`
(stop, naming what to fix), so the runtime classifies errors in one place.

A stream opened with a transactional id (``open_stream(...,
transactional_id=...)``) also writes in Kafka transactions: what it sends
between :meth:`Stream.begin` and :meth:`Stream.commit_transaction`, and the
input positions that commit names, become visible to read_committed readers
together, or not at all. Two more errors belong to that path:
:class:`Fenced` (a :class:`KafkaFatal`: another instance owns the partitions
now; this one may write nothing more) and :class:`Aborted` (a
:class:`KafkaUnavailable`: the transaction was aborted, nothing of it is
visible; read the span again from the committed positions). This holds on
Apache Kafka only: the embedded broker accepts transactions but shows an
aborted one's records to read_committed readers, and does not check the
generation of a transaction's offsets (tests/integration/test_transactions.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

#: Group timings that let a consumer join the embedded broker's group in
#: seconds (with its defaults a join waited out a dead member's 45 s session;
#: README "Brokers"); Apache Kafka is happy with them too, and a crashed
#: instance's partitions move within about 6 s.
GROUP_TIMINGS = {"max_poll_interval_ms": 300_000, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}


#: A transactional stream's ``transaction.timeout.ms``, as Kafka Streams sets it under exactly-once: the
#: transaction coordinator aborts a transaction left open longer (the instance that opened it crashed or froze),
#: so an open transaction blocks read_committed readers of its partitions (they wait at the last stable offset)
#: for at most this long plus the coordinator's look-up interval (the brokers'
#: transaction.abort.timed.out.transaction.cleanup.interval.ms, 10 s by default); the abort also bumps the
#: producer's epoch, which fences the frozen instance when it thaws (tests/integration/test_transactions.py).
TRANSACTION_TIMEOUT_MS = 10_000


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
    config: Mapping[str, str] = MappingProxyType({})  # read-only: one default shared by every spec


class KafkaUnavailable(Exception):
    """The brokers did not answer, or not yet (away, a timeout, a rebalance): waiting and retrying can cure it.

    ``timed_out``: the call gave up waiting, or found no connection (the brokers may be away), as
    opposed to an answer that said "not now" (a rebalance in progress).
    ``coordinator``: the brokers answered that the coordinator of the group or transaction is not available (yet):
    a new cluster's coordinator loads for a few seconds; the brokers are up.
    """

    def __init__(self, message: str, timed_out: bool = False, coordinator: bool = False):
        super().__init__(message)
        self.timed_out = timed_out
        self.coordinator = coordinator


class KafkaFatal(Exception):
    """Retrying cannot cure it: a setting or the brokers' permissions must change. ``hint`` says which."""

    def __init__(
        self, message: str, hint: str = "check the Kafka settings (security, credentials, ACLs, replication factor)"
    ):
        super().__init__(message)
        self.hint = hint


class Fenced(KafkaFatal):
    """This instance may no longer write for its partitions: a transaction of it was refused for good.

    Either the group moved its partitions to another member while it did not
    poll (frozen past its session timeout: the group coordinator refused the
    transaction's offsets of an old generation, KIP-447), or the transaction
    coordinator gave its producer's epoch away (its open transaction timed out
    and was aborted, or another producer took its transactional id). Nothing
    of the transaction is visible. Fatal rather than retried: the instance's
    view of its partitions is stale, and whatever it held in memory for them
    belongs to their new owner now; stopping (and starting afresh) is the cure.
    """

    def __init__(self, message: str):
        super().__init__(
            message,
            "another instance owns these partitions now (this one stopped polling past its "
            "session timeout, or shares its transactional id): restart it",
        )

    @classmethod
    def no_member(cls) -> Fenced:
        """Raised before a transaction's offsets are sent when the consumer knows it is no member of its group
        any more (its client reset its member id and generation: the group removed it). The group coordinator
        checks a transactional offset commit only against the member id and generation it carries, and takes
        one with neither unchecked (they were optional before KIP-447): sent, a zombie's outputs would commit."""
        return cls("the group removed this instance (its client holds no member id): its offsets are not sent")


class Aborted(KafkaUnavailable):
    """The transaction was aborted (a delivery or a transactional call failed, but the producer may go on):
    nothing sent in it, and none of its positions, is visible. Retried: seek back to the committed positions
    and process the span again in a new transaction."""


class DeliveryError(KafkaUnavailable):
    """The brokers did not acknowledge some messages in time; nothing was committed."""


class MissingTopicError(KafkaFatal):
    """Topics the service needs do not exist and it may not create them."""

    def __init__(self, message: str):
        super().__init__(message, "create them, or let the service create them (--create-topics)")


#: What a record batch of one record costs beside the record's key and value, kept out of a topic's
#: max.message.bytes: the batch header (61 bytes), the record's own varints and attributes (at most 28 bytes),
#: and room to spare (the service's records carry no headers). Measured on Apache Kafka 4.3.1, both clients, a
#: topic with max.message.bytes=100000: the largest value it took alone was 99,928 bytes (72 bytes of overhead).
RECORD_OVERHEAD_BYTES = 128


class RecordLimits:
    """The largest record (key + value) each topic the service writes accepts: its ``max.message.bytes`` less
    :data:`RECORD_OVERHEAD_BYTES`, measured before sending, so that a record the brokers would refuse for good is
    never sent (under exactly-once one refused record aborts the whole transaction).

    >>> limits = RecordLimits({"out": 100_000}, default=1_048_588)
    >>> limits.of("out"), limits.of("other")
    (99872, 1048460)
    >>> limits.too_large("out", b"k", b"v" * 99_871) is None
    True
    >>> limits.too_large("out", None, b"v" * 99_873)
    'a record of 99873 bytes exceeds max.message.bytes=100000 of topic out (less 128 bytes of record overhead)'

    A compacted topic (``keyed``) refuses a record without a key for good too (InvalidRecordError):

    >>> RecordLimits({}, 1_048_588, keyed={"out"}).too_large("out", None, b"{}")
    'topic out is compacted (cleanup.policy=compact): it refuses a record without a key'
    """

    def __init__(self, max_message_bytes: Mapping[str, int], default: int, keyed: Iterable[str] = ()):
        self.max_message_bytes, self.default = dict(max_message_bytes), default
        self.keyed = frozenset(keyed)  # compacted topics: a record without a key is refused
        self._of = {t: m - RECORD_OVERHEAD_BYTES for t, m in self.max_message_bytes.items()}
        self._default = default - RECORD_OVERHEAD_BYTES

    def of(self, topic: str) -> int:
        """The largest key + value ``topic`` accepts."""
        return self._of.get(topic, self._default)

    def setting(self, topic: str) -> int:
        """``topic``'s max.message.bytes as the brokers apply it (the default where they described none)."""
        return self.max_message_bytes.get(topic, self.default)

    def smallest(self) -> int:
        """The largest key + value every topic the service writes accepts (a producer's batch stays within it)."""
        return min([self._default, *self._of.values()])

    def too_large(self, topic: str, key: bytes | None, value: bytes) -> str | None:
        """Why ``topic`` would refuse the record for good (None: it fits)."""
        if key is None and topic in self.keyed:
            return f"topic {topic} is compacted (cleanup.policy=compact): it refuses a record without a key"
        size = len(value) + (len(key) if key is not None else 0)
        if size <= self._of.get(topic, self._default):
            return None
        return (
            f"a record of {size} bytes exceeds max.message.bytes="
            f"{self.setting(topic)} of topic {topic} "
            f"(less {RECORD_OVERHEAD_BYTES} bytes of record overhead)"
        )


class RecordTooLarge(KafkaFatal):
    """A record the service must write (a checkpoint, say) is larger than its topic accepts: no retry can help."""


def refuse_too_large(limits: RecordLimits | None, topic: str, key: bytes | None, value: bytes) -> None:
    """RecordTooLarge for a record ``topic`` would refuse for good: an error naming the topic and its setting, where
    waiting for the brokers would have retried it forever ("the brokers do not answer")."""
    why = None if limits is None else limits.too_large(topic, key, value)
    if why is not None:
        raise RecordTooLarge(
            why,
            f"raise max.message.bytes of topic {topic} (kafka-configs.sh --alter --entity-type topics "
            f"--entity-name {topic} --add-config max.message.bytes=...)",
        )


class Refused(NamedTuple):
    """A message the brokers refused for good (too large, invalid), returned by ``flush``."""

    topic: str
    key: bytes | None
    value: bytes
    error: BaseException | None  # None: the client gave no reason


@dataclass(frozen=True)
class StreamOptions:
    """How the poll loop's stream is opened, whichever client opens it (:func:`perceptron_stream.kafka.open_stream`,
    :class:`~perceptron_stream.kafka.kafka_python.KafkaIO`, :class:`~perceptron_stream.kafka.confluent.ConfluentIO`):
    the one list of the stream's options, which each of them takes (as this object, or as keyword arguments).

    ``on_assigned``/``on_revoked`` get sorted ``(topic, partition)`` lists and
    run inside ``poll``, between batches: the partitions added and taken away.
    The classic protocol takes every partition away and hands out the new
    assignment whole; the ``consumer`` protocol (``group_protocol``, KIP-848, confluent only) only
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

    >>> StreamOptions.given(None, {"group_id": "g", "topics": ["in"], "auto_offset_reset": "earliest",
    ...     "on_assigned": print, "on_revoked": print, "max_poll_records": 10}).fetch_max_wait_ms
    500
    """

    group_id: str
    topics: list[str]
    auto_offset_reset: str
    on_assigned: Callable
    on_revoked: Callable
    max_poll_records: int
    fetch_max_wait_ms: int = 500
    client_id: str = "perceptron-stream"
    group_protocol: str = "classic"
    transactional_id: str | None = None
    on_lost: Callable | None = None
    batch_bytes: int | None = None

    @classmethod
    def given(cls, options: StreamOptions | None, fields: Mapping[str, Any]) -> StreamOptions:
        """``options``, or the options of ``fields`` (the keyword arguments of the stream's opener): one or the other."""
        if options is None:
            return cls(**fields)
        if fields:
            raise TypeError(f"the stream's options given twice: as StreamOptions and as {', '.join(fields)}")
        return options


class Stream(Protocol):
    """The poll loop's consumer (in one consumer group) and producer, whichever client is behind them.

    Every method raises only :class:`KafkaUnavailable` or :class:`KafkaFatal`
    (the clients translate their own errors). Rebalance callbacks, given at
    construction, run inside :meth:`poll` (and, with librdkafka, inside
    :meth:`commit`), between batches; what one raises, :meth:`poll` raises
    as it was (:mod:`perceptron_stream.kafka.rebalance`).
    """

    def poll(self, timeout_ms: int, max_records: int) -> list[list[Record]]:
        """The next records, one list per partition, each in offset order."""

    def send(self, topic: str, key: bytes | None, value: bytes) -> None: ...

    def flush(self, timeout_s: float) -> list[Refused]:
        """Until every message sent is acknowledged; those refused for good are returned (DeliveryError in time)."""

    def commit(self, positions: dict[tuple[str, int], int], timeout_s: float | None = None) -> None: ...

    def seek(self, topic: str, partition: int, offset: int) -> None: ...

    def pause(self, partitions: Iterable[tuple[str, int]] | None = None) -> None: ...

    def resume(self, partitions: Iterable[tuple[str, int]] | None = None) -> None: ...

    def assignment(self) -> list[tuple[str, int]]: ...

    def lag(self, timeout_s: float | None = None, ask_broker: bool = True) -> dict[tuple[str, int], int]:
        """Messages left to read in each assigned partition. With ``ask_broker``, the brokers are asked even when
        nothing is assigned (the end of the first topic's partition 0): the loop's probe. A 6 s session lost in an
        outage revokes every partition, and a probe that asked nothing then never knew the brokers were away
        (the service said no outage at all, tests/integration/test_log_lines.py)."""

    def group_members(self) -> dict[str, str]: ...

    def close(self) -> None: ...

    # only on a stream opened with a transactional id ---------------------------
    def begin(self) -> None:
        """Open a transaction (nothing if one is open): what is sent from now on is visible only once committed."""

    def send_to(self, topic: str, partition: int, key: bytes | None, value: bytes) -> None:
        """Send to ``partition`` in the open transaction: for a log partitioned like the input (the pending
        changelog), whose records must land in their input partition's number. :meth:`send` goes into the open
        transaction too: another writer of the service (the Kafka checkpoint store) writes through these two."""

    def commit_transaction(self, positions: dict[tuple[str, int], int], timeout_s: float) -> list[Refused]:
        """Flush, then commit what was sent and the next-offsets ``positions`` (of the partitions still assigned)
        in the open transaction (one is opened if none is), with the consumer's group metadata; the messages
        refused for good are returned, as :meth:`flush` returns them (they are not in the transaction).

        Raises :class:`Fenced` or :class:`KafkaFatal` (stop), or :class:`Aborted` (the transaction was
        aborted: read the span again); either way nothing of the transaction is visible.
        """

    def abort(self) -> None:
        """Abort the open transaction, if any, and forget what was sent in it: nothing of it becomes visible."""
