"""service/http.py's limits, one at a time, on a server in this process (or in a child, for EMFILE).

The crowd as the issue saw it, against the whole service, is in
tests/integration/test_http_crowd.py.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from perceptron_stream import http
from perceptron_stream.http import MAX_HEAD_BYTES, HttpEndpoints
from perceptron_stream.metrics import ServiceMetrics
from perceptron_stream.runtime.health import Health

from tests.support import ROOT
from tests.support.endpoints import http_get
from tests.support.waiting import wait_until


@pytest.fixture
def serve():
    started = []

    def start(**limits) -> HttpEndpoints:
        endpoints = HttpEndpoints(
            ServiceMetrics(window=10, version="t", variant="plain"), Health(30.0), "127.0.0.1", 0, **limits
        ).start()
        started.append(endpoints)
        return endpoints

    yield start
    for endpoints in started:
        endpoints.stop()


def connect(endpoints: HttpEndpoints) -> socket.socket:
    return socket.create_connection(("127.0.0.1", endpoints.port), timeout=5)


def closed_by_server(sock: socket.socket, wait_s: float = 0.0) -> bool:
    """Whether the server has closed ``sock`` (EOF or reset), waiting up to ``wait_s`` for it."""
    sock.settimeout(wait_s or None)
    if not wait_s:
        sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except (TimeoutError, BlockingIOError):
        return False
    except ConnectionResetError:
        return True


def read_all(sock: socket.socket) -> bytes:
    sock.settimeout(5)
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_the_endpoints_answer_as_before(serve):
    endpoints = serve()
    url = f"http://127.0.0.1:{endpoints.port}"
    status, body = http_get(url + "/healthz")
    assert (
        status == 200
        and json.loads(body)["ok"] is True
        and set(json.loads(body)) == {"ok", "poll_loop_idle_seconds", "limit_seconds"}
    )
    status, body = http_get(url + "/readyz")
    assert (status, json.loads(body)) == (
        503,
        {"ok": False, "partitions_assigned": False, "state_restored": False, "broker_reachable": False},
    )
    assert http_get(url + "/nothing") == (404, "try /metrics, /healthz, /readyz or /model\n")
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        assert r.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert r.headers["Connection"] == "close"
        assert "perceptron_mistakes_total 0.0" in r.read().decode()
    request = urllib.request.Request(
        url + "/metrics?name[]=perceptron_mistakes_total",
        headers={"Accept": "application/openmetrics-text; version=1.0.0", "Accept-Encoding": "gzip"},
    )
    with urllib.request.urlopen(request, timeout=5) as r:
        assert r.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
        text = gzip.decompress(r.read()).decode()
    assert "perceptron_mistakes_total 0.0" in text and "perceptron_updates" not in text and text.endswith("# EOF\n")


def held(endpoints) -> dict:
    """The connections the server holds."""
    return endpoints._connections  # noqa: SLF001 — nothing public counts them


def test_a_connection_that_sends_nothing_is_closed_after_the_head_timeout(serve):
    endpoints = serve(head_timeout_s=0.5)
    start = time.monotonic()
    with connect(endpoints) as idle:
        assert closed_by_server(idle, wait_s=5)
    assert 0.4 < time.monotonic() - start < 2.0
    with connect(endpoints) as slow:  # a head sent a byte at a time does not get more time
        slow.sendall(b"GET /healthz HTTP/1.1\r\n")
        time.sleep(0.3)
        slow.sendall(b"Host: x\r\n")
        assert closed_by_server(slow, wait_s=5)
    wait_until(lambda: not held(endpoints), 30, interval=0.01, what="the server to forget them")


def test_a_head_over_the_limit_gets_431(serve):
    endpoints = serve()
    with connect(endpoints) as client:
        client.sendall(
            b"GET /healthz HTTP/1.1\r\nX-Long: " + b"a" * (MAX_HEAD_BYTES + 1 - 33) + b"\r\n"
        )  # one byte too many, no end
        assert read_all(client).startswith(b"HTTP/1.1 431 ")
    with connect(endpoints) as client:  # far over: 431, or closed before the client could read it
        try:
            client.sendall(b"GET /healthz HTTP/1.1\r\n" + b"X-Long: aaaaaaaa\r\n" * 4000)
            answer = read_all(client)
        except (ConnectionResetError, BrokenPipeError):
            answer = b""
        assert answer == b"" or answer.startswith(b"HTTP/1.1 431 ")
    with connect(endpoints) as client:  # within the limit, it is answered
        client.sendall(b"GET /healthz HTTP/1.1\r\nX-Long: " + b"a" * (MAX_HEAD_BYTES - 100) + b"\r\n\r\n")
        assert read_all(client).startswith(b"HTTP/1.1 200 OK\r\n")


def test_over_the_cap_the_oldest_idle_connection_is_closed(serve):
    endpoints = serve(max_connections=3)
    first, second, third = (connect(endpoints) for _ in range(3))
    wait_until(lambda: len(held(endpoints)) == 3, 30, what="three connections held")
    fourth = connect(endpoints)
    assert closed_by_server(first, wait_s=30)
    assert not any(closed_by_server(s, wait_s=0.2) for s in (second, third, fourth))
    assert http_get(f"http://127.0.0.1:{endpoints.port}/healthz")[0] == 200  # at the cap: in, in place of `second`
    assert closed_by_server(second, wait_s=30)
    for s in (first, second, third, fourth):
        s.close()


def test_a_client_that_does_not_read_its_response_is_dropped_after_the_write_timeout(serve, monkeypatch):
    endpoints = serve(write_timeout_s=3.0)
    answer = endpoints._answer  # noqa: SLF001 — no route answers 16 MB
    big = http.response("200 OK", "text/plain", b"x" * 16_000_000)  # more than any socket buffer holds
    monkeypatch.setattr(
        endpoints, "_answer", lambda method, path, *rest: big if path == "/big" else answer(method, path, *rest)
    )
    reader = socket.socket()
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    reader.connect(("127.0.0.1", endpoints.port))
    reader.sendall(b"GET /big HTTP/1.1\r\n\r\n")  # and never reads
    wait_until(lambda: any(not c.idle for c in held(endpoints).values()), 30, what="the response to start")
    assert http_get(f"http://127.0.0.1:{endpoints.port}/healthz")[0] == 200
    # not held up by the slow reader: answered while the server still writes to it (a server that waited on it
    # would answer only once the write timeout dropped it)
    assert any(not c.idle for c in held(endpoints).values()), "the slow reader was dropped before /healthz answered"
    wait_until(lambda: not held(endpoints), 30, interval=0.05, what="the slow reader to be dropped")
    try:
        received = read_all(reader)
    except ConnectionResetError:
        received = b""
    reader.close()
    head, _, body = received.partition(b"\r\n\r\n")
    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0]) if b"Content-Length: " in head else None
    assert length is None or len(body) < length  # the part of the answer that was in the buffers, not all of it


def test_accept_failing_for_good_pauses_instead_of_spinning(serve, monkeypatch):
    """Out of descriptors with nothing left to free: accept is tried about every BACKOFF_S[1], not in a loop."""
    endpoints = serve()
    attempts = []

    class Exhausted(socket.socket):
        __slots__ = ()

        def accept(self):
            attempts.append(time.monotonic())
            raise OSError(errno.EMFILE, "Too many open files")

    endpoints._listener.__class__ = Exhausted  # noqa: SLF001 — EMFILE for good, without starving the test
    waiting = socket.create_connection(("127.0.0.1", endpoints.port), timeout=5)  # queued: the listener stays readable
    try:
        wait_until(lambda: len(attempts) >= 10, 30, interval=0.01, what="accept to be tried again and again")
    finally:
        waiting.close()
    # At once after the spare descriptor is freed, then 10, 20, 40, then 50 ms apart: 0.32 s for the first ten. A
    # loop would take microseconds; a loaded machine only lengthens the pauses.
    assert attempts[9] - attempts[0] >= 0.25, [round(t - attempts[0], 3) for t in attempts[:10]]
    assert endpoints._reserve is None  # noqa: SLF001 — the spare descriptor (nothing public shows it): spent on the first failure, nothing to take it back with


CHILD = r"""
import os, resource, sys, time
from perceptron_stream.http import HttpEndpoints
from perceptron_stream.metrics import ServiceMetrics
from perceptron_stream.runtime.health import Health

resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
endpoints = HttpEndpoints(ServiceMetrics(window=10, version="t", variant="plain"), Health(30.0), "127.0.0.1", 0,
                          max_connections=1000).start()
hog = []
try:
    while True:
        hog.append(os.open(os.devnull, os.O_RDONLY))
except OSError:
    pass
print(endpoints.port, len(hog), flush=True)
time.sleep(60)
"""


def test_healthz_is_answered_when_the_process_has_no_descriptor_left(tmp_path):
    """A process whose every descriptor is taken: the reserve lets the probe in, and nothing spins.

    The cap is set above what the limit allows, so it is the descriptors
    that run out, not the cap.
    """
    limit = 64
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(limit)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    try:
        port, hogged = map(int, child.stdout.readline().split())
        assert hogged > 0 and len(os.listdir(f"/proc/{child.pid}/fd")) == limit  # full
        crowd = []
        for _ in range(100):  # more than the process could hold: each one in takes the place of the previous one
            crowd.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            time.sleep(0.002)
        time.sleep(0.3)
        cpu = _cpu_seconds(child.pid)
        time.sleep(2.0)
        cpu_share = (_cpu_seconds(child.pid) - cpu) / 2.0
        start = time.monotonic()
        status, body = http_get(f"http://127.0.0.1:{port}/healthz", timeout=3)
        took = time.monotonic() - start
        assert status == 200 and json.loads(body)["ok"] is True and took < 1.0, (status, took)
        assert cpu_share < 0.2, cpu_share
        assert http_get(f"http://127.0.0.1:{port}/readyz", timeout=3)[0] == 503  # and again: the reserve came back
        for s in crowd:
            s.close()
    finally:
        child.kill()
        child.wait()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_cap_leaves_most_descriptors_to_the_rest_of_the_service():
    assert http.connection_cap(1024) == http.MAX_CONNECTIONS == 128
    assert http.connection_cap(256) == 64


def test_an_address_the_endpoints_cannot_listen_on_is_a_startup_error_naming_the_setting():
    """A port another socket holds names --metrics-port; a host that is no address of this machine names
    --metrics-host (192.0.2.1: TEST-NET-1, never local)."""
    from perceptron_stream.runtime.retry import StartupError

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(StartupError, match=rf"--metrics-port {port}: 127\.0\.0\.1:{port} is in use"):
            HttpEndpoints(ServiceMetrics(window=10, version="t", variant="plain"), Health(30.0), "127.0.0.1", port)
    with pytest.raises(StartupError, match=r"--metrics-host 192\.0\.2\.1: no address of this machine"):
        http.listen("192.0.2.1", 0)
