"""The one error vocabulary of the Kafka layer: which client errors are fatal, refused for good, or worth a retry.

Both clients and ``perceptron-stream produce`` classify here, so a failure
means the same whichever client met it:

- the lists of kafka-python's error classes (:data:`FATAL_ERRORS`,
  :data:`REFUSED_ERRORS`, :data:`AUTHENTICATION_ERRORS`) and of librdkafka's
  own error codes with the kafka-python class each stands for
  (:data:`LIBRDKAFKA_ERRORS`: confluent.py maps its errors through it);
- :func:`delivery_kind`: what a failed delivery is (send it again, refused
  for good, fatal);
- :func:`service_error`: the service's own error (:mod:`perceptron_stream.kafka.contract`:
  :class:`KafkaFatal` naming what to fix, or :class:`KafkaUnavailable`) for
  a client's, and :func:`translated`, which raises it in their place;
- :func:`transaction_error`: the same for what a transaction met, which
  aborts it: :class:`Fenced` (:data:`FENCED_ERRORS`: another instance owns the
  partitions now, stop), :class:`KafkaFatal` (a setting, a permission, or a
  producer the client calls broken for good), or :class:`Aborted` (anything
  else: the transaction is aborted and the span read again).

The lists name the clients' classes and codes as strings, resolved here:
tests/kafka/test_errors.py checks that every name exists in the installed
clients, so an upgrade that renames one fails a test instead of quietly
turning a fatal error into an endless retry.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import overload

import kafka.errors as kerrors
from kafka.errors import KafkaError
from perceptron_stream.config import KafkaSettings, env_var, flag
from perceptron_stream.kafka.contract import (  # noqa: F401 - the service's own errors, here with their vocabulary
    Aborted,
    DeliveryError,
    Fenced,
    KafkaFatal,
    KafkaUnavailable,
    MissingTopicError,
)

#: What a failed delivery is: send it again, refused for good, or fatal (stop).
RETRY, REFUSED, FATAL = "retry", "refused", "fatal"


def _errors(names: tuple[str, ...]) -> tuple[type[BaseException], ...]:
    return tuple(getattr(kerrors, name) for name in names if hasattr(kerrors, name))


class SslAuthenticationError(KafkaError):
    """The brokers' TLS certificate failed verification (not signed by a CA of ``ssl_cafile``, or not for the
    address connected to): Kafka's Java client calls it SslAuthenticationException and, as for a SASL
    rejection, gives up instead of retrying. kafka-python has no class of its own for it: it wraps the
    handshake's ssl.SSLCertVerificationError in a KafkaConnectionError, like any connection that failed."""


class ClientCertificateRefused(SslAuthenticationError):
    """The brokers refused the client's certificate, or its absence (a listener with ``ssl.client.auth=required``):
    TLS alert 42, bad_certificate, at the first read after the handshake (TLS 1.3 sends it there)."""


#: TLS alerts with which the brokers refuse the client's certificate: the alert's number (RFC 8446, what librdkafka
#: reports: "SSL alert number 42") → OpenSSL's reason (what Python's ssl module reports, kafka-python's).
CERTIFICATE_REFUSED_ALERTS = {
    42: "SSLV3_ALERT_BAD_CERTIFICATE",  # bad_certificate
    116: "TLSV13_ALERT_CERTIFICATE_REQUIRED",  # certificate_required
    48: "TLSV1_ALERT_UNKNOWN_CA",  # unknown_ca
    46: "SSLV3_ALERT_CERTIFICATE_UNKNOWN",  # certificate_unknown
}

#: kafka-python's classes of a rejected SASL mechanism (error 33), SASL exchange (34) or credentials (58).
AUTHENTICATION_ERROR_NAMES = ("UnsupportedSaslMechanismError", "IllegalSaslStateError", "SaslAuthenticationFailedError")

#: kafka-python's classes of errors that retrying cannot cure: a setting or the brokers' permissions must change.
FATAL_ERROR_NAMES = (
    "AuthorizationError",
    *AUTHENTICATION_ERROR_NAMES,
    "InvalidReplicationFactorError",
    "InvalidPartitionsError",
    "InvalidTopicError",
    "PolicyViolationError",
    "KafkaConfigurationError",  # e.g. librdkafka refusing an unreadable PEM file
    # records the client cannot decompress: every read of the partition fails alike until a package is installed
    "UnsupportedCodecError",
    "UnsupportedCompressionTypeError",
)

#: kafka-python's classes of errors of one message that sending it again cannot cure: the brokers refuse it for
#: good (larger than the topic allows, invalid).
REFUSED_ERROR_NAMES = (
    "MessageSizeTooLargeError",
    "RecordListTooLargeError",
    "InvalidRecordError",
    "CorruptRecordError",
)

#: kafka-python's classes of "this instance may no longer write for these partitions" (:class:`Fenced`): the
#: transaction coordinator gave the producer's epoch to another (ProducerFencedError; InvalidProducerEpochError,
#: which Kafka's Java client reports as the same), or the group coordinator refused the transaction's offsets of a
#: stale member or generation (KIP-447: IllegalGenerationError, UnknownMemberIdError, FencedInstanceIdError;
#: kafka-python raises those of a TxnOffsetCommit as CommitFailedError). Outside a transaction the consumer's
#: own commit may meet the last three in a rebalance: there they stay retried (:func:`service_error`).
FENCED_ERROR_NAMES = (
    "ProducerFencedError",
    "InvalidProducerEpochError",
    "CommitFailedError",
    "IllegalGenerationError",
    "UnknownMemberIdError",
    "FencedInstanceIdError",
)

#: kafka-python's classes of "the brokers answer, but the coordinator of this group (or transaction) is not ready":
#: a new cluster creates and loads __consumer_offsets at its first group (seconds), a coordinator moves to another
#: broker. Retried like any unavailability, and said as what it is: the brokers are up (outage.py).
COORDINATOR_ERROR_NAMES = ("CoordinatorNotAvailableError", "CoordinatorLoadInProgressError", "NotCoordinatorError")

#: The brokers rejected the SASL mechanism or the credentials: sasl_mechanism, sasl_username or sasl_password
#: must change; or the client rejected the brokers' certificate: ssl_cafile must change.
AUTHENTICATION_ERRORS = (*_errors(AUTHENTICATION_ERROR_NAMES), SslAuthenticationError)
#: The service stops with these instead of retrying forever.
FATAL_ERRORS: tuple[type[BaseException], ...] = (*_errors(FATAL_ERROR_NAMES), SslAuthenticationError)
REFUSED_ERRORS = _errors(REFUSED_ERROR_NAMES)
FENCED_ERRORS = _errors(FENCED_ERROR_NAMES)
COORDINATOR_ERRORS = _errors(COORDINATOR_ERROR_NAMES)

#: librdkafka's own (negative) error codes that the service tells apart, by their name in confluent_kafka's
#: KafkaError, and the kafka-python class each stands for; the brokers' (positive) codes are Kafka's, which
#: kafka-python's ``for_code`` knows.
LIBRDKAFKA_ERRORS = {
    "_TIMED_OUT": "KafkaTimeoutError",
    "_MSG_TIMED_OUT": "KafkaTimeoutError",
    "_TIMED_OUT_QUEUE": "KafkaTimeoutError",
    "_TRANSPORT": "KafkaConnectionError",
    "_ALL_BROKERS_DOWN": "KafkaConnectionError",
    "_RESOLVE": "KafkaConnectionError",
    "_WAIT_COORD": "CoordinatorNotAvailableError",
    "_UNKNOWN_TOPIC": "UnknownTopicOrPartitionError",
    "_UNKNOWN_PARTITION": "UnknownTopicOrPartitionError",
    "_INVALID_ARG": "KafkaConfigurationError",
    "_STATE": "IllegalStateError",
    "_BAD_COMPRESSION": "UnsupportedCodecError",  # a batch librdkafka cannot decompress: fatal
}

#: librdkafka's own codes that mean more in a transaction, and the kafka-python class each stands for there:
#: ``_FENCED``, its word for a fenced transactional producer (:data:`FENCED_ERRORS`). Outside a transaction
#: they keep the meaning :data:`LIBRDKAFKA_ERRORS` gives (none: a plain error, retried).
LIBRDKAFKA_TRANSACTION_ERRORS = {"_FENCED": "ProducerFencedError"}

#: The package kafka-python decompresses each codec with (what kafka/codec.py of 3.0.12 imports: ``snappy``,
#: ``lz4.frame``, ``zstandard``; gzip is in the standard library). Dependencies of the service, as crc32c is:
#: without one, kafka-python cannot read a topic its producers compressed with that codec.
CODEC_PACKAGES = {"snappy": "python-snappy", "lz4": "lz4", "zstd": "zstandard"}


def delivery_kind(error: BaseException | None) -> str:
    """What a message that was not delivered with ``error`` (a kafka-python class) is: FATAL, REFUSED or RETRY.

    >>> delivery_kind(kerrors.MessageSizeTooLargeError()), delivery_kind(kerrors.TopicAuthorizationFailedError())
    ('refused', 'fatal')
    >>> delivery_kind(kerrors.KafkaTimeoutError()), delivery_kind(None)
    ('retry', 'retry')
    """
    if isinstance(error, FATAL_ERRORS):
        return FATAL
    return REFUSED if isinstance(error, REFUSED_ERRORS) else RETRY


#: kafka-python's own prefix of a message, "[Error 7] ": the class's name says it.
_CODE_PREFIX = re.compile(r"^\[Error -?\d+\] ")


def _message(exc: BaseException) -> str:
    """The error's message without kafka-python's "[Error N] " prefix (the class's name says the code).

    >>> _message(kerrors.KafkaTimeoutError("no answer")), _message(kerrors.RequestTimedOutError())
    ('KafkaTimeoutError: no answer', 'RequestTimedOutError')
    """
    return _CODE_PREFIX.sub("", str(exc).strip())


def describe(exc: BaseException) -> str:
    """The error's class and message once (kafka-python's messages often start with the class already).

    >>> describe(kerrors.KafkaTimeoutError("no answer")), describe(ValueError("bad")), describe(kerrors.KafkaError())
    ('KafkaTimeoutError: no answer', 'ValueError: bad', 'KafkaError')
    """
    text = _message(exc)
    return text if type(exc).__name__ in text else f"{type(exc).__name__}: {text}".rstrip(": ")


def codec_hint(exc: BaseException) -> str:
    """What to do about a record batch kafka-python cannot decompress: the package its codec needs, if any.

    >>> codec_hint(kerrors.UnsupportedCodecError("Libraries for zstd compression codec not found"))
    'install zstandard (pip install zstandard), a dependency of perceptron-stream: reinstall the service'
    """
    match = re.search(r"for (\w+) compression codec", str(exc))
    package = CODEC_PACKAGES.get(match.group(1)) if match else None
    if package:
        return f"install {package} (pip install {package}), a dependency of perceptron-stream: reinstall the service"
    return "the records are compressed in a way this client cannot read: check the producers' compression.type"


def _hint(exc: BaseException, settings: KafkaSettings | None) -> str:
    """The settings a fatal error points at, in all their spellings."""

    def named(*names: str) -> str:
        return " and ".join(f"{name} ({flag(name)}, {env_var(name)})" for name in names)

    if isinstance(exc, (kerrors.UnsupportedCodecError, kerrors.UnsupportedCompressionTypeError)):
        return codec_hint(exc)
    mechanism = (
        f"SASL mechanism {settings.sasl_mechanism}"
        if settings is not None and settings.sasl_mechanism
        else "the SASL mechanism"
    )
    if isinstance(exc, (kerrors.UnsupportedSaslMechanismError, kerrors.IllegalSaslStateError)):
        return f"the brokers do not accept {mechanism}: check {named('sasl_mechanism')}"
    if isinstance(exc, kerrors.SaslAuthenticationFailedError):
        return (
            f"the brokers refused the credentials for {mechanism}: check {named('sasl_username', 'sasl_password')}, "
            f"and {named('sasl_mechanism')}"
        )
    if isinstance(exc, ClientCertificateRefused):
        return (
            f"the brokers require a client certificate signed by a CA they trust: check "
            f"{named('ssl_certfile', 'ssl_keyfile')}"
        )
    if isinstance(exc, SslAuthenticationError):
        return (
            f"the brokers' TLS certificate is not signed by a CA of {named('ssl_cafile')}, or not for the "
            f"address in {named('bootstrap_servers')}"
        )
    return "check the Kafka settings (security, credentials, ACLs, replication factor)"


@overload
def service_error(exc: BaseException, settings: KafkaSettings | None = None) -> BaseException: ...
@overload
def service_error(exc: None, settings: KafkaSettings | None = None) -> None: ...
def service_error(exc: BaseException | None, settings: KafkaSettings | None = None) -> BaseException | None:
    """The service's own error (:mod:`perceptron_stream.kafka.contract`) for one of kafka-python's; others pass through.

    The one classification of the clients' errors (confluent.py maps
    librdkafka's to kafka-python's classes first): fatal (FATAL_ERRORS: a
    setting or a permission must change; REFUSED_ERRORS: a record its topic
    will never take, where a caller met it as an error rather than as a
    refused delivery), or unavailable (wait and retry).
    """
    if exc is None or isinstance(exc, (KafkaFatal, KafkaUnavailable)) or not isinstance(exc, KafkaError):
        return exc
    text = _message(exc)
    text = text if text.startswith(exc.__class__.__name__) else f"{exc.__class__.__name__}: {text}".rstrip(": ")
    # kafka-python names a rejection's class twice ("SaslAuthenticationFailedError: SaslAuthenticationFailedError: ...")
    text = text.replace(f"{exc.__class__.__name__}: {exc.__class__.__name__}: ", f"{exc.__class__.__name__}: ", 1)
    text = text.rstrip(":")  # kafka-python ends some with one: "FindCoordinatorResponse error for GROUP/g1:"
    if isinstance(exc, FATAL_ERRORS):
        return KafkaFatal(text, _hint(exc, settings))
    if isinstance(exc, REFUSED_ERRORS):  # a write of one record that no retry can get through: never "no answer"
        return KafkaFatal(
            text,
            "the brokers refuse the record for good: larger than its topic's max.message.bytes (raise it), or "
            "without a key on a compacted topic",
        )
    return KafkaUnavailable(  # a connection refused or lost is no answer either: the brokers away, as a timeout says
        text,
        timed_out=isinstance(exc, (kerrors.KafkaTimeoutError, kerrors.KafkaConnectionError)),
        coordinator=isinstance(exc, COORDINATOR_ERRORS),
    )


def transaction_error(
    exc: BaseException | None, settings: KafkaSettings | None = None, *, producer_broken: bool = False
) -> BaseException:
    """The service's error for what a transaction met (a kafka-python class; confluent.py maps librdkafka's first),
    after which the transaction was aborted where the client allowed:

    - :class:`Fenced` for :data:`FENCED_ERRORS`: stop, another instance owns the partitions;
    - :class:`KafkaFatal` for :data:`FATAL_ERRORS` (e.g. no permission on the transactional id) and for an error
      the client calls fatal to its producer (``producer_broken``: librdkafka's ``fatal()``);
    - :class:`Aborted` for anything else (a delivery that failed, a coordinator away, a timeout): retried, the
      span read again in a new transaction.

    >>> [type(transaction_error(e)).__name__ for e in (kerrors.ProducerFencedError(), kerrors.CommitFailedError(),
    ...  kerrors.TransactionalIdAuthorizationFailedError(), kerrors.KafkaTimeoutError(), DeliveryError("late"))]
    ['Fenced', 'Fenced', 'KafkaFatal', 'Aborted', 'Aborted']
    """
    if isinstance(exc, (KafkaFatal, Aborted)):
        return exc
    if isinstance(exc, FENCED_ERRORS):
        return Fenced(describe(exc))
    error = service_error(exc, settings) if isinstance(exc, KafkaError) else exc
    if isinstance(error, KafkaFatal):
        return error
    if producer_broken:
        return KafkaFatal(
            describe(exc) if exc is not None else "no answer",
            "the client's transactional producer failed for good: restart the instance",
        )
    return Aborted(
        f"transaction aborted: {describe(error) if error is not None else 'no answer'}",
        timed_out=getattr(error, "timed_out", False),
    )


def translated(
    function: Callable, foreign: Mapping[type[BaseException], Callable[[BaseException], KafkaError]] | None = None
) -> Callable:
    """Raise what ``function``'s client calls raised as the service's errors (settings from its arguments).

    The one translation of both clients: kafka-python's errors go to :func:`service_error` as they are; another
    client's exceptions (``foreign``: their type → kafka-python's error for one, confluent.py's for librdkafka's
    KafkaException) are mapped to kafka-python's classes first. The settings are the first
    :class:`KafkaSettings` argument, else the ``settings`` of the first argument (a method's ``self``).
    """
    foreign = dict(foreign or {})
    kinds = tuple(foreign)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except (KafkaError, *kinds) as exc:
            settings = next(
                (a for a in args if isinstance(a, KafkaSettings)), getattr(args[0], "settings", None) if args else None
            )
            error = (
                exc if isinstance(exc, KafkaError) else next(f for k, f in foreign.items() if isinstance(exc, k))(exc)
            )
            raise service_error(error, settings) from exc

    return wrapper
