"""SASL/SCRAM, end to end on Apache Kafka: the service on its SASL_PLAINTEXT and SASL_SSL listeners with
either client, and brokers that reject the mechanism or the credentials stopping it at start-up, naming the
setting.

The run's Apache Kafka (``apache_kafka``) enables SCRAM-SHA-256 and
SCRAM-SHA-512 for :data:`~tests.support.apache_kafka.SCRAM_USER`; the
embedded broker has no SASL. The test's own clients write and read on the
PLAINTEXT listener of the same broker: the topics are the same, whatever the
listener.

kafka-python 3.0 retried such a rejection until its bootstrap timeout and
then reported "Unable to bootstrap", as for brokers that are away; librdkafka
reports it to ``error_cb`` only, and tries again forever: both are the
service's work-arounds (perceptron_stream.kafka), checked here against the real broker.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest
from kafka.errors import SaslAuthenticationFailedError, UnsupportedSaslMechanismError
from perceptron_stream.broker import free_port
from perceptron_stream.config import KafkaSettings, ServeSettings, load
from perceptron_stream.kafka import KafkaFatal

from tests.support.apache_kafka import SCRAM_PASSWORD, SCRAM_USER
from tests.support.endpoints import http_get
from tests.support.launch import start_service_process
from tests.support.service import has_traceback, stop_process, tail
from tests.support.streams import open_test_stream
from tests.support.topics import consume, produce

CLIENTS = ["kafka-python", "confluent"]
#: (listener, mechanism): each SCRAM mechanism once, each SASL listener once
LISTENERS = [("SASL_PLAINTEXT", "SCRAM-SHA-256"), ("SASL_SSL", "SCRAM-SHA-512")]


def sasl_flags(apache_kafka, listener: str, mechanism: str, password: str = SCRAM_PASSWORD) -> list[str]:
    flags = [
        "--bootstrap-servers",
        apache_kafka.address(listener),
        "--security-protocol",
        listener,
        "--sasl-mechanism",
        mechanism,
        "--sasl-username",
        SCRAM_USER,
        "--sasl-password",
        password,
    ]
    if listener == "SASL_SSL":
        flags += ["--ssl-cafile", str(apache_kafka.pki.ca)]
    return flags


def topic_flags(topics: dict) -> list[str]:
    return [arg for name, value in topics.items() for arg in (f"--{name.replace('_', '-')}", value)]


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("listener, mechanism", LISTENERS)
def test_service_over_sasl_scram_predicts_every_event(apache_kafka, topics, tmp_path, client, listener, mechanism):
    events = [{"id": f"e{i}", "x": [1.0, float(i % 7) - 3.0], "y": 1 if i % 2 else -1} for i in range(200)]
    produce(apache_kafka.bootstrap_servers, topics["input_topic"], events)
    port, log_path = free_port(), tmp_path / "serve.log"
    process = start_service_process(
        [
            *sasl_flags(apache_kafka, listener, mechanism),
            *topic_flags(topics),
            "--kafka-client",
            client,
            "--metrics-port",
            str(port),
            "--state-dir",
            str(tmp_path / "state"),
            "--poll-timeout-ms",
            "100",
        ],
        log_path,
    )
    try:
        outputs = consume(apache_kafka.bootstrap_servers, topics["output_topic"], len(events))
        assert http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200
    finally:
        code = stop_process(process, log_path)
    assert code == 0 and not has_traceback(log_path.read_text()), tail(log_path)
    assert sorted(json.loads(m.value)["source"]["offset"] for m in outputs[: len(events)]) == list(range(len(events)))


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(
    "mechanism, password, error, names",
    [
        (
            "PLAIN",
            SCRAM_PASSWORD,
            UnsupportedSaslMechanismError,
            [
                "the brokers do not accept SASL mechanism PLAIN: check sasl_mechanism (--sasl-mechanism, PERCEPTRON_STREAM_SASL_MECHANISM)"
            ],
        ),
        (
            "SCRAM-SHA-256",
            "a wrong password",
            SaslAuthenticationFailedError,
            [
                "the brokers refused the credentials for SASL mechanism SCRAM-SHA-256: check sasl_username (--sasl-username, "
                "PERCEPTRON_STREAM_SASL_USERNAME) and sasl_password (--sasl-password, PERCEPTRON_STREAM_SASL_PASSWORD)"
            ],
        ),
    ],
    ids=["mechanism", "credentials"],
)
def test_a_sasl_rejection_stops_serve_with_exit_1_naming_the_setting(
    apache_kafka, topics, tmp_path, client, mechanism, password, error, names
):
    log_path = tmp_path / "serve.log"
    process = start_service_process(
        [
            *sasl_flags(apache_kafka, "SASL_PLAINTEXT", mechanism, password),
            *topic_flags(topics),
            "--kafka-client",
            client,
            "--metrics-port",
            "0",
            "--state-dir",
            str(tmp_path / "state"),
        ],
        log_path,
    )
    try:
        code = process.wait(timeout=60)  # one attempt takes about a second; before, it never ended
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail("serve is still retrying after 60 s:\n" + tail(log_path))
    output = log_path.read_text()
    assert code == 1, output[-3000:]
    assert f"perceptron-stream serve: could not check the topics: {error.__name__}" in output, output[-3000:]
    assert "retrying cannot help" in output and all(name in output for name in names), output[-3000:]
    (verdict,) = [line for line in output.splitlines() if line.startswith("perceptron-stream serve:")]
    assert f"{error.__name__}: {error.__name__}" not in verdict  # kafka-python's doubled class name is trimmed
    assert password not in output  # the password is never logged
    assert "Traceback" not in output


@pytest.mark.parametrize(
    "mechanism, password, error, says",
    [
        (
            "PLAIN",
            SCRAM_PASSWORD,
            UnsupportedSaslMechanismError,
            "Unsupported SASL mechanism: broker's supported mechanisms: SCRAM-SHA-",
        ),
        (
            "SCRAM-SHA-512",
            "a wrong password",
            SaslAuthenticationFailedError,
            "Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512",
        ),
    ],
    ids=["mechanism", "credentials"],
)
def test_the_confluent_stream_raises_what_librdkafka_only_reports(
    apache_kafka, topics, mechanism, password, error, says
):
    """librdkafka reports the rejection to error_cb (code _AUTHENTICATION, neither fatal nor retriable) and tries
    again forever; the stream raises it from poll. (At start-up the service meets it earlier: topics are set up
    with kafka-python whichever client runs the loop.)"""
    settings = KafkaSettings(
        bootstrap_servers=apache_kafka.address("SASL_PLAINTEXT"),
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism=mechanism,
        sasl_username=SCRAM_USER,
        sasl_password=password,
    )
    io = open_test_stream(settings, "confluent", topics)
    try:
        deadline = time.monotonic() + 30
        with pytest.raises(
            KafkaFatal, match=f"{error.__name__}: .*{re.escape(says)}"
        ):  # translated: the service's own error
            while time.monotonic() < deadline:
                io.poll(200, 10)
    finally:
        io.close()


SASL = [
    "--security-protocol",
    "SASL_PLAINTEXT",
    "--sasl-mechanism",
    "SCRAM-SHA-256",
    "--sasl-username",
    "u",
    "--sasl-password",
    "p",
]


@pytest.mark.parametrize(
    "error, names",
    [
        (
            UnsupportedSaslMechanismError(),
            ["SASL mechanism SCRAM-SHA-256", "sasl_mechanism (--sasl-mechanism, PERCEPTRON_STREAM_SASL_MECHANISM)"],
        ),
        (
            SaslAuthenticationFailedError("bad password"),
            ["sasl_username (--sasl-username", "sasl_password (--sasl-password"],
        ),
    ],
)
def test_the_message_names_the_settings_to_check(error, names):
    from perceptron_stream.kafka.errors import service_error
    from perceptron_stream.runtime.retry import fatal

    message = str(fatal(service_error(error, load(ServeSettings, SASL)), "reach the brokers"))
    assert message.startswith(f"could not reach the brokers: {error.__class__.__name__}") and all(
        n in message for n in names
    )
