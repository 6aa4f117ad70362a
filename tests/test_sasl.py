"""Brokers that reject the SASL mechanism or the credentials stop the service at start-up, naming the setting.

kafka-python 3.0 retried such a broker until its bootstrap timeout and then
reported "Unable to bootstrap", as for brokers that are away: the service
retried forever. librdkafka reports the rejection to ``error_cb`` only, and
tries again forever too.

No SASL broker can run here (the embedded Tansu has no SASL; no Apache Kafka
build or Docker engine is available), so :class:`RejectingPeer` is a
hand-written Kafka-protocol peer: it answers ApiVersions, SaslHandshake and
SaslAuthenticate in the real wire format (big-endian sizes, the response
header of each API, flexible encoding for ApiVersions v3+), rejecting the
mechanism with error 33 and the broker's enabled mechanisms, or the
credentials with error 58 and a broker's message.
"""

from __future__ import annotations

import importlib.util
import re
import socketserver
import struct
import subprocess
import threading
import time

import pytest
from kafka.errors import SaslAuthenticationFailedError, UnsupportedSaslMechanismError

from service.config import ServeSettings, load
from service.kafka import KafkaFatal
from tests.conftest import start_service_process

SASL = ["--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanism", "SCRAM-SHA-256", "--sasl-username", "u", "--sasl-password", "p"]
CREDENTIALS_REJECTED = "Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256"
HAS_CONFLUENT = importlib.util.find_spec("confluent_kafka") is not None


def _i16(v: int) -> bytes:
    return struct.pack(">h", v)


def _i32(v: int) -> bytes:
    return struct.pack(">i", v)


def _string(s: str) -> bytes:
    data = s.encode()
    return _i16(len(data)) + data


def _uvarint(n: int) -> bytes:
    out = b""
    while n >= 0x80:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n])


#: (api key, min version, max version) the peer announces: ApiVersions, SaslHandshake, SaslAuthenticate, Metadata.
API_KEYS = [(18, 0, 3), (17, 0, 1), (36, 0, 1), (3, 0, 12)]


class RejectingPeer(socketserver.ThreadingTCPServer):
    """A Kafka broker on 127.0.0.1 as far as a client's SASL start goes: ``reject`` "mechanism" or "credentials"."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, reject: str):
        self.reject = reject
        self.requests: list[tuple[int, int]] = []  # (api key, version) in the order received
        self.mechanisms: list[str] = []  # asked for in SaslHandshake
        super().__init__(("127.0.0.1", 0), _Connection)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


class _Connection(socketserver.BaseRequestHandler):
    def handle(self):
        while (size := self._read(4)) is not None:
            request = self._read(struct.unpack(">i", size)[0])
            if request is None:
                return
            # request header v1/v2: api_key, api_version, correlation_id, client_id (nullable string)
            api_key, version, correlation_id, client_id_length = struct.unpack(">hhih", request[:10])
            body = request[10 + max(client_id_length, 0):]  # SaslHandshake is never flexible: no tagged fields here
            self.server.requests.append((api_key, version))
            if api_key == 18:  # ApiVersions; its response header is v0 whatever the version
                if version >= 3:  # flexible body: compact array, tagged fields
                    answer = (_i16(0) + _uvarint(len(API_KEYS) + 1)
                              + b"".join(_i16(k) + _i16(low) + _i16(high) + _uvarint(0) for k, low, high in API_KEYS)
                              + _i32(0) + _uvarint(0))
                else:
                    answer = (_i16(0) + _i32(len(API_KEYS)) + b"".join(_i16(k) + _i16(low) + _i16(high) for k, low, high in API_KEYS)
                              + (_i32(0) if version >= 1 else b""))
            elif api_key == 17:  # SaslHandshake v0-v1: error_code, enabled mechanisms
                mechanism = body[2:2 + struct.unpack(">h", body[:2])[0]].decode()
                self.server.mechanisms.append(mechanism)
                if self.server.reject == "mechanism":
                    answer = _i16(33) + _i32(1) + _string("PLAIN")  # UNSUPPORTED_SASL_MECHANISM
                else:
                    answer = _i16(0) + _i32(2) + _string("PLAIN") + _string(mechanism)
            elif api_key == 36:  # SaslAuthenticate v0-v1: error_code, error_message, auth_bytes[, session_lifetime_ms]
                answer = _i16(58) + _string(CREDENTIALS_REJECTED) + _i32(0) + (struct.pack(">q", 0) if version >= 1 else b"")
            else:  # nothing else is reached before authentication
                return
            response = _i32(correlation_id) + answer
            self.request.sendall(_i32(len(response)) + response)

    def _read(self, n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            chunk = self.request.recv(n - len(data))
            if not chunk:
                return None
            data += chunk
        return data


@pytest.fixture
def peer(request):
    server = RejectingPeer(request.param)
    yield server
    server.shutdown()
    server.server_close()


CLIENTS = ["kafka-python"] + (["confluent"] if HAS_CONFLUENT else [])


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("peer, names", [
    ("mechanism", ["sasl_mechanism (--sasl-mechanism, PERCEPTRON_STREAM_SASL_MECHANISM)"]),
    ("credentials", ["sasl_username (--sasl-username, PERCEPTRON_STREAM_SASL_USERNAME)",
                     "sasl_password (--sasl-password, PERCEPTRON_STREAM_SASL_PASSWORD)"]),
], indirect=["peer"])
def test_a_sasl_rejection_stops_serve_with_exit_1_naming_the_setting(peer, names, client, tmp_path):
    log_path = tmp_path / "serve.log"
    process = start_service_process(["--bootstrap-servers", peer.bootstrap_servers, *SASL, "--kafka-client", client,
                                      "--metrics-port", "0", "--state-dir", str(tmp_path / "state")], log_path)
    try:
        code = process.wait(timeout=30)  # one attempt takes about a second; before, it never ended
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail("serve is still retrying after 30 s:\n" + log_path.read_text()[-2000:])
    output = log_path.read_text()
    assert code == 1, output[-2000:]
    assert "retrying cannot help" in output and all(name in output for name in names), output[-2000:]
    error = UnsupportedSaslMechanismError if peer.reject == "mechanism" else SaslAuthenticationFailedError
    assert f"perceptron-stream serve: could not reach the brokers and check the topics: {error.__name__}" in output
    assert "Traceback" not in output
    assert peer.mechanisms[:1] == ["SCRAM-SHA-256"]  # it did reach the handshake: the rejection is what stopped it
    assert len(peer.mechanisms) <= 2, peer.requests  # and it was not retried


@pytest.mark.skipif(not HAS_CONFLUENT, reason="confluent-kafka is not installed")
@pytest.mark.parametrize("peer, error, says", [
    ("mechanism", UnsupportedSaslMechanismError, "broker's supported mechanisms: PLAIN"),
    ("credentials", SaslAuthenticationFailedError, CREDENTIALS_REJECTED),
], indirect=["peer"])
def test_the_confluent_stream_raises_what_librdkafka_only_reports(peer, error, says):
    """librdkafka reports the rejection to error_cb (code _AUTHENTICATION, neither fatal nor retriable) and tries
    again forever; the stream raises it from poll. (At start-up the service meets it earlier: topics are set up
    with kafka-python whichever client runs the loop.)"""
    from service.kafka.confluent import ConfluentIO

    settings = load(ServeSettings, ["--bootstrap-servers", peer.bootstrap_servers, *SASL, "--kafka-client", "confluent"])
    io = ConfluentIO(settings, group_id="g", topics=["points"], auto_offset_reset="earliest", on_assigned=lambda _: None,
                     on_revoked=lambda _: None, max_poll_records=10)
    try:
        deadline = time.monotonic() + 20
        with pytest.raises(KafkaFatal, match=f"{error.__name__}: .*{re.escape(says)}"):  # translated: the service's own error
            while time.monotonic() < deadline:
                io.poll(200, 10)
    finally:
        io.close()


@pytest.mark.parametrize("error, names", [
    (UnsupportedSaslMechanismError(), ["SASL mechanism SCRAM-SHA-256", "sasl_mechanism (--sasl-mechanism, PERCEPTRON_STREAM_SASL_MECHANISM)"]),
    (SaslAuthenticationFailedError("bad password"), ["sasl_username (--sasl-username", "sasl_password (--sasl-password"]),
])
def test_the_message_names_the_settings_to_check(error, names):
    from service.kafka.kafka_python import service_error
    from service.runtime.retry import fatal

    message = str(fatal(service_error(error, load(ServeSettings, SASL)), "reach the brokers"))
    assert message.startswith(f"could not reach the brokers: {error.__class__.__name__}") and all(n in message for n in names)
