"""What perceptron_stream.kafka.confluent translates, without a broker: librdkafka's errors into the service's, and the
settings into librdkafka's names.

The client against a running broker is tests/integration/test_confluent.py's.
"""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError as CKafkaError
from confluent_kafka import KafkaException
from kafka import errors as kerrors
from perceptron_stream.config import KafkaSettings
from perceptron_stream.kafka import KafkaFatal, KafkaUnavailable, confluent
from perceptron_stream.kafka.confluent import client_config, kafka_error
from perceptron_stream.kafka.errors import FENCED_ERRORS


def test_confluent_errors_are_classified_as_kafka_pythons_then_leave_as_the_services():
    assert isinstance(kafka_error(CKafkaError(27)), kerrors.RebalanceInProgressError)
    assert isinstance(kafka_error(CKafkaError(CKafkaError._TIMED_OUT)), kerrors.KafkaTimeoutError)  # noqa: SLF001 — librdkafka's public local error code
    assert isinstance(kafka_error(CKafkaError(CKafkaError._TRANSPORT)), kerrors.KafkaConnectionError)  # noqa: SLF001 — librdkafka's public local error code
    assert isinstance(kafka_error(CKafkaError(10)), kerrors.MessageSizeTooLargeError)
    assert type(kafka_error(CKafkaError(CKafkaError._FENCED))) is kerrors.KafkaError  # noqa: SLF001 — librdkafka's public local error code
    assert isinstance(kafka_error(CKafkaError(29)), kerrors.TopicAuthorizationFailedError)

    class Stream:
        settings = None

        @confluent._translated  # noqa: SLF001 — the translation ConfluentIO's methods wear: only a failing broker reaches it
        def failing(self, code):
            raise KafkaException(CKafkaError(code))

    with pytest.raises(KafkaUnavailable, match="IllegalStateError") as info:
        Stream().failing(CKafkaError._STATE)  # noqa: SLF001 — librdkafka's public local error code
    assert isinstance(info.value.__cause__, KafkaException)
    with pytest.raises(KafkaFatal, match="TopicAuthorizationFailedError"):
        Stream().failing(29)
    with pytest.raises(KafkaFatal, match="UnsupportedCodecError") as codec:  # a batch librdkafka cannot decompress
        Stream().failing(CKafkaError._BAD_COMPRESSION)  # noqa: SLF001 — librdkafka's public local error code
    assert "compression.type" in codec.value.hint


def test_security_settings_in_librdkafka_names(tmp_path):
    for name in ("ca.pem", "cert.pem", "key.pem"):
        (tmp_path / name).write_text("-")
    settings = KafkaSettings(
        bootstrap_servers="h1:9093,h2:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="user",
        sasl_password="secret",
        ssl_cafile=tmp_path / "ca.pem",
        ssl_certfile=tmp_path / "cert.pem",
        ssl_keyfile=tmp_path / "key.pem",
        ssl_password="kp",
    )
    assert client_config(settings) == {
        "bootstrap.servers": "h1:9093,h2:9093",
        "security.protocol": "sasl_ssl",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "user",
        "sasl.password": "secret",
        "ssl.ca.location": str(tmp_path / "ca.pem"),
        "ssl.certificate.location": str(tmp_path / "cert.pem"),
        "ssl.key.location": str(tmp_path / "key.pem"),
        "ssl.key.password": "kp",
    }
    from confluent_kafka import Producer

    plain = KafkaSettings(
        bootstrap_servers="127.0.0.1:1",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_username="user",
        sasl_password="secret",
    )
    Producer(client_config(plain))  # librdkafka knows every name (it refuses unknown ones here)


@pytest.mark.parametrize(
    "code",
    [
        "_FENCED",
        "PRODUCER_FENCED",
        "INVALID_PRODUCER_EPOCH",
        "ILLEGAL_GENERATION",
        "UNKNOWN_MEMBER_ID",
        "FENCED_INSTANCE_ID",
    ],
)
def test_librdkafkas_fenced_codes_are_fenced_in_a_transaction(code):
    assert isinstance(kafka_error(CKafkaError(getattr(CKafkaError, code)), in_transaction=True), FENCED_ERRORS)
