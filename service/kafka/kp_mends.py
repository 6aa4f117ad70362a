"""Mends of kafka-python's own bugs, each applied where the service builds or closes a kafka-python client.

Written against kafka-python 3.0.12 (the installed version; ``pip show
kafka-python``). Each mend says what the bug is, what it broke here, and the
upstream issue or pull request where there is one; each guards itself
(``hasattr``) so that a later kafka-python laid out otherwise is left alone.
When an upgrade fixes one, remove it here, and keep the test that proves the
behaviour (named in its docstring).

- :func:`net_client`: a SASL rejection, or a broker certificate that did not
  verify, is final (:class:`_RejectionsAreFinal`), and a broker's last answer
  before it hangs up is read (:func:`_recv_then_eof`);
- :func:`close_producer`, :func:`close_consumer`: a close that times out does
  not leave a producer running, and the close race's ERROR lines are quieted;
- :class:`AdminClient`: DescribeGroups answers with authorized-operation bits
  kafka-python cannot name;
- :func:`mend_consumer`: the fetcher's and the group join's bugs of a
  consumer in a group;
- :func:`mend_transactional_producer`: a send in an open transaction to a
  partition already in it takes no lock (a cost, not a bug).
"""

from __future__ import annotations

import functools
import logging
import ssl
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import kafka.errors as kerrors
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError
from kafka.net.compat import KafkaNetClient
from kafka.net.manager import KafkaConnectionManager
from kafka.net.selector import NetworkSelector
from perceptron_stream.kafka.errors import (
    AUTHENTICATION_ERRORS,
    CERTIFICATE_REFUSED_ALERTS,
    ClientCertificateRefused,
    SslAuthenticationError,
)

log = logging.getLogger(__name__)


class _RejectionsAreFinal(KafkaConnectionManager):
    """kafka-python's connection manager, for which a SASL rejection, or a broker certificate that did not verify, is final.

    kafka-python 3.0.12 retries a bootstrap connection that the brokers
    rejected at the SASL handshake (UnsupportedSaslMechanismError, error 33)
    or at authentication (SaslAuthenticationFailedError, 58) until
    ``bootstrap_timeout_ms``, then raises KafkaTimeoutError "Unable to
    bootstrap", which looks like brokers that are away: callers retry forever.
    The manager keeps the last authentication failure of each node to "surface
    it to the user instead of silently retrying forever" (``get_connection``
    raises it through ``maybe_raise_auth_failure``), but never learns of these:
    ``KafkaConnection.initialize`` closes the connection with the error instead
    of raising it. Here each new connection's ``init_future`` reports them, so
    the next attempt on that node raises the rejection (bootstrap fails with
    it) until a connection to it succeeds again. A TLS handshake that failed
    verifying the brokers' certificate is the same case seen from the client
    (:class:`SslAuthenticationError`): retried, it failed forever as "Unable to
    bootstrap" on Apache Kafka's SSL listener, with either client.

    Against kafka-python 3.0.12. Upstream: dpkp/kafka-python#2994 (in 3.0.0)
    records SaslAuthenticationFailedError/AuthorizationError only when the
    connect itself raises; ``KafkaConnectionManager._connect`` of 3.0.12 notes
    that ``conn.initialize`` does not raise (its errors go to ``init_future``),
    so these rejections still escape it (upstream's master alike). No upstream
    issue found. Proved by tests/integration/test_sasl.py and test_tls.py.
    """

    def __init__(self, net, **configs):
        super().__init__(net, **configs)
        self._rejected: dict = {}  # node id → the AUTHENTICATION_ERRORS error of its last connection
        self._watched: weakref.WeakSet = weakref.WeakSet()

    def get_connection(self, node_id, *args, **kwargs):
        conn = super().get_connection(node_id, *args, **kwargs)
        if conn not in self._watched:
            self._watched.add(conn)
            conn.init_future.add_callback(lambda _: self._rejected.pop(node_id, None))

            def remember_rejection(error):
                rejection = _rejection(error)
                if rejection is not None:
                    self._rejected[node_id] = rejection

            conn.init_future.add_errback(remember_rejection)
        return conn

    async def _build_transport(self, node, timeout_at=None):
        transport = await super()._build_transport(node, timeout_at=timeout_at)
        transport._sock_recv = functools.partial(_recv_then_eof, transport._sock_recv)  # noqa: SLF001 — the mend wraps kafka-python's socket read, which it keeps private
        return transport

    def maybe_raise_auth_failure(self, node_id):
        super().maybe_raise_auth_failure(node_id)
        error = self._rejected.get(node_id)
        if error is not None:
            raise error


def _rejection(error: BaseException) -> KafkaError | None:
    """The AUTHENTICATION_ERRORS error a failed connection stands for, if any.

    kafka-python raises its KafkaConnectionError("Handshake failed: ...") from
    inside the ``except`` of the TLS handshake, so the ssl error is its context.
    """
    if isinstance(error, AUTHENTICATION_ERRORS):
        return error
    cause = error.__cause__ or error.__context__
    if not isinstance(error, kerrors.KafkaConnectionError):
        return None
    if isinstance(cause, ssl.SSLCertVerificationError):
        return SslAuthenticationError(f"the brokers' certificate did not verify: {cause.verify_message or cause}")
    alert = next((a for a in error.args if isinstance(a, ssl.SSLError)), None)  # a read's: KafkaConnectionError(e)
    if alert is not None and alert.reason in CERTIFICATE_REFUSED_ALERTS:
        return ClientCertificateRefused(f"the brokers refused the client's certificate: {alert.reason}")
    return None


def _recv_then_eof(receive: Callable) -> tuple[bytes, Exception | None]:
    """A transport's ``_sock_recv`` that hands over the bytes read before the peer closed; the close is met at
    the next read (the socket stays readable at its end).

    kafka-python 3.0.12 drops the bytes of a read that ends at the peer's close
    (the transport aborts with "socket disconnected" instead of passing them
    on). Apache Kafka answers a SaslHandshake for a mechanism it has not
    enabled with error 33 and closes the connection at once: the answer was
    lost, the client saw brokers that hang up, and retried forever.

    Against kafka-python 3.0.12 (``kafka/net/transport.py``); no upstream issue
    found. Proved by tests/integration/test_sasl.py (a mechanism not enabled).
    """
    data, error = receive()
    if data and isinstance(error, kerrors.KafkaConnectionError) and str(error).endswith("socket disconnected"):
        return data, None
    return data, error


def net_client(**configs) -> KafkaNetClient:
    """kafka-python's network client with :class:`_RejectionsAreFinal` (the clients' ``kafka_client`` option)."""
    net = NetworkSelector(**configs)
    return KafkaNetClient(net=net, manager=_RejectionsAreFinal(net, **configs), **configs)


class _CloseRaceFilter(logging.Filter):
    """Turns kafka-python's ERRORs of a closing client into one DEBUG line each.

    kafka-python 3.0.12 races with itself closing a connection: its network
    thread may still read a socket that ``close()`` has just set to None, and
    logs that as an ERROR with a traceback ("Error receiving network data
    closing socket ... 'NoneType' object has no attribute 'recv'"), now and
    then at a clean shutdown. Nothing is lost (every output was acknowledged
    and committed before the close), but an ERROR with a traceback at a clean
    stop sends an operator looking for a fault. Active only while this module
    closes its clients; what the clients log otherwise is untouched.
    No upstream issue found (kafka-python 3.0.12, kafka/net/transport.py).

    >>> record = logging.LogRecord("kafka.net.transport", logging.ERROR, __file__, 1, "Error receiving", None, None)
    >>> _CloseRaceFilter().filter(record)
    False
    >>> _CloseRaceFilter().filter(logging.LogRecord("kafka.net.transport", logging.INFO, __file__, 1, "Closing", None, None))
    True
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        error = record.exc_info[1] if record.exc_info else None
        log.debug("while closing, %s logged: %s%s", record.name, record.getMessage(), f" ({error!r})" if error else "")
        return False


#: kafka-python's loggers of the connections (kafka/net/transport.py, selector.py).
_CONNECTION_LOGGERS = ("kafka.net.transport", "kafka.net.selector")


@contextmanager
def _closing() -> Iterator[None]:
    """While closing clients: kafka-python's connection ERRORs become DEBUG lines (see _CloseRaceFilter)."""
    quiet, loggers = _CloseRaceFilter(), [logging.getLogger(name) for name in _CONNECTION_LOGGERS]
    for logger in loggers:
        logger.addFilter(quiet)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(quiet)


class _ClientNoiseFilter(logging.Filter):
    """Turns two of kafka-python's lines that report nothing wrong into DEBUG lines (of this module's logger).

    - ``ERROR kafka.cluster: Metadata refresh: failed Cancelled``: closing a
      client cancels the requests still in flight on its connections, and a
      metadata refresh is often one of them, queued behind a long-poll fetch
      (the broker answers a connection's requests in order). It showed at every
      restore from the Kafka store and in ``model export`` (the checkpoint
      topic's reader closes right after its last poll). kafka-python logs the
      fetch cancelled with it at INFO, the refresh at ERROR.
    - ``WARNING kafka.net.selector: Task ... ran for 0.148s (>0.100s threshold).
      It is blocking the event loop``: the client's IO thread timing itself;
      on a busy machine (the GIL held by the poll loop) any step may pass
      0.1 s. A diagnostic for kafka-python's developers, not the operator's.

    Against kafka-python 3.0.12 (kafka/cluster.py ``_do_refresh_metadata``,
    kafka/net/selector.py ``_poll_once``); no upstream issue found. Installed
    on those two loggers when this module is imported; other records pass
    untouched, and ``--log-level DEBUG`` shows these as DEBUG lines.

    >>> from kafka.errors import Cancelled, KafkaConnectionError
    >>> def refresh(error):
    ...     return logging.LogRecord("kafka.cluster", logging.ERROR, "", 1, "Metadata refresh: failed %s", (error,), None)
    >>> _ClientNoiseFilter().filter(refresh(Cancelled())), _ClientNoiseFilter().filter(refresh(KafkaConnectionError()))
    (False, True)
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.noise(record):
            return True
        log.debug("%s logged: %s", record.name, record.getMessage())
        return False

    @staticmethod
    def noise(record: logging.LogRecord) -> bool:
        if record.name == "kafka.cluster":
            args = record.args if isinstance(record.args, tuple) else ()
            return record.msg == "Metadata refresh: failed %s" and bool(args) and isinstance(args[0], kerrors.Cancelled)
        return (
            record.name == "kafka.net.selector"
            and str(record.msg).startswith("Task ")
            and "blocking the event loop" in str(record.msg)
        )


for _logger in ("kafka.cluster", "kafka.net.selector"):
    logging.getLogger(_logger).addFilter(_ClientNoiseFilter())


def close_producer(producer: KafkaProducer, timeout_s: float) -> None:
    """Close ``producer``, waiting at most ``timeout_s`` for its unacknowledged messages, and never raise.

    kafka-python 3.0 raises from ``close()`` when that wait times out, and
    leaves the producer open (its sender thread, its connections, an error
    again at garbage collection): force it shut then. The messages it held
    were never acknowledged, so nothing was committed or checkpointed for them.

    Against kafka-python 3.0.12: ``KafkaProducer.close`` calls ``flush(timeout)``
    first, which raises KafkaTimeoutError before the sender's ``force_close``
    is reached. Upstream's dpkp/kafka-python#3108 (in 3.0.10, "fix stalled
    shutdown when brokers unreachable") did not change that order.
    """
    try:
        with _closing():
            producer.close(timeout=timeout_s)
    except Exception as exc:  # KafkaTimeoutError, or anything a broken producer raises
        log.warning("closed the producer with messages not acknowledged (%s)", exc.__class__.__name__)
        sender = getattr(producer, "_sender", None)
        if sender is not None:
            try:
                sender.force_close()
            except Exception:  # pragma: no cover - best effort on a broken client
                log.debug("forcing the producer's sender down failed", exc_info=True)
        producer._closed = True  # noqa: SLF001 — what close() would have set: no second attempt at garbage collection


def close_consumer(consumer: KafkaConsumer, **options) -> None:
    """``consumer.close(**options)``, its connections' close race quieted (see _CloseRaceFilter)."""
    with _closing():
        consumer.close(**options)


class AdminClient(KafkaAdminClient):
    """kafka-python's admin client, tolerant of authorized-operation bits it cannot name.

    Tansu answers DescribeGroups with every bit set, and kafka-python 3.0
    raises ValueError turning unknown bits into its enum; nothing here needs them.

    Against kafka-python 3.0.12: ``valid_acl_operations`` (kafka/admin/_acls.py)
    raises "15 is not a valid ACLOperation"; upstream's master alike. No
    upstream issue found. Proved by the group-member checks of
    tests/integration (Tansu, the embedded broker).
    """

    def _process_acl_operations(self, obj):
        try:
            return super()._process_acl_operations(obj)
        except ValueError:
            obj.pop("authorized_operations", None)
            return obj


def mend_consumer(consumer: KafkaConsumer) -> None:
    """The mends of a consumer that reads in a group (the poll loop's)."""
    _resumed_partitions_fetch_again(consumer)
    _failed_batches_are_fetched_again(consumer)
    _joins_finished_between_polls_are_completed(consumer)


def _resumed_partitions_fetch_again(consumer: KafkaConsumer) -> None:
    """Mend kafka-python 3.0's port of KAFKA-7548 (dpkp/kafka-python#2981) on ``consumer``: a resumed partition stays silent.

    Records fetched for a partition that is then paused are parked, and
    fetching it stops while they are. On resume they go back in line only
    when no records are in line, tested as ``is None``; but a batch read to
    its end stays in line, empty, until the next fetch response replaces it.
    Seen in 3.0.12 whenever the other partitions' records had all been
    returned: the parked records never came back and the partition was
    never fetched again (the label partition that the service holds until
    its points come, perceptron_stream.app._points_first: no label ever joined). An
    empty batch in line is the same as none to the fetcher, so it is cleared
    before each drain. Only where the fetcher has these attributes (a later
    kafka-python may lay them out otherwise, or fix it).

    Upstream: the port came with dpkp/kafka-python#2981 (KAFKA-7548); its
    master still tests ``_next_partition_records is None`` before putting the
    parked records back. Proved by tests/integration/test_delayed_labels.py
    (labels held until their points come) and bench/e2e.py.
    """
    fetcher: Any = getattr(consumer, "_fetcher", None)  # kafka-python's, untyped
    if not all(
        hasattr(fetcher, a) for a in ("fetched_records", "_next_partition_records", "_paused_partition_records")
    ):
        return
    drain = fetcher.fetched_records

    def fetched_records(*args, **kwargs):
        in_line = fetcher._next_partition_records  # noqa: SLF001 — the fetcher's line of records is what the mend clears
        if in_line is not None and not in_line:
            fetcher._next_partition_records = None  # noqa: SLF001 — see above
        return drain(*args, **kwargs)

    fetcher.fetched_records = fetched_records


def _failed_batches_are_fetched_again(consumer: KafkaConsumer) -> None:
    """Mend kafka-python 3.0.12's fetcher on ``consumer``: after a batch fails to parse, every poll spins forever.

    Records are parsed lazily, as the poll takes them: when a batch cannot
    be read (UnsupportedCodecError when a codec's package is missing, a
    CorruptRecordError) the first poll raises, but the partition's parsed
    records stay in line, their generator dead and never drained. The next
    poll takes nothing from them, counts nothing taken and tries again, in
    ``Fetcher.fetched_records``' ``while records_remaining > 0`` loop, with
    no timeout: 100% of a core, a poll that never returns, a SIGTERM that is
    never acted on (seen with lz4, zstd and snappy topics; issue 29). The
    thread dump showed that spin under :func:`_resumed_partitions_fetch_again`
    only because it wraps ``fetched_records``: without it the spin is the
    same. Here records that raised are drained: the position stays at the
    record that failed, so the next poll fetches it again and raises again
    (as the Java consumer does), and a fault that goes away (a damaged
    response) is read past. Only where the fetcher has ``fetched_records``
    and ``_next_partition_records``.

    Against kafka-python 3.0.12; no upstream issue found (this project's
    issue 29). Proved by tests/integration/test_reading.py (records in a
    codec the client cannot read: every poll fails, none spins).
    """
    fetcher: Any = getattr(consumer, "_fetcher", None)  # kafka-python's, untyped
    if not all(hasattr(fetcher, a) for a in ("fetched_records", "_next_partition_records")):
        return
    drain = fetcher.fetched_records

    def fetched_records(*args, **kwargs):
        try:
            return drain(*args, **kwargs)
        except Exception:
            failed, fetcher._next_partition_records = fetcher._next_partition_records, None  # noqa: SLF001 — the failed batch the fetcher keeps in line
            if failed is not None:
                failed.drain()
            raise

    fetcher.fetched_records = fetched_records


def _joins_finished_between_polls_are_completed(consumer: KafkaConsumer) -> None:
    """Mend kafka-python 3.0.12's group join on ``consumer``: a join that finishes between two polls is never applied.

    A poll whose time runs out during a rebalance leaves the JoinGroup/SyncGroup
    task running, for the next poll to await; the next poll awaits it only if
    ``need_rejoin()`` still holds. When the rebalance was asked for by a
    metadata change (a topic the first join had no metadata for: the first
    start on a new Apache Kafka cluster), the leader's assignment in that
    task makes ``need_rejoin()`` false, so the finished join is skipped: no
    partition is ever assigned, the heartbeat stays disabled, and the broker
    drops the member after its session timeout without the consumer knowing.
    Seen on Apache Kafka 4.3 (about one start in two with --poll-timeout-ms
    100); the embedded broker answers too slowly to hit it. Here a join task
    still held means a rejoin is needed: kafka-python then joins once more
    (a JoinGroup from a known member: one extra quick rebalance) and applies
    that one. Only where the coordinator has these attributes.

    Against kafka-python 3.0.12; upstream's master still leaves the join task
    in flight when the poll's timer expires (kafka/coordinator/base.py). No
    upstream issue found. Proved on Apache Kafka by the integration tests
    that wait for an assignment (tests/support/service.py wait_assigned).
    """
    coordinator: Any = getattr(consumer, "_coordinator", None)  # kafka-python's, untyped
    if not hasattr(coordinator, "_join_task") or not callable(getattr(coordinator, "need_rejoin", None)):
        return
    need_rejoin = coordinator.need_rejoin

    def rejoin_needed_while_a_join_is_held():
        return coordinator._join_task is not None or need_rejoin()  # noqa: SLF001 — the join in flight, kept private by kafka-python

    coordinator.need_rejoin = rejoin_needed_while_a_join_is_held


def mend_transactional_producer(producer: KafkaProducer) -> None:
    """A send in the open transaction to a partition already added to it decides so without kafka-python's locks.

    kafka-python 3.0.12 calls ``TransactionManager.maybe_add_partition_to_transaction`` at every send of a
    transactional producer; it takes the manager's RLock four times over (the state checks of
    ``_fail_if_not_ready_for_send``, ``has_error``, ``is_partition_added``) to find, for all but a transaction's
    first record of each partition, that there is nothing to do. That was most of what exactly-once cost the
    service an event on kafka-python (``KafkaIO.send`` 38% more samples than at-least-once in a py-spy profile of
    bench/e2e.py --exactly-once; librdkafka does it in C). Here the answer "open, and added already" is read first,
    as the locked path reads it, and anything else takes the locked path: an error state, no producer id or a
    transaction not open all leave the state other than IN_TRANSACTION, so the checks that raise are the same.
    The state may change right after the look, as it may right after the lock's release: the sender's own checks
    see to the records then, as before. Only where the manager has these attributes. Proved by
    tests/integration/test_exactly_once.py (fenced zombies, aborts) and measured by bench/e2e.py --exactly-once.
    """
    manager: Any = getattr(producer, "_transaction_manager", None)  # kafka-python's, untyped
    if manager is None or not all(
        hasattr(manager, a)
        for a in ("_current_state", "_partitions_in_transaction", "maybe_add_partition_to_transaction")
    ):
        return
    from kafka.producer.transaction_manager import TransactionState

    open_state, locked = TransactionState.IN_TRANSACTION, manager.maybe_add_partition_to_transaction

    def maybe_add_partition_to_transaction(topic_partition) -> None:
        if manager._current_state == open_state and topic_partition in manager._partitions_in_transaction:  # noqa: SLF001 — the manager's state, read as its locked path reads it
            return
        locked(topic_partition)

    manager.maybe_add_partition_to_transaction = maybe_add_partition_to_transaction
