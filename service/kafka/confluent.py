"""The confluent-kafka client (librdkafka) behind :mod:`perceptron_stream.kafka`'s interface: the ``confluent`` extra.

Same interface and guarantees as :class:`perceptron_stream.kafka.kafka_python.KafkaIO`,
with the client's work (fetching, batching, checksums) in librdkafka's C
threads instead of the poll loop's, which is what makes it several times
faster (bench/README.md). librdkafka's errors are mapped to kafka-python's
classes once (:func:`kafka_error`, with :data:`perceptron_stream.kafka.errors.LIBRDKAFKA_ERRORS`)
and leave this module as the service's own (:func:`perceptron_stream.kafka.errors.service_error`),
whichever client runs.

With a transactional id, :class:`ConfluentIO`'s producer writes in
transactions, as KafkaIO's: librdkafka's errors of a transactional call
carry ``retriable()`` (the call is tried again until its deadline),
``txn_requires_abort()`` (aborted, then :class:`~perceptron_stream.kafka.contract.Aborted`
or, for a fenced member or generation, :class:`~perceptron_stream.kafka.contract.Fenced`)
and ``fatal()`` (the producer is broken for good: Fenced or KafkaFatal),
classified by :func:`perceptron_stream.kafka.errors.transaction_error`.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import Any

import kafka.errors as kerrors
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, Consumer, KafkaException, Message, Producer, TopicPartition
from confluent_kafka import KafkaError as CKafkaError
from confluent_kafka.admin import AdminClient
from perceptron_stream.config import KafkaSettings
from perceptron_stream.kafka.admin import group_members
from perceptron_stream.kafka.contract import (
    BEGINNING,
    END,
    GROUP_TIMINGS,
    TRANSACTION_TIMEOUT_MS,
    Fenced,
    KafkaFatal,
    KafkaUnavailable,
    Record,
    Refused,
    StreamOptions,
    first_offsets,
)
from perceptron_stream.kafka.errors import (
    CERTIFICATE_REFUSED_ALERTS,
    FATAL,
    LIBRDKAFKA_ERRORS,
    LIBRDKAFKA_TRANSACTION_ERRORS,
    REFUSED,
    RETRY,
    ClientCertificateRefused,
    SslAuthenticationError,
    delivery_kind,
    service_error,
    transaction_error,
    translated,
)
from perceptron_stream.kafka.kp_options import ISOLATION_LEVEL, LINGER_UNTIL_FLUSH_MS
from perceptron_stream.kafka.ledger import Ledger
from perceptron_stream.kafka.rebalance import RebalanceCallbacks

log = logging.getLogger(__name__)

#: The producer, as :func:`perceptron_stream.kafka.kp_options.make_producer` and KafkaIO's:
#: - acks=all; idempotence keeps each partition in order and free of duplicates
#:   when librdkafka retries with requests in flight (Tansu grants producer ids);
#: - records wait for the flush at the end of the batch (one request per
#:   partition and batch); librdkafka's flush() sends at once whatever the linger;
#: - only failures are reported back to Python: per-message callbacks would
#:   cost the poll loop about a microsecond an event for nothing.
PRODUCER = {
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": LINGER_UNTIL_FLUSH_MS,
    "message.max.bytes": 4 * 1024 * 1024,
    "delivery.report.only.error": True,
}
#: How long a send waits for room in librdkafka's full local queue before the
#: message is held for the flush instead (kafka-python's max_block_ms).
MAX_BLOCK_S = 10.0
#: librdkafka's consumer close waits for a commit in flight, and a commit waits
#: for the group coordinator for as long as the brokers are away: bounded here.
CLOSE_TIMEOUT_S = 10.0
#: How long each consume() waits while a commit's answer is awaited (commit()).
COMMIT_SLICE_S = 0.001
#: lag(ask_broker=True) without a timeout: KafkaIO's request timeout.
DEFAULT_REQUEST_TIMEOUT_S = 10.0
#: How long a transactional call (init, send offsets, commit, abort) may take when the caller gives no deadline.
TRANSACTION_CALL_TIMEOUT_S = 30.0
_LOGICAL_OFFSETS = {BEGINNING: OFFSET_BEGINNING, END: OFFSET_END}

#: librdkafka's own (negative) error codes that the service tells apart → kafka-python's class
#: (:data:`perceptron_stream.kafka.errors.LIBRDKAFKA_ERRORS`, named there); the brokers' (positive) codes are Kafka's,
#: which kafka-python's for_code knows.
_LOCAL_ERRORS = {getattr(CKafkaError, code): getattr(kerrors, name) for code, name in LIBRDKAFKA_ERRORS.items()}
#: ... and those that mean more in a transaction (:data:`perceptron_stream.kafka.errors.LIBRDKAFKA_TRANSACTION_ERRORS`).
_TRANSACTION_ERRORS = {
    getattr(CKafkaError, code): getattr(kerrors, name) for code, name in LIBRDKAFKA_TRANSACTION_ERRORS.items()
}


def kafka_error(err: CKafkaError | None, in_transaction: bool = False) -> kerrors.KafkaError:
    """kafka-python's exception for a confluent-kafka error: the one mapping of this module."""
    if not isinstance(err, CKafkaError):
        return kerrors.KafkaError(str(err))
    code = err.code()
    if in_transaction and code in _TRANSACTION_ERRORS:
        return _TRANSACTION_ERRORS[code](f"{err.str()} ({err.name()})")
    cls = kerrors.for_code(code) if code > 0 else _LOCAL_ERRORS.get(code, kerrors.KafkaError)
    return cls(f"{err.str()} ({err.name()})")


#: The service's translation (:func:`perceptron_stream.kafka.errors.translated`) with librdkafka's exception mapped to
#: kafka-python's class first (:func:`kafka_error`): what a method's confluent-kafka call (or its own check) raised.
_translated = functools.partial(
    translated, foreign={KafkaException: lambda exc: kafka_error(exc.args[0] if exc.args else None)}
)


def client_config(settings: KafkaSettings) -> dict:
    """Bootstrap servers and the security settings, in librdkafka's names.

    No ``broker.address.family``: the embedded broker listens on and advertises
    127.0.0.1, a numeric address, so there is no IPv6 name to try first.
    """
    config = {"bootstrap.servers": settings.bootstrap_servers, "security.protocol": settings.security_protocol.lower()}
    if settings.sasl_mechanism:
        config["sasl.mechanism"] = settings.sasl_mechanism
        if settings.sasl_username is not None:
            config["sasl.username"] = settings.sasl_username
        if settings.sasl_password is not None:
            config["sasl.password"] = settings.sasl_password.get_secret_value()
    for name, key in (
        ("ssl_cafile", "ssl.ca.location"),
        ("ssl_certfile", "ssl.certificate.location"),
        ("ssl_keyfile", "ssl.key.location"),
    ):
        if getattr(settings, name) is not None:
            config[key] = str(getattr(settings, name))
    if settings.ssl_password is not None:
        config["ssl.key.password"] = settings.ssl_password.get_secret_value()
    return config


def _group_config(protocol: str) -> dict:
    """The consumer's group settings. Both protocols give partition p of every topic to one member (the join of
    labels to points needs it): the classic one with the client-side range assignor, KIP-848's with the brokers'
    range assignor. Under KIP-848 the brokers own the session timeout and heartbeat (group.consumer.*)."""
    if protocol == "consumer":
        return {
            "group.protocol": "consumer",
            "group.remote.assignor": "range",
            "max.poll.interval.ms": GROUP_TIMINGS["max_poll_interval_ms"],
        }
    return {
        "partition.assignment.strategy": "range",
        **{name.replace("_", "."): value for name, value in GROUP_TIMINGS.items()},
    }


class ConfluentIO:
    """One consumer in a group on one input topic, and one producer (see KafkaIO), opened with
    :class:`~perceptron_stream.kafka.contract.StreamOptions` (or the same as keyword arguments).

    Rebalance callbacks run on the calling thread, from ``consume()``: inside
    :meth:`poll`, or inside :meth:`commit` while it waits for the broker's
    answer; the application calls both between batches.
    """

    #: With a transactional id (else None), whether a transaction is open: what is sent goes into it.
    transactional_id: str | None = None
    in_transaction = False

    @_translated
    def __init__(self, settings: KafkaSettings, options: StreamOptions | None = None, /, **fields: Any):
        o = StreamOptions.given(options, fields)
        transactional_id = o.transactional_id
        self.max_poll_records = o.max_poll_records  # consume() takes the count per call: poll's, or this in commit
        self.settings, self.group_id, self.topics = settings, o.group_id, o.topics
        self.callbacks = RebalanceCallbacks(o.on_assigned, o.on_revoked, o.on_lost)
        self.auto_offset_reset = o.auto_offset_reset
        self._rejected: kerrors.KafkaError | None = None  # SASL mechanism or credentials rejected, or certificate
        common = {**client_config(settings), "client.id": o.client_id, "logger": log, "error_cb": self._client_error}
        self.consumer = Consumer(
            {
                **common,
                "group.id": o.group_id,
                "enable.auto.commit": False,
                "auto.offset.reset": o.auto_offset_reset,
                "fetch.wait.max.ms": o.fetch_max_wait_ms,
                "on_commit": self._committed,
                # librdkafka's default too, explicit: committed records only, as KafkaIO reads
                "isolation.level": ISOLATION_LEVEL,
                **_group_config(o.group_protocol),
            }
        )
        self.incremental = o.group_protocol == "consumer"
        self._producer_config = {**common, **PRODUCER, "on_delivery": self._undelivered}
        if o.batch_bytes is not None:  # librdkafka's default is 1,000,000; it never splits a batch refused as too large
            self._producer_config["batch.size"] = max(1, min(1_000_000, o.batch_bytes))
        self.transactional_id, self.in_transaction = transactional_id, False
        if transactional_id is not None:
            # the coordinator aborts a transaction left open TRANSACTION_TIMEOUT_MS (a crashed instance's blocks
            # read_committed readers about that long: contract.py); idempotent already (PRODUCER). librdkafka bounds a message's
            # time (message.timeout.ms) by the transaction's and wants the linger shorter: still a flush's wait
            self._producer_config.update(
                {
                    "transactional.id": transactional_id,
                    "transaction.timeout.ms": TRANSACTION_TIMEOUT_MS,
                    "linger.ms": TRANSACTION_TIMEOUT_MS // 2,
                }
            )
        self.producer = Producer(self._producer_config)
        if transactional_id is not None:
            try:
                self.producer.init_transactions(TRANSACTION_CALL_TIMEOUT_S)  # aborts what an earlier one left open
            except BaseException:
                self.consumer.close()  # not subscribed yet: leaves no group
                raise
        self._seeks: dict | None = None  # inside on_assigned: where the application wants each partition to start
        self._pauses: list = []  # inside on_assigned: partitions to pause once assigned
        self.ledger = Ledger()  # failures reported by _undelivered, until a flush settles them
        self._held: list = []  # (topic, key, value) sent after the producer refused one: kept, in order, for the flush
        self._poll_error = None  # an error that came with records: raised by the next poll
        self._stash: list = []  # messages consume() returned while commit() waited: the next polls' records
        self._commits_waiting = 0  # asynchronous commits whose answer has not been served yet
        self._commit_result: tuple = (None, [])
        self._closing = False
        self.consumer.subscribe(list(o.topics), on_assign=self._assigned, on_revoke=self._revoked, on_lost=self._lost)

    # consuming -----------------------------------------------------------
    @_translated
    def poll(self, timeout_ms: int, max_records: int) -> list[list[Record]]:
        """The records of one consume() call (or those commit() kept), one list per partition; an error is
        raised after its batch.

        Raising with records in hand would lose them: their positions are
        past, and the next commit would skip them.
        """
        self._raise_rejection()
        self.callbacks.raise_failure()  # one raised in a rebalance that a commit served
        if self._poll_error is not None:
            error, self._poll_error = self._poll_error, None
            raise KafkaException(error)
        if self._stash:
            messages = self._stash[:max_records]
            del self._stash[:max_records]
        else:  # like kafka-python's poll: wait for the first record only, then take what has come
            messages = self.consumer.consume(1, timeout_ms / 1000)
            if messages and max_records > 1:
                messages += self.consumer.consume(max_records - 1, 0)
        self.callbacks.raise_failure()  # what a rebalance callback raised inside consume(): the records go, the service stops
        if messages and not any(map(Message.error, messages)):  # the common batch: its Records made by C loops
            records = list(map(tuple.__new__, repeat(Record), zip(*_columns(messages))))
            if len(set(zip(map(_TOPIC, records), map(_PARTITION, records)))) == 1:
                return [records]
            grouped: dict[tuple[str, int], list[Record]] = {}
            for r in records:
                grouped.setdefault((r.topic, r.partition), []).append(r)
            return list(grouped.values())
        new = tuple.__new__
        by_partition: dict[tuple[str, int], list[Record]] = {}
        for m in messages:
            if m.error() is None:
                topic, partition = m.topic(), m.partition()
                batch = by_partition.get((topic, partition))
                if batch is None:
                    batch = by_partition[(topic, partition)] = []
                batch.append(new(Record, (topic, partition, m.offset(), m.key(), m.value(), m.timestamp()[1])))
        error = None
        if sum(map(len, by_partition.values())) < len(messages):
            error = next(
                (
                    m.error()
                    for m in messages
                    if m.error() is not None and m.error().code() != CKafkaError._PARTITION_EOF  # noqa: SLF001 — librdkafka's internal code, public in confluent-kafka as _PARTITION_EOF
                ),
                None,
            )
        if error is not None:
            if not by_partition:
                raise KafkaException(error)
            self._poll_error = error
        if not by_partition:
            self._raise_rejection()
        return list(by_partition.values())

    def _client_error(self, err: CKafkaError) -> None:
        _client_error(err)
        if self._rejected is None:
            self._rejected = authentication_error(err)

    def _raise_rejection(self) -> None:
        """Raise the brokers' SASL rejection or the certificate that did not verify, if librdkafka reported one
        (it retries them forever by itself)."""
        if self._rejected is not None:
            raise self._rejected

    def _assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # librdkafka cannot seek a partition before it is assigned: the seeks
        # on_assigned makes are collected and become the assignment's offsets
        # (the others start at the committed offset, or auto_offset_reset).
        # Stashed messages of these partitions are from before: fetched again from the new start. Under KIP-848
        # the partitions that stay are not in the list and keep theirs.
        self._seeks, self._pauses = {}, []
        self._drop_stashed(partitions)
        self.callbacks.assigned((tp.topic, tp.partition) for tp in partitions)
        seeks, self._seeks = self._seeks, None
        starts = [
            TopicPartition(tp.topic, tp.partition, seeks.get((tp.topic, tp.partition), tp.offset)) for tp in partitions
        ]
        if self.incremental:
            consumer.incremental_assign(starts)
        else:
            consumer.assign(starts)
        if self._pauses:  # paused inside on_assigned: only an assigned partition can be
            consumer.pause(self._pauses)

    def _revoked(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._taken_away(partitions, self.callbacks.revoked)

    def _lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._taken_away(partitions, self.callbacks.lost)

    def _taken_away(self, partitions: list[TopicPartition], tell: Callable) -> None:
        # confluent-kafka unassigns after the callback returns (revoked or lost alike). Not told on close: the
        # application has taken its final checkpoint already (kafka-python does call its listener at close,
        # where the application finds nothing new).
        self._drop_stashed(partitions)
        if not self._closing:
            tell((tp.topic, tp.partition) for tp in partitions)

    def _drop_stashed(self, partitions: list[TopicPartition]) -> None:
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self._stash = [m for m in self._stash if (m.topic(), m.partition()) not in gone]

    def assignment(self) -> list[tuple[str, int]]:
        return sorted((tp.topic, tp.partition) for tp in self.consumer.assignment())

    @_translated
    def pause(self, partitions=None) -> None:
        """Fetch nothing from ``partitions`` (all assigned ones by default) until :meth:`resume` or the next assignment."""
        tps = self.consumer.assignment() if partitions is None else [TopicPartition(t, p) for t, p in partitions]
        if self._seeks is not None:  # inside on_assigned, before the assignment: paused right after it
            self._pauses += tps
            return
        chosen = {(tp.topic, tp.partition) for tp in tps}
        # librdkafka resumes after the last message consume() handed over: what
        # commit() kept in the stash is read again only if we seek back to it
        kept = [m for m in self._stash if (m.topic(), m.partition()) in chosen]
        first = first_offsets((m.topic(), m.partition(), m.offset()) for m in kept)
        self._stash = [m for m in self._stash if (m.topic(), m.partition()) not in chosen]
        self.consumer.pause(tps)
        for (topic, partition), offset in first.items():
            self.consumer.seek(TopicPartition(topic, partition, offset))

    @_translated
    def resume(self, partitions=None) -> None:
        tps = self.consumer.assignment() if partitions is None else [TopicPartition(t, p) for t, p in partitions]
        self.consumer.resume(tps)

    @_translated
    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Next read of the partition at ``offset``, or at its BEGINNING or END."""
        offset = _LOGICAL_OFFSETS.get(offset, offset)
        if self._seeks is not None:
            self._seeks[(topic, partition)] = offset
        else:
            self._stash = [m for m in self._stash if (m.topic(), m.partition()) != (topic, partition)]
            self.consumer.seek(TopicPartition(topic, partition, offset))

    @_translated
    def commit(self, positions: dict[tuple[str, int], int], timeout_s: float | None = None) -> None:
        """Commit next-offsets of the partitions still owned; raises KafkaError (e.g. during a
        rebalance, or KafkaTimeoutError after ``timeout_s``) for the caller to retry later.

        librdkafka's synchronous commit has no timeout (it waits for the group
        coordinator as long as the brokers are away), and confluent-kafka
        serializes the calls on a consumer, so a commit in another thread would
        block poll too. So: an asynchronous commit, whose answer comes through
        consume(); what that returns meanwhile is kept for the next polls.
        librdkafka sends commits in order: a late one never lands after a newer one.
        """
        self._raise_rejection()
        owned = set(self.assignment())
        offsets = [TopicPartition(t, p, o) for (t, p), o in positions.items() if (t, p) in owned]
        if not offsets:
            return
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self.consumer.commit(offsets=offsets, asynchronous=True)
        self._commits_waiting += 1
        while self._commits_waiting:  # the answers come in order: the last one is this commit's
            left = 1.0 if deadline is None else deadline - time.monotonic()
            if left <= 0:
                raise kerrors.KafkaTimeoutError(
                    f"commit not acknowledged within {timeout_s:.1f} s"
                )  # translated on the way out
            # consume() serves the answer but returns only when its count is
            # reached or its time is up: short turns (1 ms: the answer on a
            # loopback broker comes in about that; 5 ms slices made each commit
            # of a flowing stream 5 ms at least), and a bounded stash
            room = self.max_poll_records - len(self._stash)
            messages = self.consumer.consume(max(1, room), min(left, COMMIT_SLICE_S) if room > 0 else 0)
            self._stash.extend(messages)  # after the call: a rebalance served in it empties the stash
            if room <= 0:  # a full batch in hand already: keep serving, slowly
                time.sleep(min(left, 0.001))
        err, partitions = self._commit_result
        if err is not None:
            raise KafkaException(err)
        for tp in partitions or ():
            if tp.error is not None:
                raise kafka_error(tp.error)

    def _committed(self, err: CKafkaError | None, partitions: list[TopicPartition]) -> None:
        self._commits_waiting = max(0, self._commits_waiting - 1)
        self._commit_result = (err, partitions)

    @_translated
    def lag(self, timeout_s: float | None = None, ask_broker: bool = True) -> dict[tuple[str, int], int]:
        """Messages between the consumer's position and the end of each assigned partition.

        ``ask_broker`` False: from the high watermarks of the last fetch
        responses, no request (a partition with none yet is left out). True:
        asked of the brokers (KafkaTimeoutError when they do not answer within
        ``timeout_s``). A partition read from nowhere yet starts at its
        committed offset, else where ``auto_offset_reset`` says.
        """
        self._raise_rejection()
        tps = self.consumer.assignment()
        deadline = time.monotonic() + (DEFAULT_REQUEST_TIMEOUT_S if timeout_s is None else timeout_s)

        def left() -> float:
            return max(0.001, deadline - time.monotonic())

        if not tps:
            if ask_broker:  # still a probe: an outage that revoked every partition is known (contract.py)
                self.consumer.get_watermark_offsets(TopicPartition(self.topics[0], 0), timeout=left(), cached=False)
            return {}

        positions = {(tp.topic, tp.partition): tp.offset for tp in self.consumer.position(tps)}
        unknown = [tp for tp in tps if positions[(tp.topic, tp.partition)] < 0]
        if unknown and ask_broker:
            positions.update(
                {(tp.topic, tp.partition): tp.offset for tp in self.consumer.committed(unknown, timeout=left())}
            )
        out = {}
        for tp in tps:
            key = (tp.topic, tp.partition)
            if ask_broker:
                low, high = self.consumer.get_watermark_offsets(tp, timeout=left(), cached=False)
            else:
                low, high = self.consumer.get_watermark_offsets(tp, cached=True)
            position = positions[key]
            if position < 0 and ask_broker:
                position = low if self.auto_offset_reset == "earliest" else high
            if high >= 0 and position >= 0:
                out[key] = max(0, high - position)
        return out

    @_translated
    def group_members(self) -> dict[str, str]:
        """Member id → client id of the live members of this consumer's group, this one included: kafka-python's admin for a
        classic group, librdkafka's for a KIP-848 one (the brokers answer the classic DescribeGroups for classic
        groups only)."""
        if not self.incremental:
            return group_members(self.settings, self.group_id)
        admin = AdminClient(client_config(self.settings))
        description = admin.describe_consumer_groups([self.group_id], request_timeout=10)[self.group_id].result()
        return {member.member_id: member.client_id or "" for member in description.members}

    # producing -----------------------------------------------------------
    def send(self, topic: str, key: bytes | None, value: bytes) -> None:
        if not self._held:
            try:
                try:
                    self.producer.produce(topic, value, key)
                    return
                except BufferError:  # librdkafka's local queue is full: let it drain
                    if self._send_when_room(topic, key, value):
                        return
            except KafkaException as exc:
                error = kafka_error(exc.args[0] if exc.args else None)
                if delivery_kind(error) == REFUSED:  # e.g. larger than message.max.bytes: never sendable
                    self.ledger.failed((topic, key, value), REFUSED, error)
                    return
                log.warning("the producer refused a message (%r); it is sent again at the flush", error)
        self._held.append((topic, key, value))

    def _send_when_room(self, topic: str, key: bytes | None, value: bytes) -> bool:
        deadline = time.monotonic() + MAX_BLOCK_S
        while time.monotonic() < deadline:
            self.producer.flush(0.1)  # sends now whatever the linger, serves the reports
            try:
                self.producer.produce(topic, value, key)
                return True
            except BufferError:
                continue
        log.warning(
            "the producer's queue stayed full for %.0f s; the rest of the batch waits for the flush", MAX_BLOCK_S
        )
        return False

    def _undelivered(self, err: CKafkaError, msg) -> None:
        error = kafka_error(err, self.in_transaction)
        kind = delivery_kind(error)
        self.ledger.failed(
            (msg.topic(), msg.key(), msg.value()), kind, service_error(error, self.settings) if kind == FATAL else error
        )

    def flush(self, timeout_s: float) -> list[Refused]:
        """As :meth:`KafkaIO.flush <perceptron_stream.kafka.kafka_python.KafkaIO.flush>` (:meth:`Ledger.settle`); in a
        transaction a failed delivery aborts it (Aborted or Fenced raised)."""
        if not self.in_transaction:
            return self.ledger.settle(self, timeout_s)
        try:
            return self.ledger.settle(self, timeout_s, resend=False)
        except (KafkaUnavailable, KafkaFatal) as exc:
            error = transaction_error(exc.__cause__ if exc.__cause__ is not None else exc, self.settings)
            self._abort_quietly()
            raise error from exc

    # transactions (a stream opened with a transactional id) ----------------
    def begin(self) -> None:
        """Open a transaction, if none is open (Fenced, KafkaFatal or Aborted as a commit's, nothing to abort)."""
        if not self.in_transaction:
            try:
                self.producer.begin_transaction()
            except KafkaException as exc:
                raise self._transaction_error(exc) from exc
            self.in_transaction = True

    def send_to(self, topic: str, partition: int, key: bytes | None, value: bytes) -> None:
        """As :meth:`KafkaIO.send_to <perceptron_stream.kafka.kafka_python.KafkaIO.send_to>`."""
        if not self.in_transaction:
            raise RuntimeError("send_to writes into a transaction: begin() first")
        deadline = time.monotonic() + MAX_BLOCK_S
        while True:
            try:
                self.producer.produce(topic, value, key, partition=partition)
                return
            except BufferError:  # librdkafka's local queue is full: let it drain
                if time.monotonic() >= deadline:
                    break
                self.producer.flush(0.1)
            except KafkaException as exc:  # refused for good (returned by the flush), or not taken: the flush aborts
                error = kafka_error(exc.args[0] if exc.args else None, in_transaction=True)
                self.ledger.failed((topic, key, value), REFUSED if delivery_kind(error) == REFUSED else RETRY, error)
                return
        self.ledger.failed((topic, key, value), RETRY)

    def commit_transaction(self, positions: dict[tuple[str, int], int], timeout_s: float) -> list[Refused]:
        """See :meth:`Stream.commit_transaction <perceptron_stream.kafka.contract.Stream.commit_transaction>`."""
        self.begin()
        refused = self.flush(timeout_s)
        deadline = time.monotonic() + timeout_s
        owned = set(self.assignment())
        offsets = [TopicPartition(t, p, o) for (t, p), o in positions.items() if (t, p) in owned]
        if offsets:
            metadata = self.consumer.consumer_group_metadata()  # opaque: the member id is asked after it, so a
            # reset between the two shows (a new id in between would take a whole rejoin)
            if not self.consumer.memberid():
                self._abort_quietly()
                raise Fenced.no_member()
            self._transactional(
                lambda left: self.producer.send_offsets_to_transaction(offsets, metadata, left), deadline
            )
        self._transactional(self.producer.commit_transaction, deadline)
        self.in_transaction = False
        return refused

    def _transactional(self, call: Callable[[float], None], deadline: float) -> None:
        """``call(seconds left)``, tried again while librdkafka says it may be; else the transaction is aborted
        and the service's error raised."""
        while True:
            try:
                return call(max(0.001, deadline - time.monotonic()))
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if (
                    isinstance(err, CKafkaError)
                    and err.retriable()
                    and not err.txn_requires_abort()
                    and time.monotonic() < deadline
                ):
                    continue
                error = self._transaction_error(exc)
                self._abort_quietly()
                raise error from exc

    def abort(self) -> None:
        """Abort the open transaction, if any; what was sent in it is forgotten (Fenced or KafkaFatal if the
        producer cannot abort: it was fenced, or failed for good)."""
        if not self.in_transaction:
            return
        self._held, self.in_transaction = [], False
        self.ledger.forget()
        try:
            self.producer.abort_transaction(TRANSACTION_CALL_TIMEOUT_S)
        except KafkaException as exc:
            raise self._transaction_error(exc) from exc

    def _transaction_error(self, exc: KafkaException) -> BaseException:
        err = exc.args[0] if exc.args else None
        return transaction_error(
            kafka_error(err, in_transaction=True),
            self.settings,
            producer_broken=isinstance(err, CKafkaError) and err.fatal(),
        )

    def _abort_quietly(self) -> None:
        try:
            self.abort()
        except (KafkaFatal, KafkaUnavailable) as failure:  # fenced, or broken for good: the coordinator aborts it
            log.warning("could not abort the transaction (%s)", failure)

    @_translated
    def wait(self, timeout_s: float, ledger: Ledger) -> int:
        """The ledger's wait: librdkafka's flush serves the failure reports (``_undelivered``); how many still wait.

        Messages the producer would not take (held) are reported after the
        failures: every report is in when nothing waits, and they came before.
        """
        waiting = self.producer.flush(timeout_s)
        self._raise_rejection()
        if not waiting:
            held, self._held = self._held, []
            for message in held:
                ledger.failed(message, RETRY)
        return waiting + len(self._held)

    def renew(self) -> None:
        """A fresh producer, as KafkaIO's: after failures an idempotent one may be fenced, or stuck on a sequence gap."""
        self.producer = Producer(self._producer_config)

    def close(self) -> None:
        """Flush for at most 5 s, then leave the group; never hangs, never raises a client error."""
        try:
            waiting = self.producer.flush(5.0)
            if waiting or self.ledger.owed() or self._held:
                log.warning(
                    "closed the producer with %d message(s) not acknowledged",
                    waiting + self.ledger.owed() + len(self._held),
                )
                self.producer.purge(in_queue=True, in_flight=True, blocking=False)
        except Exception as exc:  # a broken producer: nothing it held was committed
            log.warning("closing the producer failed (%s)", exc.__class__.__name__)
        finally:
            self._closing = True
            closer = threading.Thread(target=self.consumer.close, name="confluent-close", daemon=True)
            closer.start()
            closer.join(CLOSE_TIMEOUT_S)
            if closer.is_alive():
                log.warning(
                    "the consumer did not leave its group within %.0f s; the group notices at the session timeout",
                    CLOSE_TIMEOUT_S,
                )


_TOPIC, _PARTITION = attrgetter("topic"), attrgetter("partition")
_TIME = itemgetter(1)


def _columns(messages: list) -> tuple:
    """The fields of :class:`Record` of ``messages``, a column each (one C loop a field, no Python frame per message)."""
    return (
        map(Message.topic, messages),
        map(Message.partition, messages),
        map(Message.offset, messages),
        map(Message.key, messages),
        map(Message.value, messages),
        map(_TIME, map(Message.timestamp, messages)),
    )


#: librdkafka's errors (``error_cb``) that say the brokers are away: a connection refused or lost, all brokers down.
#: librdkafka reconnects by itself; the loop learns of an outage from its flushes, commits and lag probes and says it
#: once (runtime/outage.py). These are DEBUG lines, as are librdkafka's log lines of the same (:class:`_BrokersAway`).
_AWAY = {CKafkaError._TRANSPORT, CKafkaError._ALL_BROKERS_DOWN}  # noqa: SLF001 — librdkafka's own codes, public in confluent-kafka under a leading underscore


def _client_error(err: CKafkaError) -> None:
    if err.code() in _AWAY and not err.fatal() and authentication_error(err) is None:
        log.debug("kafka client: %s", err.str())
        return
    log.log(logging.ERROR if err.fatal() else logging.WARNING, "kafka client: %s", err.str())


class _BrokersAway(logging.Filter):
    """librdkafka's log lines of a connection refused or lost become DEBUG lines.

    librdkafka logs each failed connection attempt (facility ``FAIL``, at
    ERROR: "Connect to ipv4#127.0.0.1:9092 failed: Connection refused") and
    reports it again to ``error_cb``: with the broker SIGKILLed for 12 s,
    each client's threads (bootstrap, broker, coordinator) reconnecting every
    0.1-10 s made about 980 lines, ~50 a second. Quieting the logger while an
    outage is known (runtime/outage.py) missed most of them: librdkafka queues
    its log for the client's next poll, and the producer's queue was served in
    one burst of a hundred lines after the outage had ended. Whether the
    brokers are away is the service's to say, once, naming the setting; a
    connection librdkafka re-makes by itself is no news. Other lines pass;
    ``--log-level DEBUG`` shows these as DEBUG lines.

    >>> def line(fac, text):
    ...     return logging.LogRecord(log.name, logging.ERROR, "", 1, "%s [%s] %s", (fac, "rdkafka#producer-1", text), None)
    >>> _BrokersAway().filter(line("FAIL", "[thrd:b:9092/bootstrap]: Connect to ipv4#b:9092 failed: Connection refused"))
    False
    >>> _BrokersAway().filter(line("SESSTMOUT", "[thrd:main]: Consumer group session timed out (in join-state steady)"))
    False
    >>> _BrokersAway().filter(line("TERMINATE", "Handle is terminating in state UP"))
    True
    """

    #: librdkafka's facilities of a connection that failed or timed out (rdkafka_broker.c), and of the group session
    #: lost with the coordinator (rdkafka_cgrp.c: its revocation is the service's "revoked" line, the outage its own).
    FACILITIES = frozenset({"FAIL", "REQTMOUT", "SESSTMOUT"})

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if record.levelno <= logging.DEBUG or record.msg != "%s [%s] %s" or len(args) != 3:
            return True  # the DEBUG line it became (below) passes
        if args[0] not in self.FACILITIES:
            return True
        log.debug(record.msg, *args)
        return False


log.addFilter(_BrokersAway())


def authentication_error(err: CKafkaError) -> kerrors.KafkaError | None:
    """kafka-python's class (a FATAL_ERRORS one) for a report of librdkafka's that retrying cannot cure; None for others.

    librdkafka (2.16) reports a rejected SASL mechanism or credentials only to
    ``error_cb``, as a local, non-fatal error, and tries again forever:
    "SASL SCRAM-SHA-256 mechanism handshake failed: Broker: Unsupported SASL
    mechanism: broker's supported mechanisms: PLAIN" (error 33), "SASL
    authentication error: Authentication failed ..." (58). So is a broker
    certificate that did not verify (_SSL, "SSL handshake failed: ...
    certificate verify failed: broker certificate could not be verified"),
    and a client certificate the brokers refused (_TRANSPORT, "Receive
    failed: ... sslv3 alert bad certificate: SSL alert number 42").
    """
    text = err.str()
    # SLF001 below: librdkafka's internal error codes (RD_KAFKA_RESP_ERR__SSL, ...) are public in confluent-kafka under a leading underscore
    if err.code() == CKafkaError._SSL and "certificate verify failed" in text:  # noqa: SLF001
        return SslAuthenticationError(text)
    if err.code() in (CKafkaError._SSL, CKafkaError._TRANSPORT) and any(  # noqa: SLF001
        f"SSL alert number {n}" in text for n in CERTIFICATE_REFUSED_ALERTS
    ):
        return ClientCertificateRefused(text)
    if err.code() != CKafkaError._AUTHENTICATION:  # noqa: SLF001
        return None
    if "Unsupported SASL mechanism" in text:
        return kerrors.UnsupportedSaslMechanismError(text)
    return kerrors.SaslAuthenticationFailedError(text)
