"""Kafka over TLS, end to end: the real service (``--security-protocol SSL``)
against a broker it can only reach through TLS.

The embedded broker (Tansu 0.6) speaks plaintext only: its ``--cert`` and
``--key`` flags are accepted but its listener still reads a TLS ClientHello
as a Kafka request. So a TLS terminator sits in front of it:

    client --TLS--> TlsTerminator (127.0.0.1:TLS_PORT) --plaintext--> Tansu (127.0.0.1:PRIVATE_PORT)

Tansu listens on the private port and ADVERTISES the terminator's port, so
the metadata sends every client back through TLS: nothing but the
terminator ever learns the private port. The certificates are made at test
time with the openssl command line: a throwaway CA, a server certificate, a
client certificate whose private key is encrypted (mutual TLS), and a second
CA that signed none of them.

The server certificate names IP 127.0.0.1 (subjectAltName IP:127.0.0.1):
kafka-python checks the host name by default (``ssl_check_hostname``), and
after bootstrapping it connects to the host the metadata advertises, here
the IP. A certificate for ``localhost`` only fails there ("IP address
mismatch, certificate is not valid for '127.0.0.1'") even when the
bootstrap address is ``localhost:PORT``. Python sends no SNI for an IP
address; the terminator needs none.
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.broker import EmbeddedBroker, free_port
from tests.conftest import http_get, settings_args, start_service_process, wait_until
from tests.integration.test_crash import (
    check_outputs,
    has_traceback,
    make_events,
    offline,
    stop_process,
    tail,
    without_close_noise,
)

pytestmark = pytest.mark.integration

KEY_PASSWORD = "a pass phrase for the client key"


# certificates ---------------------------------------------------------------
@dataclass(frozen=True)
class Pki:
    ca: Path  # signed the server and client certificates
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path  # encrypted with KEY_PASSWORD
    other_ca: Path  # a CA that signed nothing here


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"openssl {' '.join(args)}:\n{result.stderr}"


def _ca(directory: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN=perceptron-stream test {name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)


def _signed(directory: Path, name: str, subject: str, extensions: str, key_password: str | None = None) -> None:
    key = ["-passout", f"pass:{key_password}"] if key_password else ["-nodes"]
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", *key, "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", subject, cwd=directory)
    (directory / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=directory)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    _ca(d, "ca")
    _ca(d, "other-ca")
    _signed(d, "server", "/CN=localhost",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    _signed(d, "client", "/CN=perceptron-stream",
            "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n", key_password=KEY_PASSWORD)
    assert (d / "client.key").read_text().startswith("-----BEGIN ENCRYPTED PRIVATE KEY-----")
    return Pki(d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem", d / "client.key", d / "other-ca.pem")


# the TLS terminator -----------------------------------------------------------
class TlsTerminator:
    """Accepts TLS on 127.0.0.1 and forwards the bytes both ways to a plaintext ``upstream``.

    An asyncio loop in a thread of its own. With ``client_ca`` it requires a
    client certificate signed by that CA (mutual TLS). Each handshake is run
    here (``loop.start_tls`` on the accepted connection) so that one that
    fails is recorded with its reason in ``failures`` (asyncio's own TLS
    server drops those silently outside debug mode), never raised.
    """

    def __init__(self, certfile: Path, keyfile: Path, upstream: tuple[str, int], client_ca: Path | None = None):
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(certfile, keyfile)
        if client_ca is not None:
            self.context.verify_mode = ssl.CERT_REQUIRED
            self.context.load_verify_locations(client_ca)
        self.upstream = upstream
        self.host, self.port = "127.0.0.1", 0
        self.connections = 0  # TLS sessions established and forwarded to the broker
        self.client_subjects: set[str] = set()  # common names of the client certificates presented
        self.failures: list[str] = []  # handshakes that failed, and why
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task] = set()
        self._transports: set[asyncio.BaseTransport] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tls-terminator", daemon=True)

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> TlsTerminator:
        sock = socket.create_server((self.host, 0))
        self.port = sock.getsockname()[1]
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._loop.create_server(self._accepted, sock=sock), self._loop).result(10)
        return self

    def _accepted(self) -> asyncio.Protocol:
        terminator = self

        class Held(asyncio.Protocol):  # the plain connection, not read until its TLS handshake
            def connection_made(self, transport):
                transport.pause_reading()  # before its first read: the ClientHello stays for start_tls
                task = asyncio.get_running_loop().create_task(terminator._serve(transport))
                terminator._tasks.add(task)
                task.add_done_callback(terminator._tasks.discard)

        return Held()

    async def _serve(self, raw: asyncio.Transport) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        protocol = asyncio.StreamReaderProtocol(reader)
        self._transports.add(raw)
        try:
            try:
                transport = await loop.start_tls(raw, protocol, self.context, server_side=True, ssl_handshake_timeout=10)
            except (OSError, asyncio.TimeoutError) as exc:  # ssl.SSLError is an OSError
                self.failures.append(f"handshake: {exc!r}")
                raw.abort()
                return
            protocol.connection_made(transport)  # start_tls leaves that to its caller
            writer = asyncio.StreamWriter(transport, protocol, reader, loop)
            peer = transport.get_extra_info("peercert")
            if peer:
                self.client_subjects.update(v for rdn in peer.get("subject", ()) for k, v in rdn if k == "commonName")
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            except OSError as exc:
                self.failures.append(f"upstream: {exc!r}")
                transport.abort()
                return
            self.connections += 1
            self._transports.update((transport, up_writer.transport))
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        finally:
            self._transports.discard(raw)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(256 * 1024):
                writer.write(data)
                await writer.drain()
        except OSError as exc:  # a reset, or a TLS error after the handshake
            if isinstance(exc, ssl.SSLError):
                self.failures.append(f"TLS: {exc!r}")
        finally:
            self._transports.discard(writer.transport)
            writer.close()  # the other direction then reads EOF, and closes in turn

    def stop(self) -> None:
        if not self._thread.is_alive():
            return

        async def shut() -> None:
            self._server.close()
            for transport in list(self._transports):
                transport.abort()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            assert not self._thread.is_alive(), "the TLS terminator's thread did not stop"
            self._loop.close()


@pytest.fixture
def tls_broker(pki, tmp_path):
    """``start(mutual)``: a fresh broker behind a fresh terminator; both stopped at the end."""
    started = []

    def start(mutual: bool) -> TlsTerminator:
        private = free_port()
        terminator = TlsTerminator(pki.server_cert, pki.server_key, ("127.0.0.1", private),
                                   client_ca=pki.ca if mutual else None).start()
        started.append(terminator)
        # Tansu listens in plaintext on the private port and sends clients back to the terminator's
        started.append(EmbeddedBroker(port=private, advertised_port=terminator.port, log_path=tmp_path / "tansu.log").start())
        return terminator

    yield start
    errors = []
    for thing in reversed(started):  # the broker, then the terminator; each whatever the other did
        try:
            thing.stop()
        except Exception as exc:
            errors.append(exc)
    assert not errors, errors


# clients ---------------------------------------------------------------------
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


def produce_tls(bootstrap: str, options: dict, topic: str, events: list[dict], keys: list[bytes]) -> None:
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, **options)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])  # one partition: the broker would auto-create four
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

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                             request_timeout_ms=10_000, **options)
    by_source: dict[int, list[bytes]] = {}
    keys: dict[int, list[bytes | None]] = {}
    try:
        wait_until(lambda: consumer.partitions_for_topic(topic) or process.poll() is not None, 60,
                   what=f"the service to create {topic}")
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


#: Lines kafka-python logs that say nothing went wrong with TLS or the service: the metadata refresh the kafka
#: store's reader cancels when it closes its consumer, and the network thread's wall-clock check of its own
#: steps (``slow_task_threshold_secs``, 0.1 s), which fires whenever the machine or the GIL is busy for that long
#: (seen in CI on a TLS handshake while the service restored its model).
KAFKA_PYTHON_NOISE = ("kafka.cluster: Metadata refresh: failed Cancelled", "(>0.100s threshold). It is blocking the event loop")


# the tests ---------------------------------------------------------------------
@pytest.mark.parametrize("mutual", [False, True], ids=["server-auth", "mutual-tls-encrypted-key"])
def test_service_over_tls_publishes_the_offline_learners_predictions(pki, tls_broker, topics, tmp_path, mutual):
    terminator = tls_broker(mutual)
    options = tls_options(pki, mutual)
    events = make_events(300, seed=31)
    keys = [e["id"].encode() for e in events]
    expected, model = offline(events)
    produce_tls(terminator.bootstrap_servers, options, topics["input_topic"], events, keys)
    port = free_port()
    args = settings_args(terminator, topics, tmp_path, metrics_port=port, state_store="kafka",
                         checkpoint_topic=f"ckpt-{topics['group_id']}", **tls_args(pki, mutual))
    log_path = tmp_path / "serve.log"
    process = start_service_process(args, log_path)
    try:
        by_source, out_keys = read_outputs_tls(terminator.bootstrap_servers, options, topics["output_topic"],
                                               len(events), process, log_path)
        status, body = http_get(f"http://127.0.0.1:{port}/readyz")
        assert status == 200, body
    finally:
        code = stop_process(process, log_path)
    assert code == 0, tail(log_path)
    check_outputs(by_source, expected, input_topic=topics["input_topic"], keys=out_keys, input_keys=keys)
    log = log_path.read_text()
    assert not has_traceback(log), tail(log_path)
    # nothing went wrong on the way, TLS or else (but kafka-python's noise at the close, and KAFKA_PYTHON_NOISE)
    troubles = [line for line in without_close_noise(log).splitlines() if (" WARNING " in line or " ERROR " in line)
                and not any(noise in line for noise in KAFKA_PYTHON_NOISE)]
    assert not troubles, tail(log_path)
    # the final checkpoint went through TLS too, into the compacted topic: the model of the offline run
    from service.config import ServeSettings, load
    from service.kafka import CompactedTopic
    from service.state.kafka_store import KafkaStore

    settings = load(ServeSettings, args)
    store = KafkaStore(CompactedTopic(settings, settings.checkpoint_topic), settings.group_id)
    try:
        checkpoint = store.load("model")
    finally:
        store.close()
    assert checkpoint.model == model and checkpoint.positions == {(topics["input_topic"], 0): len(events)}
    assert terminator.connections > 0 and not terminator.failures, terminator.failures
    if mutual:
        assert terminator.client_subjects == {"perceptron-stream"}
        # and the terminator does require the certificate: a client without one is turned away
        # (TLS 1.3: its handshake seems done; the refusal is an alert or a close at the first read)
        forwarded = terminator.connections
        context = ssl.create_default_context(cafile=str(pki.ca))
        try:
            with socket.create_connection((terminator.host, terminator.port), timeout=5) as raw:
                with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                    tls.sendall(b"\x00\x00\x00\x00")
                    answer = tls.recv(1)
        except (ssl.SSLError, ConnectionError):
            answer = b""
        assert answer == b""
        wait_until(lambda: any("certificate" in f.lower() for f in terminator.failures), 5, what="the terminator's refusal")
        assert terminator.connections == forwarded, "a client without a certificate reached the broker"


def test_a_wrong_ca_is_logged_clearly_and_retried_not_a_crash(pki, tls_broker, topics, tmp_path):
    """The brokers' certificate is not signed by the service's CA: a clear error, retried;
    /healthz alive and /readyz not ready meanwhile; SIGTERM stops it with exit code 0."""
    terminator = tls_broker(False)
    port = free_port()
    args = settings_args(terminator, topics, tmp_path, metrics_port=port, **tls_args(pki, False, ca=pki.other_ca))
    log_path = tmp_path / "serve.log"
    process = start_service_process(args, log_path)
    try:
        # one attempt failed and another comes: the service retries, it does not give up
        wait_until(lambda: "could not reach the brokers" in log_path.read_text() or process.poll() is not None,
                   60, what="the service's retry")
        assert process.poll() is None, f"exited with {process.returncode}:\n{tail(log_path)}"
        assert http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        status, body = http_get(f"http://127.0.0.1:{port}/readyz")
        assert status == 503, body
    finally:
        code = stop_process(process, log_path, timeout=15)
    assert code == 0, tail(log_path)
    log = log_path.read_text()
    assert not has_traceback(log), tail(log_path)
    # the cause is in the log (kafka-python's lines: the service's own says "Unable to bootstrap")
    assert "CERTIFICATE_VERIFY_FAILED" in log and "unable to get local issuer certificate" in log, tail(log_path)
    assert terminator.connections == 0, "a client that does not trust the brokers went on talking to them"
    assert any("TLSV1_ALERT_UNKNOWN_CA" in f for f in terminator.failures), terminator.failures  # the service's verdict
