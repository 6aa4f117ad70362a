"""Mends of kafka-python's own bugs, each applied where the service builds or closes a kafka-python client.

Checked against kafka-python 3.0.0 to 3.0.12 (:data:`VERIFIED`): the suite runs on 3.0.12 (deploy/requirements.lock's
pin, and the newest release in 2026-11), and 3.0.0's source has each mend's target and the same faulty code.
pyproject.toml allows ``kafka-python>=3.0,<3.1`` (:data:`REQUIREMENT`) for that reason. Each mend says what the bug
is, what it broke here, the source lines of 3.0.12 it mends, the upstream issue or pull request where there is one,
and the test that proves it. When an upgrade fixes one, remove it here, and keep the test that proves the behaviour.

- :func:`net_client`: a SASL rejection, or a broker certificate that did not
  verify, is final (:class:`_RejectionsAreFinal`), a broker's last answer
  before it hangs up is read (:func:`_recv_then_eof`), and a client's
  ``allow_auto_create_topics`` reaches its metadata requests;
- :func:`close_producer`, :func:`close_consumer`: a close that times out does
  not leave a producer running, and the close race's ERROR lines are quieted;
- :class:`AdminClient`: DescribeGroups answers with authorized-operation bits
  kafka-python cannot name;
- :func:`mend_consumer`: the fetcher's and the group join's bugs of a
  consumer in a group;
- :func:`bound_abort`: a transaction's abort waits a bounded time;
- :func:`mend_transactional_producer`: a send in an open transaction to a
  partition already in it takes no lock (a cost, not a bug).

**A kafka-python laid out otherwise** (upstream's master moves ``kafka.net.selector`` to ``kafka.net.backend``,
dpkp/kafka-python#3127): ``import perceptron_stream`` still works, and so does every command that builds no
kafka-python client (``train``, ``broker``, ``--help``); a command that would build one **refuses to start**:
:func:`require_mends` raises :class:`~perceptron_stream.kafka.contract.KafkaFatal` naming each mend whose target
(:data:`TARGETS`: a module, a class, an attribute it patches or reads) is missing and the versions checked, and
``serve`` stops at start-up with exit 1, the code of an error retrying cannot cure (docs/reference/cli.md).
Refused rather than run without, because all but one of the mends keep a guarantee (a rejection that stops the
service, labels that join, a poll that returns, a group member that gets its partitions): without them the service
would break those silently. The one that is a cost, :func:`mend_transactional_producer`, is left out with a
warning instead. ``tests/kafka/test_kp_mends.py`` proves both with a target made unimportable or deleted.
"""

from __future__ import annotations

import dis
import functools
import importlib
import importlib.metadata
import inspect
import logging
import ssl
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import kafka.errors as kerrors
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.errors import KafkaError
from perceptron_stream.kafka.contract import KafkaFatal
from perceptron_stream.kafka.errors import (
    AUTHENTICATION_ERRORS,
    CERTIFICATE_REFUSED_ALERTS,
    ClientCertificateRefused,
    SslAuthenticationError,
)

try:  # kafka-python's network layer (private): where it is laid out otherwise, require_mends() refuses to start
    from kafka.net.compat import KafkaNetClient
    from kafka.net.manager import KafkaConnectionManager
    from kafka.net.selector import NetworkSelector
except ImportError:
    KafkaNetClient = NetworkSelector = None
    KafkaConnectionManager = object  # the base of _RejectionsAreFinal, never built then

log = logging.getLogger(__name__)

#: The kafka-python versions every mend here was checked against, and the range pyproject.toml allows for it.
VERIFIED = "3.0.0 to 3.0.12"
REQUIREMENT = "kafka-python>=3.0,<3.1"


class Target(NamedTuple):
    """What a mend patches or reads: a module of kafka-python, a class of it, an attribute of that class (a method,
    or an attribute its methods set: ``self.name = ...``)."""

    module: str
    cls: str | None = None
    name: str | None = None

    def __str__(self) -> str:
        return ".".join(p for p in self if p)

    def problem(self) -> str | None:
        """Why this kafka-python lacks the target, or None when it has it."""
        try:
            found: Any = importlib.import_module(self.module)
        except ImportError as exc:
            return f"{self} ({exc})"
        if self.cls is not None:
            found = getattr(found, self.cls, None)
            if found is None:
                return f"{self} ({self.module} has no {self.cls})"
        if self.name is not None and not _has(found, self.name):
            return f"{self} ({self.cls} has no {self.name})"
        return None


def _has(cls: type, name: str) -> bool:
    """Whether ``cls`` has attribute ``name``, or one of its methods sets it (``self.name = ...``: an instance's)."""
    if hasattr(cls, name):
        return True
    return any(
        instruction.opname == "STORE_ATTR" and instruction.argval == name
        for klass in inspect.getmro(cls)
        for function in vars(klass).values()
        if hasattr(function, "__code__")
        for instruction in dis.get_instructions(function)
    )


_CONSUMER, _PRODUCER = "kafka.consumer.group", "kafka.producer.kafka"
_FETCHER, _COORDINATOR = "kafka.consumer.fetcher", "kafka.coordinator.base"
_MANAGER, _TRANSACTIONS = "kafka.net.manager", "kafka.producer.transaction_manager"

#: Each mend → what it patches or reads of kafka-python (checked by :func:`require_mends`).
TARGETS: dict[str, tuple[Target, ...]] = {
    "net_client (a SASL rejection or an unverified certificate is final)": (
        Target("kafka.net.compat", "KafkaNetClient"),
        Target("kafka.net.selector", "NetworkSelector"),
        Target(_MANAGER, "KafkaConnectionManager", "get_connection"),
        Target(_MANAGER, "KafkaConnectionManager", "_build_transport"),
        Target(_MANAGER, "KafkaConnectionManager", "maybe_raise_auth_failure"),
        Target("kafka.net.connection", "KafkaConnection", "init_future"),
    ),
    "net_client (a client's allow_auto_create_topics reaches its metadata requests)": (
        Target(_MANAGER, "KafkaConnectionManager", "cluster"),
        Target("kafka.cluster", "ClusterMetadata", "config"),
        Target("kafka.cluster", "ClusterMetadata", "metadata_request"),
    ),
    "_recv_then_eof (a broker's last answer before it hangs up is read)": (
        Target("kafka.net.transport", "KafkaTCPTransport", "_sock_recv"),
        Target("kafka.net.transport", "KafkaSSLTransport", "_sock_recv"),
    ),
    "close_producer (a close that times out leaves no producer running)": (
        Target(_PRODUCER, "KafkaProducer", "_sender"),
        Target(_PRODUCER, "KafkaProducer", "_closed"),
        Target("kafka.producer.sender", "Sender", "force_close"),
    ),
    "_CloseRaceFilter (the close race's ERROR lines quieted)": tuple(
        Target(name) for name in ("kafka.net.transport", "kafka.net.selector")
    ),
    "AdminClient (authorized-operation bits kafka-python cannot name)": (
        Target("kafka.admin.client", "KafkaAdminClient", "_process_acl_operations"),
    ),
    "_resumed_partitions_fetch_again (a resumed partition is fetched again)": (
        Target(_CONSUMER, "KafkaConsumer", "_fetcher"),
        Target(_FETCHER, "Fetcher", "fetched_records"),
        Target(_FETCHER, "Fetcher", "_next_partition_records"),
        Target(_FETCHER, "Fetcher", "_paused_partition_records"),
    ),
    "_failed_batches_are_fetched_again (a batch that failed to parse does not spin every poll)": (
        Target(_CONSUMER, "KafkaConsumer", "_fetcher"),
        Target(_FETCHER, "Fetcher", "fetched_records"),
        Target(_FETCHER, "Fetcher", "_next_partition_records"),
    ),
    "bound_abort (a transaction's abort waits a bounded time)": (
        Target(_PRODUCER, "KafkaProducer", "_transaction_manager"),
        Target(_PRODUCER, "KafkaProducer", "_sender"),
        Target(_TRANSACTIONS, "TransactionManager", "begin_abort"),
        Target(_TRANSACTIONS, "TransactionalRequestResult", "wait"),
        Target("kafka.producer.sender", "Sender", "wakeup"),
    ),
    "_joins_finished_between_polls_are_completed (a join finished between polls is applied)": (
        Target(_CONSUMER, "KafkaConsumer", "_coordinator"),
        Target(_COORDINATOR, "BaseCoordinator", "_join_task"),
        Target(_COORDINATOR, "BaseCoordinator", "need_rejoin"),
    ),
}


def missing_targets() -> dict[str, list[str]]:
    """Each mend whose targets this kafka-python lacks → what it lacks and why ({} when none)."""
    missing = {mend: [p for p in map(Target.problem, targets) if p] for mend, targets in TARGETS.items()}
    return {mend: problems for mend, problems in missing.items() if problems}


def mend_missing(missing: dict[str, list[str]]) -> KafkaFatal:
    """The refusal: which mends cannot be applied, what they lack, the versions they were checked against."""
    lacks = "; ".join(f"{mend} needs {', '.join(problems)}" for mend, problems in missing.items())
    return KafkaFatal(
        f"kafka-python {_installed()} lacks what the service's mends of its bugs patch: {lacks}. The mends were checked "
        f"against kafka-python {VERIFIED} only, and without them the service would break what they keep",
        f"install a kafka-python they were checked against: pip install '{REQUIREMENT}'",
    )


@functools.cache
def _missing_once() -> tuple[tuple[str, tuple[str, ...]], ...]:
    return tuple((mend, tuple(problems)) for mend, problems in missing_targets().items())


def require_mends() -> None:
    """Raise KafkaFatal (:func:`mend_missing`) when a mend's target is missing from the installed kafka-python.

    Checked once a process (the installed kafka-python does not change under it), before any kafka-python client is
    built (:func:`perceptron_stream.kafka.kp_options.kafka_python_options`), and at ``serve``'s start-up.
    """
    missing = _missing_once()
    if missing:
        raise mend_missing({mend: list(problems) for mend, problems in missing})


def _installed() -> str:
    try:
        return importlib.metadata.version("kafka-python")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - imported from elsewhere than a distribution
        return "(version unknown)"


def _require(client: Any, part: str, mend: str, *names: str) -> Any:
    """``client``'s ``part`` (its fetcher, its coordinator: kafka-python's, untyped); KafkaFatal (:func:`mend_missing`)
    unless it is there with ``names``.

    :func:`require_mends` found them in kafka-python's classes before the client was built; this is the same refusal
    for a client built otherwise (bench/e2e.py's), never a mend skipped in silence.
    """
    found = getattr(client, part, None)
    lacks = [part] if found is None else [f"{part}.{name}" for name in names if not hasattr(found, name)]
    if lacks:
        full = next((m for m in TARGETS if m.startswith(f"{mend} ")), mend)
        raise mend_missing({full: [f"{type(client).__name__}.{what}" for what in lacks]})
    return found


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

    Checked against kafka-python 3.0.0 to 3.0.12. Mends
    ``KafkaConnectionManager._connect`` (3.0.12: kafka/net/manager.py:227;
    its note at line 244 says ``conn.initialize`` does not raise, its errors
    go to ``init_future``). Upstream: dpkp/kafka-python#2994 (in 3.0.0)
    records SaslAuthenticationFailedError/AuthorizationError only when the
    connect itself raises, so these rejections still escape it (upstream's
    master alike). No upstream issue found. Proved by
    tests/integration/test_sasl.py and test_tls.py.
    """

    def __init__(self, net, **configs):
        super().__init__(net, **configs)
        # kafka-python 3.0.12 builds the manager's ClusterMetadata without the client's allow_auto_create_topics
        # (kafka/net/manager.py:81), so every producer and consumer asks for metadata with auto-creation on, whatever
        # it was given: a state topic deleted under the service came back at its next write, with the brokers'
        # defaults (cleanup.policy=delete). Here the client's setting reaches ``metadata_request``. No upstream
        # issue found. Proved by tests/integration/test_state_topics.py (the deleted topic stays deleted).
        self.cluster.config["allow_auto_create_topics"] = configs.get("allow_auto_create_topics", True)
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
    if alert is not None and alert.reason in CERTIFICATE_REFUSED_ALERTS.values():
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

    Checked against kafka-python 3.0.0 to 3.0.12. Mends
    ``KafkaTCPTransport._sock_recv`` and ``KafkaSSLTransport._sock_recv``
    (3.0.12: kafka/net/transport.py:105 and :429, the "socket disconnected"
    error at :117 and :437, which the caller takes instead of the bytes read).
    No upstream issue found. Proved by tests/integration/test_sasl.py (a
    mechanism not enabled).
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
    Checked against kafka-python 3.0.0 to 3.0.12: the ERROR is
    ``log.exception`` "Error receiving network data closing socket" of
    ``_sock_recv`` (3.0.12: kafka/net/transport.py:125 and :445). No upstream
    issue found.

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
    """Turns kafka-python's lines that report nothing wrong, or what the service says better, into DEBUG lines (of
    this module's logger).

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
    - ``WARNING kafka.coordinator.consumer: OffsetCommit for group ... failed:
      UnknownMemberIdError`` (coordinator/consumer.py, before it raises
      CommitFailedError): the service says the refused commit itself, once.
    - The heartbeat's lines of a group session lost (``Heartbeat: local
      member_id was not recognized``, ``... generation id is not current``,
      ``Heartbeat session expired``, ``... coordinator ... is either not
      started or not valid``): an outage past the session (6 s), or a stop of
      the process; the consumer joins again by itself, and the service says the
      outage, the refused commit and the new assignment itself. A CI run saw
      the first at WARNING after a 12 s broker kill (test_log_lines).
    - A connection refused, lost or timed out, and what follows from it ("No
      node available for metadata refresh", "Marking the coordinator dead", a
      fetch or a request that failed with KafkaConnectionError): the brokers
      away. A 12 s outage (the broker SIGKILLed, then restarted) was 84 such
      lines, most of them in the seconds before the service's own call gave
      up and said the outage (runtime/outage.py: one line naming
      --bootstrap-servers when it starts, one a minute while it lasts, one
      when it ends). A connection kafka-python re-makes by itself is no news;
      one it cannot is the outage the service says.

    Against kafka-python 3.0.12 (kafka/cluster.py ``_do_refresh_metadata``,
    kafka/net/selector.py ``_poll_once``, kafka/net/manager.py,
    connection.py, transport.py, coordinator/base.py, consumer/fetcher.py); no
    upstream issue found. Installed on those loggers when this module is
    imported; other records pass untouched, and ``--log-level DEBUG`` shows
    these as DEBUG lines.

    >>> from kafka.errors import Cancelled, KafkaConnectionError
    >>> def refresh(error):
    ...     return logging.LogRecord("kafka.cluster", logging.ERROR, "", 1, "Metadata refresh: failed %s", (error,), None)
    >>> _ClientNoiseFilter().filter(refresh(Cancelled())), _ClientNoiseFilter().filter(refresh(ValueError()))
    (False, True)
    >>> _ClientNoiseFilter().filter(refresh(KafkaConnectionError("111 ECONNREFUSED")))  # the brokers away
    False
    >>> def heartbeat(msg):
    ...     return logging.LogRecord("kafka.coordinator.heartbeat", logging.WARNING, "", 1, msg, (), None)
    >>> _ClientNoiseFilter().filter(heartbeat("Heartbeat: local member_id was not recognized; this consumer needs to re-join"))
    False
    >>> _ClientNoiseFilter().filter(heartbeat("Consumer poll timeout has expired. This means the time between ..."))
    True
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not self.noise(record):  # a DEBUG or INFO line is quiet already
            return True
        log.debug("%s logged: %s", record.name, record.getMessage())
        return False

    @staticmethod
    def noise(record: logging.LogRecord) -> bool:
        if _connection_trouble(record):
            return True
        if record.name == "kafka.coordinator.consumer" and record.msg == "OffsetCommit for group %s failed: %s":
            return True  # a member the group removed (an outage past the session): raised next as CommitFailedError,
            # which the service says itself ("could not commit offsets of group ...")
        if record.name == "kafka.coordinator.heartbeat" and str(record.msg).startswith(_SESSION_LOST):
            return True
        if record.name == "kafka.cluster":
            args = record.args if isinstance(record.args, tuple) else ()
            return record.msg == "Metadata refresh: failed %s" and bool(args) and isinstance(args[0], kerrors.Cancelled)
        return (
            record.name == "kafka.net.selector"
            and str(record.msg).startswith("Task ")
            and "blocking the event loop" in str(record.msg)
        )


#: The starts of kafka-python's heartbeat lines of a group session lost (kafka/coordinator/base.py of 3.0.12), their
#: format strings: see :class:`_ClientNoiseFilter`.
_SESSION_LOST = (
    "Heartbeat: local member_id was not recognized",
    "Heartbeat failed for group %s: generation id is not",
    "Heartbeat session expired",
    "Heartbeat failed for group %s: coordinator",
)


#: What a connection refused, lost or timed out is, to kafka-python: the errors its lines carry, and the words of the
#: lines that carry none (kafka/cluster.py, kafka/coordinator/base.py, kafka/net/transport.py and connection.py).
_CONNECTION_ERRORS = (OSError, kerrors.KafkaConnectionError, kerrors.NodeNotReadyError, kerrors.RequestTimedOutError)
_CONNECTION_WORDS = (
    "KafkaConnectionError",
    "No node available",
    "socket disconnected",
    "Request timed out",
)


def _connection_trouble(record: logging.LogRecord) -> bool:
    """A line of kafka-python's that says a connection to the brokers failed (see :class:`_ClientNoiseFilter`)."""
    args = record.args if isinstance(record.args, tuple) else ()
    error = record.exc_info[1] if record.exc_info else None
    return (
        isinstance(error, _CONNECTION_ERRORS)
        or any(isinstance(arg, _CONNECTION_ERRORS) for arg in args)
        or any(words in record.getMessage() for words in _CONNECTION_WORDS)
    )


#: kafka-python's loggers that report connections, or what failed for want of one: a logger's filters see only
#: the records logged on it (not its children's).
_NOISY_LOGGERS = (
    "kafka.cluster",
    "kafka.net.selector",
    "kafka.net.manager",
    "kafka.net.connection",
    "kafka.net.transport",
    "kafka.coordinator",
    "kafka.coordinator.consumer",
    "kafka.coordinator.heartbeat",
    "kafka.consumer.fetcher",
    "kafka.consumer.group",
    "kafka.producer.kafka",
    "kafka.producer.sender",
    "kafka.producer.transaction_manager",
    "kafka.admin.client",
)
for _logger in _NOISY_LOGGERS:
    logging.getLogger(_logger).addFilter(_ClientNoiseFilter())


def close_producer(producer: KafkaProducer, timeout_s: float) -> None:
    """Close ``producer``, waiting at most ``timeout_s`` for its unacknowledged messages, and never raise.

    kafka-python 3.0 raises from ``close()`` when that wait times out, and
    leaves the producer open (its sender thread, its connections, an error
    again at garbage collection): force it shut then. The messages it held
    were never acknowledged, so nothing was committed or checkpointed for them.

    Checked against kafka-python 3.0.0 to 3.0.12: ``KafkaProducer.close``
    (3.0.12: kafka/producer/kafka.py:668) calls ``flush(timeout)`` first
    (:695), which raises KafkaTimeoutError before the sender's ``force_close``
    (:714) is reached. Upstream's dpkp/kafka-python#3108 (in 3.0.10, "fix
    stalled shutdown when brokers unreachable") did not change that order.
    No upstream issue found.
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

    Checked against kafka-python 3.0.0 to 3.0.12: ``_process_acl_operations``
    calls ``valid_acl_operations`` (3.0.12: kafka/admin/_acls.py:31), which
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
    its points come, perceptron_stream.pipeline.labels.gate.LabelGate.after:
    no label ever joined). An
    empty batch in line is the same as none to the fetcher, so it is cleared
    before each drain.

    Checked against kafka-python 3.0.0 to 3.0.12: ``Fetcher.fetched_records``
    tests ``self._next_partition_records is None`` (3.0.12:
    kafka/consumer/fetcher.py:589) before putting the parked records back.
    Upstream: the port came with dpkp/kafka-python#2981 (KAFKA-7548); its
    master still tests it so. Proved by tests/integration/test_delayed_labels.py
    (labels held until their points come) and bench/e2e.py.
    """
    fetcher = _require(
        consumer,
        "_fetcher",
        "_resumed_partitions_fetch_again",
        "fetched_records",
        "_next_partition_records",
        "_paused_partition_records",
    )
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
    response) is read past.

    Checked against kafka-python 3.0.0 to 3.0.12: the loop is
    ``while records_remaining > 0`` of ``Fetcher.fetched_records`` (3.0.12:
    kafka/consumer/fetcher.py:596). No upstream issue found (this project's
    issue 29). Proved by tests/integration/test_reading.py (records in a
    codec the client cannot read: every poll fails, none spins).
    """
    fetcher = _require(
        consumer, "_fetcher", "_failed_batches_are_fetched_again", "fetched_records", "_next_partition_records"
    )
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
    that one.

    Checked against kafka-python 3.0.0 to 3.0.12:
    ``join_group_async`` awaits the join only ``while self.need_rejoin()`` (3.0.12:
    kafka/coordinator/base.py:480), and a timer that expires leaves the join
    task in flight (:513); upstream's master alike. No upstream issue found.
    Proved on Apache Kafka by the integration tests
    that wait for an assignment (tests/support/service.py wait_assigned).
    """
    coordinator = _require(
        consumer, "_coordinator", "_joins_finished_between_polls_are_completed", "_join_task", "need_rejoin"
    )
    need_rejoin = coordinator.need_rejoin

    def rejoin_needed_while_a_join_is_held():
        return coordinator._join_task is not None or need_rejoin()  # noqa: SLF001 — the join in flight, kept private by kafka-python

    coordinator.need_rejoin = rejoin_needed_while_a_join_is_held


def bound_abort(producer: KafkaProducer, timeout_s: float) -> None:
    """``producer.abort_transaction()`` waits ``timeout_s`` at most: KafkaTimeoutError after it.

    kafka-python 3.0.12's ``abort_transaction`` waits for its EndTxn without a timeout (kafka/producer/kafka.py:862,
    ``result.wait()``), and the EndTxn waits for the transaction's batches: one for a topic deleted under the
    service (its checkpoint topic) has no leader to go to and waited until ``delivery_timeout_ms``, the poll loop
    stuck in the abort meanwhile (more than 60 s, tests/integration/test_state_topics.py, exactly-once). The same
    calls, with the wait bounded; a producer whose abort did not finish is of no further use (the caller stops).
    Checked against kafka-python 3.0.0 to 3.0.12. No upstream issue found.
    """
    manager = producer._transaction_manager  # noqa: SLF001 — what abort_transaction does, bounded
    sender = producer._sender  # noqa: SLF001

    def abort_transaction() -> None:
        result = manager.begin_abort()
        sender.wakeup()
        if not result.wait(timeout_ms=int(timeout_s * 1000)):
            raise kerrors.KafkaTimeoutError(f"the transaction's abort did not finish within {timeout_s:g} s")

    producer.abort_transaction = abort_transaction


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
    see to the records then, as before. Checked against kafka-python 3.0.0 to 3.0.12
    (3.0.12: kafka/producer/transaction_manager.py:250). No upstream issue filed: a cost, not a bug, so where
    kafka-python lays the manager out otherwise the mend is left out with a warning (sends take the locks, as
    before), not refused. Proved by tests/integration/test_exactly_once.py (fenced zombies, aborts) and measured by
    bench/e2e.py --exactly-once.
    """
    manager: Any = getattr(producer, "_transaction_manager", None)  # kafka-python's, untyped
    names = ("_current_state", "_partitions_in_transaction", "maybe_add_partition_to_transaction")
    if (
        manager is None
        or not all(hasattr(manager, a) for a in names)
        or Target(_TRANSACTIONS, "TransactionState", "IN_TRANSACTION").problem() is not None
    ):
        log.warning(
            "kafka-python %s: a send in a transaction takes its locks as before (mend_transactional_producer, "
            "checked against kafka-python %s, finds no transaction manager it knows); nothing else changes",
            _installed(),
            VERIFIED,
        )
        return
    from kafka.producer.transaction_manager import TransactionState

    open_state, locked = TransactionState.IN_TRANSACTION, manager.maybe_add_partition_to_transaction

    def maybe_add_partition_to_transaction(topic_partition) -> None:
        if manager._current_state == open_state and topic_partition in manager._partitions_in_transaction:  # noqa: SLF001 — the manager's state, read as its locked path reads it
            return
        locked(topic_partition)

    manager.maybe_add_partition_to_transaction = maybe_add_partition_to_transaction
