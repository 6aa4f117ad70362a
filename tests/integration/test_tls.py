"""Kafka over TLS, end to end: the real service (``--security-protocol SSL``) on Apache Kafka's TLS listeners,
with either client.

The run's Apache Kafka (``apache_kafka``) listens on ``SSL`` (server
certificate only) and ``MTLS`` (a client certificate signed by the test CA
required, ``ssl.client.auth=required``), with the certificates of
:mod:`tests.support.pki` (its client key is encrypted: ``ssl_password``).
Each listener speaks TLS only, so a service that publishes its predictions
and checkpoints there spoke TLS for all of it. The embedded broker has no TLS
(Tansu 0.6 accepts ``--cert``/``--key`` and still reads a ClientHello as a
Kafka request): these tests need Apache Kafka, and test the service, not a
proxy in front of a broker.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from perceptron_stream.broker import free_port

from tests.support.endpoints import http_get
from tests.support.launch import settings_args, start_service_process
from tests.support.pki import KEY_PASSWORD, Pki
from tests.support.service import (
    check_outputs,
    has_traceback,
    make_events,
    offline,
    stop_process,
    tail,
    without_close_noise,
)
from tests.support.streams import open_test_stream
from tests.support.waiting import wait_until

CLIENTS = ["kafka-python", "confluent"]


# clients of the test ---------------------------------------------------------
def tls_options(pki: Pki, mutual: bool) -> dict:
    """kafka-python options of a TLS client of the test (default host name check kept)."""
    options = {"security_protocol": "SSL", "ssl_cafile": str(pki.ca)}
    if mutual:
        options.update(ssl_certfile=str(pki.client_cert), ssl_keyfile=str(pki.client_key), ssl_password=KEY_PASSWORD)
    return options


def tls_args(pki: Pki, mutual: bool, ca: Path | None = None) -> dict:
    """The service's flags for the same (``settings_args`` spelling)."""
    args = {"security_protocol": "SSL", "ssl_cafile": str(ca or pki.ca)}
    if mutual:
        args.update(ssl_certfile=str(pki.client_cert), ssl_keyfile=str(pki.client_key), ssl_password=KEY_PASSWORD)
    return args


class Listener:
    """One TLS listener of the run's Apache Kafka, as ``settings_args`` takes a broker."""

    def __init__(self, apache_kafka, name: str):
        self.name, self.bootstrap_servers = name, apache_kafka.address(name)


def produce_tls(bootstrap: str, options: dict, topic: str, events: list[dict], keys: list[bytes]) -> None:
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, **options)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, **options)
    try:
        for event, key in zip(events, keys):
            producer.send(topic, key=key, value=json.dumps(event).encode())
        producer.flush(30)
    finally:
        producer.close()


def read_outputs_tls(bootstrap: str, options: dict, topic: str, count: int, process, log_path: Path):
    """Outputs of one-partition ``topic`` read from its start until ``count`` offsets are predicted:
    (input offset -> values, input offset -> keys), as check_outputs takes them."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, request_timeout_ms=10_000, **options
    )
    by_source: dict[int, list[bytes]] = {}
    keys: dict[int, list[bytes | None]] = {}
    try:
        wait_until(
            lambda: consumer.partitions_for_topic(topic) or process.poll() is not None,
            60,
            what=f"the service to create {topic}",
        )
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        deadline = time.monotonic() + 60
        while len(by_source) < count and time.monotonic() < deadline and process.poll() is None:
            for messages in consumer.poll(timeout_ms=200).values():
                for m in messages:
                    offset = json.loads(m.value)["source"]["offset"]
                    by_source.setdefault(offset, []).append(m.value)
                    keys.setdefault(offset, []).append(m.key)
        assert len(by_source) >= count, f"{len(by_source)} of {count} predictions read through TLS:\n{tail(log_path)}"
    finally:
        consumer.close()
    return by_source, keys


#: Lines that say nothing went wrong with TLS or the service: the metadata refresh the kafka store's reader
#: cancels when it closes its consumer; the network thread's wall-clock check of its own steps
#: (``slow_task_threshold_secs``, 0.1 s), which fires whenever the machine or the GIL is busy for that long; the
#: group leader's first assignment made before its metadata of the topic created moments earlier arrived (under
#: load): it assigns nothing, the metadata's arrival rejoins and assigns the partition (CI, 2026-11-27).
KAFKA_PYTHON_NOISE = (
    "kafka.cluster: Metadata refresh: failed Cancelled",
    "(>0.100s threshold). It is blocking the event loop",
    "kafka.coordinator.assignors.range: No partition metadata for topic ",
)
#: An Apache Kafka that no group has used yet creates __consumer_offsets at the first group's first request and
#: meanwhile answers "no coordinator", "not the coordinator" or "coordinator loading": the service retries (the
#: first tests of a run see it), no TLS trouble.
COORDINATOR_NOT_YET = re.compile(
    r"could not read the group's committed offsets: "
    r"(CoordinatorNotAvailableError|NotCoordinatorError|CoordinatorLoadInProgressError)"
)


def serve_failure(args: list[str], tmp_path: Path) -> tuple[int, str]:
    """`serve` that must stop at start-up: its exit code and output (after 60 s it is killed, and the test fails)."""
    log_path = tmp_path / "serve.log"
    process = start_service_process(args, log_path)
    try:
        code = process.wait(timeout=60)
    except Exception:
        process.kill()
        process.wait()
        pytest.fail("serve is still retrying after 60 s:\n" + tail(log_path))
    return code, log_path.read_text()


# the tests ---------------------------------------------------------------------
@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize(
    "listener, mutual", [("SSL", False), ("MTLS", True)], ids=["server-auth", "mutual-tls-encrypted-key"]
)
def test_service_over_tls_publishes_the_offline_learners_predictions(
    apache_kafka, topics, tmp_path, client, listener, mutual
):
    pki, tls = apache_kafka.pki, Listener(apache_kafka, listener)
    options = tls_options(pki, mutual)
    events = make_events(300, seed=31)
    keys = [e["id"].encode() for e in events]
    expected, model = offline(events)
    produce_tls(tls.bootstrap_servers, options, topics["input_topic"], events, keys)
    port = free_port()
    args = settings_args(
        tls,
        topics,
        tmp_path,
        metrics_port=port,
        state_store="kafka",
        kafka_client=client,
        checkpoint_topic=f"ckpt-{topics['group_id']}",
        **tls_args(pki, mutual),
    )
    log_path = tmp_path / "serve.log"
    process = start_service_process(args, log_path)
    try:
        by_source, out_keys = read_outputs_tls(
            tls.bootstrap_servers, options, topics["output_topic"], len(events), process, log_path
        )
        status, body = http_get(f"http://127.0.0.1:{port}/readyz")
        assert status == 200, body
    finally:
        code = stop_process(process, log_path)
    assert code == 0, tail(log_path)
    check_outputs(by_source, expected, input_topic=topics["input_topic"], keys=out_keys, input_keys=keys)
    log = log_path.read_text()
    assert not has_traceback(log), tail(log_path)
    troubles = [
        line
        for line in without_close_noise(log).splitlines()
        if (" WARNING " in line or " ERROR " in line)
        and not any(noise in line for noise in KAFKA_PYTHON_NOISE)
        and not COORDINATOR_NOT_YET.search(line)
    ]
    assert not troubles, tail(log_path)
    # the final checkpoint went through TLS too, into the compacted topic: the model of the offline run
    from perceptron_stream.config import ServeSettings, load
    from perceptron_stream.kafka import CompactedTopic
    from perceptron_stream.state.kafka_store import KafkaStore

    settings = load(ServeSettings, args)
    store = KafkaStore(CompactedTopic(settings, settings.checkpoint_topic), settings.group_id)
    try:
        checkpoint = store.load("model")
    finally:
        store.close()
    assert checkpoint is not None
    assert checkpoint.model == model and checkpoint.positions == {(topics["input_topic"], 0): len(events)}


def test_the_mutual_tls_listener_turns_away_a_client_without_a_certificate(apache_kafka):
    """The MTLS listener of the tests really requires the certificate the service presented above."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    with pytest.raises(KafkaError):
        KafkaAdminClient(
            bootstrap_servers=apache_kafka.address("MTLS"),
            request_timeout_ms=5000,
            bootstrap_timeout_ms=5000,
            **tls_options(apache_kafka.pki, mutual=False),
        ).close()
    KafkaAdminClient(
        bootstrap_servers=apache_kafka.address("MTLS"),
        request_timeout_ms=5000,
        **tls_options(apache_kafka.pki, mutual=True),
    ).close()


#: (listener, the service's TLS flags from the PKI, the error, the service's verdict): what retrying cannot cure
REFUSALS = {
    "broker-certificate-of-another-ca": (
        "SSL",
        lambda pki: tls_args(pki, False, ca=pki.other_ca),
        "SslAuthenticationError",
        "SslAuthenticationError: the brokers' certificate did not verify: unable to get local issuer certificate; "
        "retrying cannot help: the brokers' TLS certificate is not signed by a CA of ssl_cafile (--ssl-cafile, "
        "PERCEPTRON_STREAM_SSL_CAFILE)",
    ),
    "no-client-certificate-for-mutual-tls": (
        "MTLS",
        lambda pki: tls_args(pki, False),
        "ClientCertificateRefused",
        "ClientCertificateRefused: the brokers refused the client's certificate: SSLV3_ALERT_BAD_CERTIFICATE; retrying "
        "cannot help: the brokers require a client certificate signed by a CA they trust: check ssl_certfile "
        "(--ssl-certfile, PERCEPTRON_STREAM_SSL_CERTFILE) and ssl_keyfile (--ssl-keyfile, PERCEPTRON_STREAM_SSL_KEYFILE)",
    ),
}


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("refusal", list(REFUSALS))
def test_a_tls_refusal_stops_serve_at_start_up_naming_the_setting(apache_kafka, topics, tmp_path, client, refusal):
    """Retrying a certificate that did not verify, or that the brokers refused, cannot help (Kafka's Java client
    gives up too: SslAuthenticationException): exit 1 at start-up, the message naming the setting, no traceback."""
    listener, flags, _, verdict = REFUSALS[refusal]
    args = settings_args(
        Listener(apache_kafka, listener), topics, tmp_path, kafka_client=client, **flags(apache_kafka.pki)
    )
    code, output = serve_failure(args, tmp_path)
    assert code == 1, output[-3000:]
    assert f"perceptron-stream serve: could not check the topics: {verdict}" in output, output[-3000:]
    assert not re.search(r'File "[^"]*/service/', output), output[
        -3000:
    ]  # no traceback through the service (kafka-python
    # logs the refused read's with its own: "Error receiving network data closing socket")


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("refusal", list(REFUSALS))
def test_the_stream_raises_a_tls_refusal(apache_kafka, topics, client, refusal):
    """The poll loop's stream meets them too (brokers that change certificates while the service runs): raised
    as the service's fatal error, naming the setting, with either client (kafka-python's when it bootstraps,
    librdkafka's from poll: it reports them to error_cb only, and tries again forever)."""
    from perceptron_stream.config import KafkaSettings
    from perceptron_stream.kafka import KafkaFatal

    listener, flags, error, verdict = REFUSALS[refusal]
    settings = KafkaSettings(bootstrap_servers=apache_kafka.address(listener), **flags(apache_kafka.pki))
    io = None
    try:
        deadline = time.monotonic() + 30
        with pytest.raises(KafkaFatal, match=f"^{error}: ") as raised:
            io = open_test_stream(settings, client, topics)
            while time.monotonic() < deadline:
                io.poll(200, 10)
        assert raised.value.hint.startswith(
            verdict.split("retrying cannot help: ")[1]
        )  # the same settings, either client
    finally:
        if io is not None:
            io.close()
