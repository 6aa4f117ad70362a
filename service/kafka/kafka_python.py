"""The kafka-python client behind :mod:`perceptron_stream.kafka`'s interface (the default): the poll loop's stream, :class:`KafkaIO`,
and ``perceptron-stream produce``'s producer, :class:`CountingProducer`.

How its clients are built is :mod:`perceptron_stream.kafka.kp_options`; the mends of
kafka-python's bugs, :mod:`perceptron_stream.kafka.kp_mends`; what its errors mean,
:mod:`perceptron_stream.kafka.errors`. The admin calls (:mod:`perceptron_stream.kafka.admin`) and
the compacted topics (:mod:`perceptron_stream.kafka.compacted`) use kafka-python too,
whichever client runs the loop.

With a transactional id, :class:`KafkaIO`'s producer writes in transactions
(:meth:`KafkaIO.begin`, :meth:`KafkaIO.commit_transaction`, :meth:`KafkaIO.abort`):
the outputs and the consumer's positions, sent with its group metadata
(KIP-447), commit together. What a transaction meets is classified once
(:func:`perceptron_stream.kafka.errors.transaction_error`), after aborting it where
kafka-python allows (not after ProducerFencedError, fatal to its producer).
kafka-python's transactional calls wait for their answer without a deadline:
while the brokers are away, a commit waits (the coordinator aborts the open
transaction after ``TRANSACTION_TIMEOUT_MS``, which fences this producer).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.errors import KafkaError, KafkaTimeoutError
from kafka.structs import OffsetAndMetadata
from perceptron_stream.config import KafkaSettings
from perceptron_stream.kafka.admin import group_members
from perceptron_stream.kafka.contract import (
    BEGINNING,
    END,
    GROUP_TIMINGS,
    TRANSACTION_TIMEOUT_MS,
    DeliveryError,
    Fenced,
    KafkaFatal,
    KafkaUnavailable,
    Record,
    Refused,
    StreamOptions,
)
from perceptron_stream.kafka.errors import (
    FATAL,
    REFUSED_ERRORS,
    delivery_kind,
    service_error,
    transaction_error,
    translated,
)
from perceptron_stream.kafka.kp_mends import (
    bound_abort,
    close_consumer,
    close_producer,
    mend_consumer,
    mend_transactional_producer,
)
from perceptron_stream.kafka.kp_options import (
    ISOLATION_LEVEL,
    LINGER_UNTIL_FLUSH_MS,
    kafka_python_options,
    make_producer,
)
from perceptron_stream.kafka.ledger import DeliveryCounts, Ledger
from perceptron_stream.kafka.rebalance import RebalanceCallbacks

log = logging.getLogger(__name__)
#: How long an abort of the open transaction may wait for the brokers (kp_mends.bound_abort).
ABORT_TIMEOUT_S = 5.0


class _NotSent:
    """In place of the future of a message the producer did not take: ``exception`` None
    (no metadata while the brokers are away: send it again) or the error it was refused with."""

    __slots__ = ("exception",)

    def __init__(self, exception: BaseException | None = None):
        self.exception = exception

    def succeeded(self) -> bool:
        return False


_NOT_SENT = _NotSent()


class _Listener(ConsumerRebalanceListener):
    """kafka-python's listener of :class:`RebalanceCallbacks`: a callback's failure is never raised into the client."""

    def __init__(self, callbacks: RebalanceCallbacks):
        self.callbacks = callbacks

    def on_partitions_assigned(self, assigned):
        self.callbacks.assigned((tp.topic, tp.partition) for tp in assigned)

    def on_partitions_revoked(self, revoked):
        self.callbacks.revoked((tp.topic, tp.partition) for tp in revoked)

    def on_partitions_lost(self, lost):
        self.callbacks.lost((tp.topic, tp.partition) for tp in lost)


#: The transactional producer's retry_backoff_ms (100 by default): kafka-python 3.0.12's sender waits up to it between
#: the steps of a transaction (adding a partition, the offsets, the end), and a transaction every 100 ms paid that
#: wait several times over. Measured (50,000 events, one partition, Apache Kafka, 3 rounds interleaved): exactly-once
#: at 100 ms ran at 0.70x the at-least-once Kafka-store service's events/s with 100, 0.83x with 20, 0.73x with 5;
#: 20 ms is also the Java client's backoff for the first partition of a transaction whose predecessor still ends.
TRANSACTIONAL_RETRY_BACKOFF_MS = 20


class KafkaIO:
    """One consumer in a group on the input topics, and one producer (the :class:`~perceptron_stream.kafka.contract.Stream`),
    opened with :class:`~perceptron_stream.kafka.contract.StreamOptions` (or the same as keyword arguments).

    Rebalance callbacks run inside :meth:`poll`, between batches, so the
    application always sees them with no batch in hand.
    """

    #: With a transactional id (else None), whether a transaction is open: what is sent goes into it.
    transactional_id: str | None = None
    in_transaction = False

    @translated
    def __init__(self, settings: KafkaSettings, options: StreamOptions | None = None, /, **fields: Any):
        o = StreamOptions.given(options, fields)
        if o.group_protocol != "classic":
            raise ValueError("kafka-python speaks only the classic group protocol")
        self.settings = settings
        self.batch_bytes = o.batch_bytes
        self.group_id = o.group_id
        self.transactional_id = o.transactional_id
        self.in_transaction = False
        self.consumer = KafkaConsumer(
            **kafka_python_options(settings),
            group_id=o.group_id,
            client_id=o.client_id,
            enable_auto_commit=False,
            auto_offset_reset=o.auto_offset_reset,
            # records of aborted transactions are never predicted nor learned (kafka-python's default would read them)
            isolation_level=ISOLATION_LEVEL,
            max_poll_records=o.max_poll_records,
            fetch_max_wait_ms=o.fetch_max_wait_ms,
            request_timeout_ms=10_000,
            # the range assignor gives partition p of every topic to one member (the join of labels to points needs it)
            partition_assignment_strategy=[RangePartitionAssignor],
            **GROUP_TIMINGS,
        )
        self.callbacks = RebalanceCallbacks(o.on_assigned, o.on_revoked, o.on_lost)
        self.topics = list(o.topics)
        self.consumer.subscribe(o.topics, listener=_Listener(self.callbacks))
        try:
            mend_consumer(self.consumer)
            # The topics' partitions known before the first poll joins the group. kafka-python 3.0.12 waits for
            # fresh metadata before a join only for a pattern subscription (coordinator/consumer.py, KAFKA-3949's
            # comment): a leader whose join answered before its first metadata assigned nothing ("WARNING
            # kafka.coordinator.assignors.range: No partition metadata for topic ...", then "assigned nothing"),
            # and a second rebalance followed, on about one first start in three. One metadata request, here.
            for topic in o.topics:
                self.consumer.partitions_for_topic(topic)
            self.producer = self._new_producer()
        except BaseException:  # the caller retries: leave no consumer (its thread, its sockets) behind
            close_consumer(self.consumer, autocommit=False)
            raise
        self.ledger = Ledger()
        self._pending: list = []  # (topic, key, value, future) sent and not yet settled
        self._refused = False  # the producer refused a send: the rest wait for the flush to send them again

    def _new_producer(self) -> KafkaProducer:
        # a batch within the smallest topic's limit (kafka-python splits one the brokers refuse as too large, but
        # an idempotent producer logs each refusal as fatal first)
        sized = {} if self.batch_bytes is None else {"batch_size": max(1, min(256 * 1024, self.batch_bytes))}
        if self.transactional_id is None:
            return make_producer(self.settings, linger_ms=LINGER_UNTIL_FLUSH_MS, **sized)
        # idempotent (kafka-python turns it on with a transactional id); the coordinator aborts a transaction left
        # open TRANSACTION_TIMEOUT_MS (a crashed instance's blocks read_committed readers about that long: contract.py)
        producer = make_producer(
            self.settings,
            linger_ms=LINGER_UNTIL_FLUSH_MS,
            transactional_id=self.transactional_id,
            transaction_timeout_ms=TRANSACTION_TIMEOUT_MS,
            retry_backoff_ms=TRANSACTIONAL_RETRY_BACKOFF_MS,
            **sized,
        )
        try:
            producer.init_transactions()  # aborts what an earlier producer of this id left open, fences it
        except BaseException:
            close_producer(producer, 1.0)
            raise
        mend_transactional_producer(producer)
        bound_abort(producer, ABORT_TIMEOUT_S)
        return producer

    # consuming -----------------------------------------------------------
    @translated
    def poll(self, timeout_ms: int, max_records: int) -> list[list[Record]]:
        """The next records, one list per partition: kafka-python's ConsumerRecords, which have :class:`Record`'s attributes.

        What a rebalance callback raised inside it is raised instead (:mod:`perceptron_stream.kafka.rebalance`).
        """
        records = self.consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
        self.callbacks.raise_failure()
        return list(records.values())

    def assignment(self) -> list[tuple[str, int]]:
        return sorted((tp.topic, tp.partition) for tp in self.consumer.assignment())

    def pause(self, partitions: Iterable[tuple[str, int]] | None = None) -> None:
        """Fetch nothing from ``partitions`` (all assigned ones by default) until :meth:`resume` or the next assignment."""
        tps = self.consumer.assignment() if partitions is None else [TopicPartition(*tp) for tp in partitions]
        self.consumer.pause(*tps)

    def resume(self, partitions: Iterable[tuple[str, int]] | None = None) -> None:
        tps = self.consumer.paused() if partitions is None else [TopicPartition(*tp) for tp in partitions]
        self.consumer.resume(*tps)

    @translated
    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Next read of the partition at ``offset``, or at its BEGINNING or END."""
        tp = TopicPartition(topic, partition)
        if offset == BEGINNING:
            self.consumer.seek_to_beginning(tp)
        elif offset == END:
            self.consumer.seek_to_end(tp)
        else:
            self.consumer.seek(tp, offset)

    @translated
    def commit(self, positions: dict[tuple[str, int], int], timeout_s: float | None = None) -> None:
        """Commit next-offsets of the partitions still owned; KafkaUnavailable (e.g. during a rebalance, or after
        ``timeout_s``) for the caller to retry later.

        Not from a rebalance callback: those run on the consumer's network thread, which cannot block on itself.
        """
        owned = self.consumer.assignment()
        positions = {tp: o for tp, o in positions.items() if TopicPartition(*tp) in owned}
        if positions:
            self.consumer.commit(
                {TopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in positions.items()},
                timeout_ms=None if timeout_s is None else int(timeout_s * 1000),
            )

    @translated
    def lag(self, timeout_s: float | None = None, ask_broker: bool = True) -> dict[tuple[str, int], int]:
        """Messages between the consumer's position and the end of each assigned partition.

        ``ask_broker`` False: from the high watermarks the last fetch responses
        carried, without a request (a ListOffsets round trip stalled the loop
        100-300 ms on the embedded broker); a partition with none yet is left out.
        True: the end offsets, asked of the brokers (KafkaUnavailable when they
        do not answer within ``timeout_s``: the loop's probe for /readyz).
        """
        tps = list(self.consumer.assignment())
        timeout_ms = None if timeout_s is None else int(timeout_s * 1000)
        if not tps:
            if ask_broker:  # still a probe: an outage that revoked every partition is known (contract.py)
                self.consumer.end_offsets([TopicPartition(self.topics[0], 0)], timeout_ms=timeout_ms)
            return {}
        if ask_broker:
            ends = self.consumer.end_offsets(tps, timeout_ms=timeout_ms)
        else:
            ends = {tp: self.consumer.highwater(tp) for tp in tps}
        return {
            (tp.topic, tp.partition): max(0, ends[tp] - self.consumer.position(tp, timeout_ms=timeout_ms))
            for tp in tps
            if ends[tp] is not None
        }

    def group_members(self) -> dict[str, str]:
        """Member id → client id of the live members of this consumer's group, this one included."""
        return group_members(self.settings, self.group_id)

    # producing -----------------------------------------------------------
    def send(self, topic: str, key: bytes | None, value: bytes) -> None:
        if self._refused:
            future = _NOT_SENT
        else:
            try:
                future = self.producer.send(topic, key=key, value=value)
            except REFUSED_ERRORS as exc:  # e.g. larger than max_request_size: never sendable
                future = _NotSent(exc)
            except KafkaError as exc:  # e.g. no metadata within max_block_ms: the brokers are away
                log.warning(
                    "the producer refused a message (%s); it is sent again at the flush", exc.__class__.__name__
                )
                self._refused, future = True, _NOT_SENT
        self._pending.append((topic, key, value, future))

    def flush(self, timeout_s: float) -> list[Refused]:
        """Until the brokers acknowledged every message sent since the last flush (:meth:`Ledger.settle`).

        In a transaction a failed delivery is not sent again: the transaction
        is aborted, and Aborted (or Fenced) raised.
        """
        if not self.in_transaction:
            return self.ledger.settle(self, timeout_s)
        try:
            return self.ledger.settle(self, timeout_s, resend=False)
        except (KafkaUnavailable, KafkaFatal, KafkaError) as exc:
            raise self._aborted(exc.__cause__ if isinstance(exc, DeliveryError) and exc.__cause__ else exc) from exc

    # transactions (a stream opened with a transactional id) ----------------
    def begin(self) -> None:
        """Open a transaction, if none is open (Fenced, KafkaFatal or Aborted as a commit's, nothing to abort)."""
        if not self.in_transaction:
            try:
                self.producer.begin_transaction()
            except KafkaError as exc:
                raise transaction_error(exc, self.settings) from exc
            self.in_transaction = True

    def send_to(self, topic: str, partition: int, key: bytes | None, value: bytes) -> None:
        """Send to ``partition`` of ``topic`` in the open transaction (a log partitioned like the input, the
        pending changelog); a message the producer would not take fails the transaction at its flush."""
        if not self.in_transaction:
            raise RuntimeError("send_to writes into a transaction: begin() first")
        try:
            future = self.producer.send(topic, key=key, value=value, partition=partition)
        except KafkaError as exc:  # refused for good (returned by the flush), or not taken: the flush aborts
            future = _NotSent(exc) if isinstance(exc, REFUSED_ERRORS) else _NOT_SENT
        self._pending.append((topic, key, value, future))

    def commit_transaction(self, positions: dict[tuple[str, int], int], timeout_s: float) -> list[Refused]:
        """See :meth:`Stream.commit_transaction <perceptron_stream.kafka.contract.Stream.commit_transaction>`."""
        self.begin()
        refused = self.flush(timeout_s)
        owned = self.consumer.assignment()
        offsets = {
            TopicPartition(t, p): OffsetAndMetadata(o, "", -1)
            for (t, p), o in positions.items()
            if TopicPartition(t, p) in owned
        }
        membership = self.consumer.group_metadata()  # one snapshot: what is checked is what is sent
        if offsets and (membership.generation_id < 0 or not membership.member_id):
            raise self._aborted(Fenced.no_member())
        try:
            if offsets:
                self.producer.send_offsets_to_transaction(offsets, membership)
            self.producer.commit_transaction()
        except KafkaError as exc:
            raise self._aborted(exc) from exc
        self.in_transaction = False
        return refused

    def abort(self) -> None:
        """Abort the open transaction, if any; what was sent in it is forgotten (KafkaFatal, Fenced if the
        producer cannot abort: it was fenced, or failed for good)."""
        if not self.in_transaction:
            return
        self._pending, self._refused, self.in_transaction = [], False, False
        self.ledger.forget()
        try:
            self.producer.abort_transaction()
        except KafkaTimeoutError as exc:  # the producer is stuck in its abort: of no further use
            raise transaction_error(exc, self.settings, producer_broken=True) from exc
        except KafkaError as exc:
            raise transaction_error(exc, self.settings) from exc

    def _aborted(self, exc: BaseException | None) -> BaseException:
        """The service's error for what the transaction met, once it is aborted (where kafka-python can)."""
        error = transaction_error(exc, self.settings)
        try:
            self.abort()
        except (KafkaFatal, KafkaUnavailable) as failure:  # fenced, or broken for good: the coordinator aborts it
            log.warning("could not abort the transaction (%s)", failure)
        return error

    def wait(self, timeout_s: float, ledger: Ledger) -> int:
        """The ledger's wait: the producer's flush, then each settled future reported; how many still wait."""
        try:
            self.producer.flush(timeout=max(0.1, timeout_s))
        except KafkaError:
            pass
        waiting = []
        for t, k, v, future in self._pending:
            if future.succeeded():
                continue
            if future is not _NOT_SENT and not getattr(future, "is_done", True):
                waiting.append((t, k, v, future))
            else:
                error = future.exception
                kind = delivery_kind(error)
                ledger.failed((t, k, v), kind, service_error(error, self.settings) if kind == FATAL else error)
        self._pending = waiting
        return len(waiting)

    @translated
    def renew(self) -> None:
        """A fresh producer: after an outage an idempotent kafka-python producer has been seen to report sends as
        done that were never stored (the old one stays while no new one can be made: the brokers may be away)."""
        producer = self._new_producer()
        close_producer(self.producer, 1.0)
        self.producer, self._refused = producer, False

    def close(self) -> None:
        try:
            close_producer(self.producer, 5.0)
        finally:
            close_consumer(self.consumer, autocommit=False)  # kafka-python calls on_revoked here
            if self.callbacks.failure is not None:  # no poll left to raise it from: the service is stopping already
                log.error("the rebalance callback failed while closing: %s", self.callbacks.failure)


class CountingProducer:
    """The service's producer (:func:`make_producer`) for ``perceptron-stream produce``: each send's answer is
    counted in the :class:`DeliveryCounts` it names, and nothing is sent again (the run reports what was lost)."""

    @translated
    def __init__(self, settings: KafkaSettings):
        self.settings = settings
        self.producer = make_producer(settings)

    def send(self, topic: str, key: bytes | None, value: bytes, counts: DeliveryCounts) -> None:
        try:
            self.producer.send(topic, key=key, value=value).add_callback(counts.ok).add_errback(counts.fail)
        except KafkaError as exc:  # refused before sending (too large), or no brokers within max_block_ms
            counts.fail(exc)

    def flush(self, timeout_s: float) -> bool:
        """Until every send is answered; False when some were not within ``timeout_s`` (they count as lost)."""
        try:
            self.producer.flush(timeout=timeout_s)
        except KafkaError:
            return False
        return True

    def close(self, timeout_s: float) -> None:
        close_producer(self.producer, timeout_s)
