"""The error vocabulary (service/kafka/errors.py) names what the installed clients define, and means one thing.

An upgrade of kafka-python or confluent-kafka that renames a class or a code
the vocabulary lists fails here, instead of quietly turning a fatal error
into an endless retry (the lists skip a name the client lacks).
"""

from __future__ import annotations

import kafka.errors as kerrors
import pytest
from perceptron_stream.kafka import (
    Aborted,
    DeliveryError,
    Fenced,
    KafkaFatal,
    KafkaUnavailable,
    MissingTopicError,
    errors,
)
from perceptron_stream.kafka.errors import FATAL, REFUSED, RETRY, delivery_kind, service_error, transaction_error


@pytest.mark.parametrize(
    "name",
    sorted(
        {
            *errors.FATAL_ERROR_NAMES,
            *errors.REFUSED_ERROR_NAMES,
            *errors.AUTHENTICATION_ERROR_NAMES,
            *errors.LIBRDKAFKA_ERRORS.values(),
            *errors.FENCED_ERROR_NAMES,
            *errors.COORDINATOR_ERROR_NAMES,
            *errors.LIBRDKAFKA_TRANSACTION_ERRORS.values(),
        }
    ),
)
def test_every_kafka_python_class_named_exists(name):
    assert issubclass(getattr(kerrors, name), kerrors.KafkaError)


@pytest.mark.parametrize("code", sorted({*errors.LIBRDKAFKA_ERRORS, *errors.LIBRDKAFKA_TRANSACTION_ERRORS}))
def test_every_librdkafka_code_named_exists(code):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    assert getattr(confluent_kafka.KafkaError, code) < 0  # librdkafka's own codes are negative


def test_the_lists_hold_every_class_they_name():
    assert len(errors.FATAL_ERRORS) == len(errors.FATAL_ERROR_NAMES) + 1  # and SslAuthenticationError
    assert len(errors.REFUSED_ERRORS) == len(errors.REFUSED_ERROR_NAMES)
    assert len(errors.AUTHENTICATION_ERRORS) == len(errors.AUTHENTICATION_ERROR_NAMES) + 1
    assert not set(errors.FATAL_ERRORS) & set(errors.REFUSED_ERRORS)
    assert len(errors.FENCED_ERRORS) == len(errors.FENCED_ERROR_NAMES)
    assert not set(errors.FENCED_ERRORS) & {*errors.FATAL_ERRORS, *errors.REFUSED_ERRORS}
    assert len(errors.COORDINATOR_ERRORS) == len(errors.COORDINATOR_ERROR_NAMES)
    assert not set(errors.COORDINATOR_ERRORS) & {*errors.FATAL_ERRORS, *errors.REFUSED_ERRORS, *errors.FENCED_ERRORS}


@pytest.mark.parametrize(
    "error, kind",
    [
        (kerrors.TopicAuthorizationFailedError(), FATAL),
        (kerrors.SaslAuthenticationFailedError("bad password"), FATAL),
        (errors.ClientCertificateRefused("alert 42"), FATAL),
        (kerrors.UnsupportedCodecError("Libraries for lz4 compression codec not found"), FATAL),
        (kerrors.MessageSizeTooLargeError(), REFUSED),
        (kerrors.CorruptRecordError(), REFUSED),
        (kerrors.KafkaTimeoutError("Expiring 1 record(s)"), RETRY),
        (kerrors.NotLeaderForPartitionError(), RETRY),
        (None, RETRY),
    ],
)
def test_a_delivery_error_is_fatal_refused_or_retried(error, kind):
    assert delivery_kind(error) == kind


def test_client_errors_leave_as_the_services_own():
    fatal = service_error(kerrors.TopicAuthorizationFailedError("no write on out"))
    assert isinstance(fatal, KafkaFatal) and "TopicAuthorizationFailedError" in str(fatal) and "ACLs" in fatal.hint
    away = service_error(kerrors.KafkaTimeoutError("no answer"))
    assert isinstance(away, KafkaUnavailable) and away.timed_out
    busy = service_error(kerrors.RebalanceInProgressError())
    assert isinstance(busy, KafkaUnavailable) and not busy.timed_out and not busy.coordinator
    loading = service_error(kerrors.CoordinatorNotAvailableError("FindCoordinatorResponse error for GROUP/g1"))
    assert isinstance(loading, KafkaUnavailable) and loading.coordinator and not loading.timed_out
    assert str(service_error(kerrors.CoordinatorNotAvailableError("error for GROUP/g1:"))).endswith("GROUP/g1")
    assert not away.coordinator
    own = DeliveryError("2 message(s) not acknowledged")
    assert service_error(own) is own and service_error(None) is None
    assert issubclass(MissingTopicError, KafkaFatal)


@pytest.mark.parametrize(
    "error",
    [
        kerrors.ProducerFencedError(),
        kerrors.InvalidProducerEpochError(),
        kerrors.IllegalGenerationError(),
        kerrors.UnknownMemberIdError(),
        kerrors.FencedInstanceIdError(),
        kerrors.CommitFailedError("Transaction offset commit failed due to consumer group metadata mismatch"),
    ],
)
def test_a_fenced_transaction_stops_the_instance(error):
    fenced = transaction_error(error)
    assert isinstance(fenced, Fenced) and isinstance(fenced, KafkaFatal)
    assert type(error).__name__ in str(fenced) and "restart" in fenced.hint


def test_a_transactions_other_errors_are_fatal_or_abort_it_for_a_retry():
    denied = transaction_error(kerrors.TransactionalIdAuthorizationFailedError("tx-1"))
    assert type(denied) is KafkaFatal and "ACLs" in denied.hint
    broken = transaction_error(kerrors.KafkaError("Unexpected error"), producer_broken=True)
    assert type(broken) is KafkaFatal and "restart" in broken.hint
    for error in (
        kerrors.KafkaTimeoutError("no answer"),
        kerrors.CoordinatorNotAvailableError(),
        DeliveryError("late", timed_out=True),
        None,
    ):
        aborted = transaction_error(error)
        assert (
            isinstance(aborted, Aborted)
            and isinstance(aborted, KafkaUnavailable)
            and "transaction aborted" in str(aborted)
        )
    timed_out, not_coordinator = (
        transaction_error(kerrors.KafkaTimeoutError()),
        transaction_error(kerrors.NotCoordinatorError()),
    )
    assert isinstance(timed_out, Aborted) and isinstance(not_coordinator, Aborted)
    assert timed_out.timed_out and not not_coordinator.timed_out


def test_outside_a_transaction_a_stale_generation_stays_retried():
    """The consumer's own commit meets these in a rebalance: the at-least-once path retries them, as before."""
    for error in (kerrors.CommitFailedError(), kerrors.IllegalGenerationError(), kerrors.UnknownMemberIdError()):
        assert type(service_error(error)) is KafkaUnavailable
