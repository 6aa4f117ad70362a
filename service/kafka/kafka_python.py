"""The kafka-python client behind :mod:`service.kafka`'s interface (the default).

The only module that imports kafka-python. Besides the stream of the poll
loop (:class:`KafkaIO`), the admin calls (topics, group members) and the
checkpoint topic use it whichever client runs the loop.
"""

from __future__ import annotations

import functools
import logging
import re
import ssl
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import kafka.errors as kerrors
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.errors import KafkaError, TopicAlreadyExistsError
from kafka.net.compat import KafkaNetClient
from kafka.net.manager import KafkaConnectionManager
from kafka.net.selector import NetworkSelector
from kafka.structs import OffsetAndMetadata

from service.config import KafkaSettings, env_var, flag
from service.kafka.contract import (
    BEGINNING,
    END,
    GROUP_TIMINGS,
    KafkaFatal,
    KafkaUnavailable,
    MissingTopicError,
    Record,
    Refused,
    TopicSpec,
)
from service.kafka.ledger import FATAL, REFUSED, RETRY, Ledger
from service.kafka.rebalance import RebalanceCallbacks

log = logging.getLogger(__name__)


def _errors(*names: str) -> tuple[type, ...]:
    return tuple(getattr(kerrors, name) for name in names if hasattr(kerrors, name))


class SslAuthenticationError(KafkaError):
    """The brokers' TLS certificate failed verification (not signed by a CA of ``ssl_cafile``, or not for the
    address connected to): Kafka's Java client calls it SslAuthenticationException and, as for a SASL
    rejection, gives up instead of retrying. kafka-python has no class of its own for it: it wraps the
    handshake's ssl.SSLCertVerificationError in a KafkaConnectionError, like any connection that failed."""


class ClientCertificateRefused(SslAuthenticationError):
    """The brokers refused the client's certificate, or its absence (a listener with ``ssl.client.auth=required``):
    TLS alert 42, bad_certificate, at the first read after the handshake (TLS 1.3 sends it there)."""


#: TLS alerts with which the brokers refuse the client's certificate (OpenSSL's reasons)
CERTIFICATE_REFUSED_ALERTS = ("SSLV3_ALERT_BAD_CERTIFICATE", "TLSV13_ALERT_CERTIFICATE_REQUIRED", "TLSV1_ALERT_UNKNOWN_CA",
                              "SSLV3_ALERT_CERTIFICATE_UNKNOWN")


#: The brokers rejected the SASL mechanism (error 33), the SASL exchange (34)
#: or the credentials (58): sasl_mechanism, sasl_username or sasl_password must change;
#: or the client rejected the brokers' certificate: ssl_cafile must change.
AUTHENTICATION_ERRORS = (*_errors("UnsupportedSaslMechanismError", "IllegalSaslStateError", "SaslAuthenticationFailedError"),
                         SslAuthenticationError)

#: Errors that retrying cannot cure: a setting or the brokers' permissions
#: must change. The service stops with the error instead of retrying forever.
FATAL_ERRORS = (*_errors(
    "AuthorizationError", "SaslAuthenticationFailedError", "UnsupportedSaslMechanismError", "IllegalSaslStateError",
    "InvalidReplicationFactorError", "InvalidPartitionsError", "InvalidTopicError", "PolicyViolationError",
    "KafkaConfigurationError",  # e.g. librdkafka refusing an unreadable PEM file
    # records the client cannot decompress: every read of the partition fails alike until a package is installed
    "UnsupportedCodecError", "UnsupportedCompressionTypeError",
), SslAuthenticationError)

#: The package kafka-python decompresses each codec with (what kafka/codec.py of 3.0.12 imports: ``snappy``,
#: ``lz4.frame``, ``zstandard``; gzip is in the standard library). Dependencies of the service, as crc32c is:
#: without one, kafka-python cannot read a topic its producers compressed with that codec.
CODEC_PACKAGES = {"snappy": "python-snappy", "lz4": "lz4", "zstd": "zstandard"}


def missing_codecs() -> dict[str, str]:
    """Codec → package, for each codec Kafka defines that kafka-python cannot decompress here (none: {})."""
    from kafka import codec

    available = {"snappy": codec.has_snappy, "lz4": codec.has_lz4, "zstd": codec.has_zstd}
    return {name: CODEC_PACKAGES[name] for name, has in available.items() if not has()}


def require_codecs() -> None:
    """Raise KafkaFatal, naming the packages, when kafka-python cannot decompress every codec Kafka defines.

    Checked at start-up whichever client runs the loop (kafka-python reads
    the checkpoint and mix topics in any case): a missing package would
    otherwise show only when a producer first compresses with its codec.
    """
    missing = missing_codecs()
    if missing:
        packages = sorted(set(missing.values()))
        raise KafkaFatal(f"kafka-python cannot decompress {', '.join(missing)} (not installed: {', '.join(packages)})",
                         f"pip install {' '.join(packages)} (dependencies of perceptron-stream: reinstalling the service "
                         "installs them)")


def _codec_hint(exc: BaseException) -> str:
    """What to do about a record batch kafka-python cannot decompress: the package its codec needs, if any.

    >>> _codec_hint(kerrors.UnsupportedCodecError("Libraries for zstd compression codec not found"))
    'install zstandard (pip install zstandard), a dependency of perceptron-stream: reinstall the service'
    """
    match = re.search(r"for (\w+) compression codec", str(exc))
    package = CODEC_PACKAGES.get(match.group(1)) if match else None
    if package:
        return f"install {package} (pip install {package}), a dependency of perceptron-stream: reinstall the service"
    return "the records are compressed in a way this client cannot read: check the producers' compression.type"


#: Errors of one message that sending it again cannot cure: the brokers
#: refuse it for good (larger than the topic allows, invalid).
REFUSED_ERRORS = _errors("MessageSizeTooLargeError", "RecordListTooLargeError", "InvalidRecordError", "CorruptRecordError")

#: The service flushes its producer at the end of every batch, so its records
#: wait for that flush: one produce request per batch. With a short linger the
#: sender thread wakes every few ms mid-batch and fights the poll loop for the
#: GIL and the accumulator's locks; that made each send about twice as
#: expensive (py-spy, bench/README.md "End to end"). A batch that outgrows
#: ``batch_size`` is still sent at once.
LINGER_UNTIL_FLUSH_MS = 60_000


#: What the poll loop reads, with either client: committed records only. An upstream that writes points in
#: transactions (Kafka Streams or Quix Streams with exactly-once) aborts some; their records stay in the log,
#: and a read_uncommitted reader (kafka-python's default) would predict them and learn from them. The reader
#: waits at the first open transaction (the last stable offset) until it commits or aborts.
ISOLATION_LEVEL = "read_committed"


class _NotSent:
    """In place of the future of a message the producer did not take: ``exception`` None
    (no metadata while the brokers are away: send it again) or the error it was refused with."""

    __slots__ = ("exception",)

    def __init__(self, exception: Exception | None = None):
        self.exception = exception

    def succeeded(self) -> bool:
        return False


_NOT_SENT = _NotSent()


def client_options(settings: KafkaSettings) -> dict:
    """bootstrap servers and the security settings, as kafka-python takes them."""
    options = {
        "bootstrap_servers": settings.bootstrap_servers.split(","),
        "security_protocol": settings.security_protocol,
        # bounded attempts, so the caller's retry loop stays responsive to
        # signals and health checks, and a returning broker is found quickly
        "bootstrap_timeout_ms": 3000,
        "reconnect_backoff_max_ms": 5000,
    }
    if settings.sasl_mechanism:
        options["sasl_mechanism"] = settings.sasl_mechanism
        options["sasl_plain_username"] = settings.sasl_username
        if settings.sasl_password is not None:
            options["sasl_plain_password"] = settings.sasl_password.get_secret_value()
    for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        if getattr(settings, name) is not None:
            options[name] = str(getattr(settings, name))
    if settings.ssl_password is not None:
        options["ssl_password"] = settings.ssl_password.get_secret_value()
    return options


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
            conn.init_future.add_errback(lambda error: (rejection := _rejection(error)) is not None
                                         and self._rejected.__setitem__(node_id, rejection))
        return conn

    async def _build_transport(self, node, timeout_at=None):
        transport = await super()._build_transport(node, timeout_at=timeout_at)
        transport._sock_recv = functools.partial(_recv_then_eof, transport._sock_recv)
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
    """
    data, error = receive()
    if data and isinstance(error, kerrors.KafkaConnectionError) and str(error).endswith("socket disconnected"):
        return data, None
    return data, error


def _net_client(**configs) -> KafkaNetClient:
    """kafka-python's network client with :class:`_RejectionsAreFinal` (the clients' ``kafka_client`` option)."""
    net = NetworkSelector(**configs)
    return KafkaNetClient(net=net, manager=_RejectionsAreFinal(net, **configs), **configs)


def _options(settings: KafkaSettings) -> dict:
    """:func:`client_options` and the network client every kafka-python client here is built with."""
    return {**client_options(settings), "kafka_client": _net_client}


def _hint(exc: BaseException, settings: KafkaSettings | None) -> str:
    """The settings a fatal error points at, in all their spellings."""

    def named(*names: str) -> str:
        return " and ".join(f"{name} ({flag(name)}, {env_var(name)})" for name in names)

    if isinstance(exc, (kerrors.UnsupportedCodecError, kerrors.UnsupportedCompressionTypeError)):
        return _codec_hint(exc)
    mechanism = f"SASL mechanism {settings.sasl_mechanism}" if settings is not None and settings.sasl_mechanism else "the SASL mechanism"
    if isinstance(exc, (kerrors.UnsupportedSaslMechanismError, kerrors.IllegalSaslStateError)):
        return f"the brokers do not accept {mechanism}: check {named('sasl_mechanism')}"
    if isinstance(exc, kerrors.SaslAuthenticationFailedError):
        return (f"the brokers refused the credentials for {mechanism}: check {named('sasl_username', 'sasl_password')}, "
                f"and {named('sasl_mechanism')}")
    if isinstance(exc, ClientCertificateRefused):
        return (f"the brokers require a client certificate signed by a CA they trust: check "
                f"{named('ssl_certfile', 'ssl_keyfile')}")
    if isinstance(exc, SslAuthenticationError):
        return (f"the brokers' TLS certificate is not signed by a CA of {named('ssl_cafile')}, or not for the "
                f"address in {named('bootstrap_servers')}")
    return "check the Kafka settings (security, credentials, ACLs, replication factor)"


def service_error(exc: BaseException | None, settings: KafkaSettings | None = None) -> BaseException:
    """The service's own error (:mod:`service.kafka.contract`) for one of kafka-python's; others pass through.

    This and :func:`service.kafka.confluent.kafka_error` are the one
    classification of the clients' errors: fatal (FATAL_ERRORS: a setting or
    a permission must change), or unavailable (wait and retry).
    """
    if exc is None or isinstance(exc, (KafkaFatal, KafkaUnavailable)) or not isinstance(exc, KafkaError):
        return exc
    text = re.sub(r"^\[Error -?\d+\] ", "", str(exc).strip())  # kafka-python's own prefix: the name says it
    text = text if text.startswith(exc.__class__.__name__) else f"{exc.__class__.__name__}: {text}".rstrip(": ")
    # kafka-python names a rejection's class twice ("SaslAuthenticationFailedError: SaslAuthenticationFailedError: ...")
    text = text.replace(f"{exc.__class__.__name__}: {exc.__class__.__name__}: ", f"{exc.__class__.__name__}: ", 1)
    if isinstance(exc, FATAL_ERRORS):
        return KafkaFatal(text, _hint(exc, settings))
    return KafkaUnavailable(text, timed_out=isinstance(exc, kerrors.KafkaTimeoutError))


def _translated(function: Callable) -> Callable:
    """Raise what ``function``'s kafka-python calls raised as the service's errors (settings from its arguments)."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except KafkaError as exc:
            settings = next((a for a in args if isinstance(a, KafkaSettings)), getattr(args[0], "settings", None) if args else None)
            raise service_error(exc, settings) from exc

    return wrapper


@_translated
def ensure_topics(settings: KafkaSettings, topics: Iterable[TopicSpec], create: bool, timeout_s: float = 0.0) -> None:
    """Create the topics that are missing, or fail naming them when ``create`` is off.

    Connecting is retried for ``timeout_s`` (0: one attempt, for callers with a retry loop of their own).
    """
    topics = list(topics)
    admin = _retrying(lambda: KafkaAdminClient(**_options(settings), request_timeout_ms=10_000), "connect to the brokers", timeout_s)
    try:
        existing = set(admin.list_topics())
        missing = [t for t in topics if t.name not in existing]
        if missing and not create:
            names = ", ".join(t.name for t in missing)
            raise MissingTopicError(f"topics {names} do not exist and create_topics is off (--create-topics or create them)")
        for topic in missing:
            try:
                admin.create_topics([NewTopic(topic.name, topic.partitions, topic.replication_factor, topic_configs=dict(topic.config))])
                log.info("created topic %s with %d partition(s)", topic.name, topic.partitions)
            except TopicAlreadyExistsError:
                pass
    finally:
        admin.close()


def _retrying(action: Callable, what: str, timeout_s: float):
    """Run ``action`` until it works, backing off, for at most ``timeout_s``."""
    delay, deadline = 0.2, time.monotonic() + timeout_s
    while True:
        try:
            return action()
        except FATAL_ERRORS:
            raise
        except KafkaError as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("could not %s (%s); retrying in %.1f s", what, exc.__class__.__name__, delay)
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


@_translated
def make_producer(settings: KafkaSettings, **overrides) -> KafkaProducer:
    """A producer that waits for all in-sync replicas (acks=all) and batches briefly."""
    options = {"acks": "all", "linger_ms": 5, "batch_size": 256 * 1024, "max_request_size": 4 * 1024 * 1024,
               "retries": 5, "max_block_ms": 10_000, **overrides}
    return KafkaProducer(**_options(settings), **options)


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


def close_producer(producer: KafkaProducer, timeout_s: float) -> None:
    """Close ``producer``, waiting at most ``timeout_s`` for its unacknowledged messages, and never raise.

    kafka-python 3.0 raises from ``close()`` when that wait times out, and
    leaves the producer open (its sender thread, its connections, an error
    again at garbage collection): force it shut then. The messages it held
    were never acknowledged, so nothing was committed or checkpointed for them.
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
        producer._closed = True  # what close() would have set: no second attempt at garbage collection


def close_consumer(consumer: KafkaConsumer, **options) -> None:
    """``consumer.close(**options)``, its connections' close race quieted (see _CloseRaceFilter)."""
    with _closing():
        consumer.close(**options)


class _AdminClient(KafkaAdminClient):
    """kafka-python's admin client, tolerant of authorized-operation bits it cannot name.

    Tansu answers DescribeGroups with every bit set, and kafka-python 3.0
    raises ValueError turning unknown bits into its enum; nothing here needs them.
    """

    def _process_acl_operations(self, obj):
        try:
            return super()._process_acl_operations(obj)
        except ValueError:
            obj.pop("authorized_operations", None)
            return obj


@_translated
def committed_offsets(settings: KafkaSettings, group_id: str, topic: str) -> dict[int, int]:
    """Partition → committed next offset of consumer group ``group_id`` on ``topic`` (none: {})."""
    admin = _AdminClient(**_options(settings), request_timeout_ms=10_000)
    try:
        offsets = admin.list_group_offsets(group_id).get(group_id, {})
    finally:
        admin.close()
    return {tp.partition: o.offset for tp, o in offsets.items() if tp.topic == topic and o.offset >= 0}


@_translated
def group_members(settings: KafkaSettings, group_id: str) -> list[str]:
    """Member ids of consumer group ``group_id`` as its coordinator reports them (DescribeGroups).

    A member that died without leaving is listed until its session times out
    (on Tansu: until the next join evicts it).
    """
    admin = _AdminClient(**_options(settings), request_timeout_ms=10_000)
    try:
        group = admin.describe_groups([group_id])[group_id]
    finally:
        admin.close()
    if group.get("error"):
        raise KafkaError(f"describing consumer group {group_id} failed: {group['error']}")
    return [m["member_id"] for m in group.get("members") or []]


#: Topic ids that mean "none": brokers before Kafka 2.8 answer the zero UUID.
_NO_TOPIC_ID = {None, "", "00000000-0000-0000-0000-000000000000", "AAAAAAAAAAAAAAAAAAAAAA"}


@_translated
def cluster_identity(settings: KafkaSettings, topic: str) -> tuple[str | None, str | None]:
    """(the cluster's id, ``topic``'s id) as the brokers report them; None where they report none.

    A checkpoint records both: a topic deleted and created again, or another
    cluster behind the same address, has other ids.
    """
    admin = _AdminClient(**_options(settings), request_timeout_ms=10_000)
    try:
        cluster_id = admin.describe_cluster().get("cluster_id") or None
        described = [t for t in admin.describe_topics([topic]) if t.get("name") == topic]
    finally:
        admin.close()
    topic_id = described[0].get("topic_id") if described else None
    return cluster_id, None if topic_id in _NO_TOPIC_ID else str(topic_id)


@_translated
def partition_counts(settings: KafkaSettings, topics: Iterable[str]) -> dict[str, int]:
    """Topic → number of partitions (0: the topic does not exist)."""
    consumer = KafkaConsumer(**_options(settings), enable_auto_commit=False, group_id=None)
    try:
        return {t: len(consumer.partitions_for_topic(t) or ()) for t in topics}
    finally:
        close_consumer(consumer)


@_translated
def log_ranges(settings: KafkaSettings, topic: str, timeout_s: float = 10.0) -> dict[int, tuple[int, int]]:
    """Partition → (first offset, end offset) of ``topic``'s logs: where a restored position may lie.

    The end is the larger of ListOffsets' answer and the high watermark of a
    fetch at it: the embedded broker answers ListOffsets with the start of the
    last batch + 1 (README "Brokers"), a fetch tells the true end.
    """
    consumer = KafkaConsumer(**_options(settings), enable_auto_commit=False, group_id=None,
                             max_poll_records=1, fetch_max_bytes=64 * 1024, max_partition_fetch_bytes=64 * 1024,
                             request_timeout_ms=int(timeout_s * 1000))
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise KafkaError(f"topic {topic} shows no partitions")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        starts = consumer.beginning_offsets(tps, timeout_ms=int(timeout_s * 1000))
        ends = consumer.end_offsets(tps, timeout_ms=int(timeout_s * 1000))
        for tp in tps:
            consumer.seek(tp, max(starts[tp], ends[tp] - 1))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(consumer.highwater(tp) is None for tp in tps):
            consumer.poll(timeout_ms=100)
        return {tp.partition: (starts[tp], max(ends[tp], consumer.highwater(tp) or 0)) for tp in tps}
    finally:
        close_consumer(consumer)


class _Listener(ConsumerRebalanceListener):
    """kafka-python's listener of :class:`RebalanceCallbacks`: a callback's failure is never raised into the client."""

    def __init__(self, callbacks: RebalanceCallbacks):
        self.callbacks = callbacks

    def on_partitions_assigned(self, assigned):
        self.callbacks.assigned((tp.topic, tp.partition) for tp in assigned)

    def on_partitions_revoked(self, revoked):
        self.callbacks.revoked((tp.topic, tp.partition) for tp in revoked)


def _resumed_partitions_fetch_again(consumer: KafkaConsumer) -> None:
    """Mend kafka-python 3.0's port of KAFKA-7548 (dpkp/kafka-python#2981) on ``consumer``: a resumed partition stays silent.

    Records fetched for a partition that is then paused are parked, and
    fetching it stops while they are. On resume they go back in line only
    when no records are in line, tested as ``is None``; but a batch read to
    its end stays in line, empty, until the next fetch response replaces it.
    Seen in 3.0.12 whenever the other partitions' records had all been
    returned: the parked records never came back and the partition was
    never fetched again (the label partition that the service holds until
    its points come, service.app._points_first: no label ever joined). An
    empty batch in line is the same as none to the fetcher, so it is cleared
    before each drain. Only where the fetcher has these attributes (a later
    kafka-python may lay them out otherwise, or fix it).
    """
    fetcher = getattr(consumer, "_fetcher", None)
    if not all(hasattr(fetcher, a) for a in ("fetched_records", "_next_partition_records", "_paused_partition_records")):
        return
    drain = fetcher.fetched_records

    def fetched_records(*args, **kwargs):
        in_line = fetcher._next_partition_records
        if in_line is not None and not in_line:
            fetcher._next_partition_records = None
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
    """
    fetcher = getattr(consumer, "_fetcher", None)
    if not all(hasattr(fetcher, a) for a in ("fetched_records", "_next_partition_records")):
        return
    drain = fetcher.fetched_records

    def fetched_records(*args, **kwargs):
        try:
            return drain(*args, **kwargs)
        except Exception:
            failed, fetcher._next_partition_records = fetcher._next_partition_records, None
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
    """
    coordinator = getattr(consumer, "_coordinator", None)
    if not hasattr(coordinator, "_join_task") or not callable(getattr(coordinator, "need_rejoin", None)):
        return
    need_rejoin = coordinator.need_rejoin

    def rejoin_needed_while_a_join_is_held():
        return coordinator._join_task is not None or need_rejoin()

    coordinator.need_rejoin = rejoin_needed_while_a_join_is_held


class KafkaIO:
    """One consumer in a group on the input topics, and one producer (the :class:`~service.kafka.contract.Stream`).

    Rebalance callbacks run inside :meth:`poll`, between batches, so the
    application always sees them with no batch in hand.
    """

    @_translated
    def __init__(self, settings: KafkaSettings, *, group_id: str, topics: list[str], auto_offset_reset: str,
                 on_assigned: Callable, on_revoked: Callable, max_poll_records: int, fetch_max_wait_ms: int = 500,
                 client_id: str = "perceptron-stream"):
        self.settings = settings
        self.group_id = group_id
        self.consumer = KafkaConsumer(
            **_options(settings), group_id=group_id, client_id=client_id,
            enable_auto_commit=False, auto_offset_reset=auto_offset_reset,
            # records of aborted transactions are never predicted nor learned (kafka-python's default would read them)
            isolation_level=ISOLATION_LEVEL,
            max_poll_records=max_poll_records, fetch_max_wait_ms=fetch_max_wait_ms, request_timeout_ms=10_000,
            # the range assignor gives partition p of every topic to one member (the join of labels to points needs it)
            partition_assignment_strategy=[RangePartitionAssignor],
            **GROUP_TIMINGS,
        )
        self.callbacks = RebalanceCallbacks(on_assigned, on_revoked)
        self.consumer.subscribe(topics, listener=_Listener(self.callbacks))
        _resumed_partitions_fetch_again(self.consumer)
        _failed_batches_are_fetched_again(self.consumer)
        _joins_finished_between_polls_are_completed(self.consumer)
        try:
            self.producer = self._new_producer()
        except BaseException:  # the caller retries: leave no consumer (its thread, its sockets) behind
            close_consumer(self.consumer, autocommit=False)
            raise
        self.ledger = Ledger()
        self._pending: list = []  # (topic, key, value, future) sent and not yet settled
        self._refused = False  # the producer refused a send: the rest wait for the flush to send them again

    def _new_producer(self) -> KafkaProducer:
        return make_producer(self.settings, linger_ms=LINGER_UNTIL_FLUSH_MS)

    # consuming -----------------------------------------------------------
    @_translated
    def poll(self, timeout_ms: int, max_records: int) -> list[list[Record]]:
        """The next records, one list per partition: kafka-python's ConsumerRecords, which have :class:`Record`'s attributes.

        What a rebalance callback raised inside it is raised instead (:mod:`service.kafka.rebalance`).
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

    @_translated
    def seek(self, topic: str, partition: int, offset: int) -> None:
        """Next read of the partition at ``offset``, or at its BEGINNING or END."""
        tp = TopicPartition(topic, partition)
        if offset == BEGINNING:
            self.consumer.seek_to_beginning(tp)
        elif offset == END:
            self.consumer.seek_to_end(tp)
        else:
            self.consumer.seek(tp, offset)

    @_translated
    def commit(self, positions: dict[tuple[str, int], int], timeout_s: float | None = None) -> None:
        """Commit next-offsets of the partitions still owned; KafkaUnavailable (e.g. during a rebalance, or after
        ``timeout_s``) for the caller to retry later.

        Not from a rebalance callback: those run on the consumer's network thread, which cannot block on itself.
        """
        owned = self.consumer.assignment()
        positions = {tp: o for tp, o in positions.items() if TopicPartition(*tp) in owned}
        if positions:
            self.consumer.commit({TopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in positions.items()},
                                 timeout_ms=None if timeout_s is None else int(timeout_s * 1000))

    @_translated
    def lag(self, timeout_s: float | None = None, ask_broker: bool = True) -> dict[tuple[str, int], int]:
        """Messages between the consumer's position and the end of each assigned partition.

        ``ask_broker`` False: from the high watermarks the last fetch responses
        carried, without a request (a ListOffsets round trip stalled the loop
        100-300 ms on the embedded broker); a partition with none yet is left out.
        True: the end offsets, asked of the brokers (KafkaUnavailable when they
        do not answer within ``timeout_s``: the loop's probe for /readyz).
        """
        tps = list(self.consumer.assignment())
        if not tps:
            return {}
        if ask_broker:
            ends = self.consumer.end_offsets(tps, timeout_ms=None if timeout_s is None else int(timeout_s * 1000))
        else:
            ends = {tp: self.consumer.highwater(tp) for tp in tps}
        timeout_ms = None if timeout_s is None else int(timeout_s * 1000)
        return {(tp.topic, tp.partition): max(0, ends[tp] - self.consumer.position(tp, timeout_ms=timeout_ms))
                for tp in tps if ends[tp] is not None}

    def group_members(self) -> list[str]:
        """Member ids of the live members of this consumer's group, this one included."""
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
                log.warning("the producer refused a message (%s); it is sent again at the flush", exc.__class__.__name__)
                self._refused, future = True, _NOT_SENT
        self._pending.append((topic, key, value, future))

    def flush(self, timeout_s: float) -> list[Refused]:
        """Until the brokers acknowledged every message sent since the last flush (:meth:`Ledger.settle`)."""
        return self.ledger.settle(self, timeout_s)

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
                kind = FATAL if isinstance(error, FATAL_ERRORS) else REFUSED if isinstance(error, REFUSED_ERRORS) else RETRY
                ledger.failed((t, k, v), kind, service_error(error, self.settings) if kind == FATAL else error)
        self._pending = waiting
        return len(waiting)

    @_translated
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
            close_consumer(self.consumer, autocommit=False)


class CompactedTopic:
    """A compacted topic used as a small key → value store (the Kafka checkpoint store)."""

    @_translated
    def __init__(self, settings: KafkaSettings, topic: str):
        self.settings, self.topic = settings, topic
        self.producer = make_producer(settings, linger_ms=0, max_request_size=16 * 1024 * 1024)

    @_translated
    def put(self, key: bytes, value: bytes, timeout_s: float = 10.0) -> None:
        """Write and wait for the broker's acknowledgement."""
        self.producer.send(self.topic, key=key, value=value).get(timeout=timeout_s)

    @_translated
    def read_latest(self, wanted: set[bytes], timeout_s: float = 30.0) -> dict[bytes, bytes | None]:
        """The last value of each key in ``wanted``, reading every partition from its beginning (as compaction would keep).

        Memory stays at about one value per wanted key: fetches are capped at
        1 MiB (a larger record still comes, alone), few records are handed over
        per poll, and the values of other keys are dropped as they come.
        """
        consumer = KafkaConsumer(**_options(self.settings), enable_auto_commit=False, group_id=None,
                                 fetch_max_bytes=1024 * 1024, max_partition_fetch_bytes=1024 * 1024, max_poll_records=16)
        try:
            partitions = consumer.partitions_for_topic(self.topic) or set()
            tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
            if not tps:  # the service made sure it exists: not "no checkpoint", which would start a new model
                raise KafkaError(f"the checkpoint topic {self.topic} shows no partitions (metadata not there yet, "
                                 "or the topic is not visible to this client: check its ACLs)")
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            ends = consumer.end_offsets(tps)
            out: dict[bytes, bytes | None] = {}
            deadline, quiet_polls = time.monotonic() + timeout_s, 0
            # end_offsets reads short on the embedded broker (README "Brokers"): read
            # until past it AND one poll came back empty.
            while time.monotonic() < deadline:
                batches = consumer.poll(timeout_ms=200)
                empty = not batches
                for messages in batches.values():
                    for m in messages:
                        if m.key in wanted:
                            out[m.key] = m.value
                batches = messages = None  # the values of other keys go now, not at the next poll
                done = all(consumer.position(tp) >= ends[tp] for tp in tps)
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

    @_translated
    def __init__(self, settings: KafkaSettings, topic: str):
        self.settings, self.topic = settings, topic
        self.consumer = KafkaConsumer(**_options(settings), enable_auto_commit=False, group_id=None,
                                      fetch_max_bytes=1024 * 1024, max_partition_fetch_bytes=1024 * 1024, max_poll_records=64,
                                      fetch_max_wait_ms=20)
        try:
            partitions = self.consumer.partitions_for_topic(topic) or set()
            if not partitions:
                raise KafkaError(f"topic {topic} shows no partitions (metadata not there yet, or not visible to this client)")
            tps = [TopicPartition(topic, p) for p in sorted(partitions)]
            self.consumer.assign(tps)
            self.consumer.seek_to_beginning(*tps)
        except BaseException:
            close_consumer(self.consumer)
            raise

    @_translated
    def poll(self, timeout_ms: int = 0) -> list[tuple[bytes | None, bytes | None]]:
        """The (key, value) of the records that came since the last call, in order."""
        return [(m.key, m.value) for messages in self.consumer.poll(timeout_ms=timeout_ms).values() for m in messages]

    def close(self) -> None:
        close_consumer(self.consumer)



class PartitionedLog:
    """A compacted topic partitioned like the input, written and read one partition at a time (the pending changelog)."""

    @_translated
    def __init__(self, settings: KafkaSettings, topic: str):
        self.settings, self.topic = settings, topic
        self.producer = make_producer(settings, linger_ms=50, max_request_size=4 * 1024 * 1024)
        self._futures: list = []

    @_translated
    def send(self, partition: int, key: bytes, value: bytes) -> None:
        self._futures.append(self.producer.send(self.topic, key=key, value=value, partition=partition))

    @_translated
    def flush(self, timeout_s: float = 30.0) -> None:
        """Every record sent acknowledged, or the first failure raised."""
        futures, self._futures = self._futures, []
        self.producer.flush(timeout=timeout_s)
        for future in futures:
            future.get(timeout=0)

    def read(self, partition: int, timeout_s: float = 120.0):
        """(key, value) of every record of ``partition``, from its beginning to its end, in order (a generator)."""
        try:
            yield from self._read(partition, timeout_s)
        except KafkaError as exc:
            raise service_error(exc, self.settings) from exc

    def _read(self, partition: int, timeout_s: float):
        consumer = KafkaConsumer(**_options(self.settings), enable_auto_commit=False, group_id=None,
                                 fetch_max_bytes=4 * 1024 * 1024, max_partition_fetch_bytes=4 * 1024 * 1024)
        try:
            tp = TopicPartition(self.topic, partition)
            consumer.assign([tp])
            consumer.seek_to_beginning(tp)
            end = consumer.end_offsets([tp])[tp]
            deadline, quiet = time.monotonic() + timeout_s, 0
            while time.monotonic() < deadline:
                batches = consumer.poll(timeout_ms=200)
                for messages in batches.values():
                    for m in messages:
                        yield m.key, m.value
                quiet = quiet + 1 if not batches else 0
                if consumer.position(tp) >= end and quiet >= 1:  # end_offsets may read short (the embedded broker): one quiet poll too
                    return
            raise KafkaError(f"reading {self.topic}[{partition}] did not finish within {timeout_s:.0f} s")
        finally:
            close_consumer(consumer)

    def close(self) -> None:
        close_producer(self.producer, 5.0)
