"""The HTTP endpoints /metrics, /healthz, /readyz and /model: the only module that does HTTP.

Hand-written on purpose (issue 12). A server with a thread per connection
and no timeout let about 1,000 idle clients take every file descriptor:
/healthz went unanswered (a liveness-probe restart loop), its accept loop
spun at 100 % of a core on EMFILE, and checkpoints failed with "Too many
open files". The well-kept servers bound threads or connections, but then
the idle crowd waits in the listen backlog ahead of the probe. This one:

- accepts every connection at once and holds at most ``MAX_CONNECTIONS``
  (a quarter of the open-files limit when that is less), closing the oldest
  connection that has not sent a complete request when one more comes;
- gives a request head ``HEAD_TIMEOUT_S`` to arrive and ``MAX_HEAD_BYTES``
  to fit in (431 beyond), and a response ``WRITE_TIMEOUT_S`` to be taken by
  the client; one request per connection (``Connection: close``);
- when accept fails for want of descriptors (EMFILE, ENFILE), frees one: it
  keeps a reserve descriptor open for this, closes it to take the waiting
  connection in, then closes the oldest idle connection to take the reserve
  back; with nothing to free it waits ``BACKOFF_S`` before the next accept,
  never spinning.

One ``selectors`` loop in one daemon thread, with sockets closed right where
the loop decides to (an asyncio transport closes later, and a descriptor
freed later is no use to an accept that needs one now).
"""

from __future__ import annotations

import errno
import gzip
import json
import logging
import os
import selectors
import socket
import threading
import time
from collections import OrderedDict
from urllib.parse import parse_qs, unquote

import orjson
from perceptron_stream.metrics import ServiceMetrics
from perceptron_stream.runtime.health import Health
from perceptron_stream.runtime.retry import Backoff, StartupError
from prometheus_client.exposition import choose_encoder, gzip_accepted
from prometheus_client.registry import CollectorRegistry, RestrictedRegistry

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 128  # open at once, at most
MIN_CONNECTIONS = 8  # even under a tiny open-files limit
HEAD_TIMEOUT_S = 5.0  # from accept to the end of the request head
MAX_HEAD_BYTES = 8192  # request line and headers
WRITE_TIMEOUT_S = 5.0  # for the client to take the whole response
BACKOFF_S = (0.01, 0.05)  # the first and the longest pause of accept when no descriptor can be freed
ACCEPTS_PER_TURN = 64  # then the loop reads, writes and expires before accepting more
NOT_FOUND = b"try /metrics, /healthz, /readyz or /model\n"

_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


def connection_cap(open_files_limit: int | None) -> int:
    """How many connections to hold at once: MAX_CONNECTIONS, or a quarter of the limit when less.

    The rest of the descriptors stay for the brokers and the checkpoints.

    >>> connection_cap(1024), connection_cap(256), connection_cap(20), connection_cap(None)
    (128, 64, 8, 128)
    """
    if open_files_limit is None or open_files_limit < 0:  # unknown, or unlimited (RLIM_INFINITY)
        return MAX_CONNECTIONS
    return max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, open_files_limit // 4))


def _open_files_limit() -> int | None:
    try:
        import resource
    except ImportError:  # not on Unix
        return None
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def head_end(data: bytes) -> int:
    """Where the request head ends in ``data`` (past its blank line), -1 while it has not.

    >>> head_end(b"GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n"), head_end(b"GET / HTTP/1.0\\n\\n"), head_end(b"GET / HT")
    (27, 16, -1)
    """
    ends = [(i + len(mark)) for mark in (b"\r\n\r\n", b"\n\n") if (i := data.find(mark)) >= 0]
    return min(ends, default=-1)


def parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]] | None:
    """(method, path, query, headers with lower-case names) of a request head; None when it is not one.

    >>> parse_head(b"GET /metrics?name[]=up HTTP/1.1\\r\\nAccept-Encoding: gzip\\r\\n\\r\\n")
    ('GET', '/metrics', 'name[]=up', {'accept-encoding': 'gzip'})
    >>> parse_head(b"hello\\r\\n\\r\\n") is None
    True
    """
    lines = head.decode("latin-1").splitlines()
    parts = lines[0].split() if lines else []
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        return None
    method, target, _ = parts
    path, _, query = target.partition("?")
    headers = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
    return method, unquote(path), query, headers


def response(status: str, content_type: str | None, body: bytes, headers: tuple = (), send_body: bool = True) -> bytes:
    """One whole HTTP/1.1 response, after which the connection closes.

    >>> response("404 Not Found", "text/plain", NOT_FOUND)
    b'HTTP/1.1 404 Not Found\\r\\nContent-Type: text/plain\\r\\nContent-Length: 42\\r\\nConnection: close\\r\\n\\r\\ntry /metrics, /healthz, /readyz or /model\\n'
    """
    lines = [f"HTTP/1.1 {status}"]
    if content_type:
        lines.append(f"Content-Type: {content_type}")
    lines += [f"Content-Length: {len(body)}", "Connection: close", *(f"{name}: {value}" for name, value in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body if send_body else b"")


def model_page(query: str) -> tuple[int, int] | str:
    """(offset, limit) of a GET /model query, or the error to answer (400).

    >>> model_page(""), model_page("offset=2000&limit=500"), model_page("limit=0")
    ((0, 1000), (2000, 500), 'limit must be a whole number from 1 to 10000, got 0\\n')
    """
    from perceptron_stream.pipeline.models import REPORT_MAX_PAGE, REPORT_PAGE

    args = parse_qs(query)
    out = []
    for name, default, low, high in (("offset", 0, 0, None), ("limit", REPORT_PAGE, 1, REPORT_MAX_PAGE)):
        text = args.get(name, [str(default)])[-1]
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            bound = f"from {low} to {high}" if high is not None else f"of {low} or more"
            return f"{name} must be a whole number {bound}, got {text}\n"
        out.append(value)
    return out[0], out[1]


def listen(host: str, port: int) -> socket.socket:
    """The endpoints' listening socket on ``host:port`` (SO_REUSEADDR on POSIX, as ``create_server`` sets it).

    A port another process holds (a second instance on one host with the default 8000), a port below 1024 without
    the right to it, or a host that is no address of this machine is the operator's to change, not a bug: a
    StartupError naming the setting, which the commands print as one line (exit 1, as for a state directory
    another instance holds: the same command works once the port is free), instead of a traceback.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=socket.SOMAXCONN)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            problem = (
                f"--metrics-port {port}: {host}:{port} is in use by another process (each instance on one host "
                "needs a --metrics-port of its own; 0 picks a free one)"
            )
        elif exc.errno == errno.EACCES:
            problem = f"--metrics-port {port}: not allowed to listen on {host}:{port} (try a port above 1023)"
        elif exc.errno == errno.EADDRNOTAVAIL:
            problem = f"--metrics-host {host}: no address of this machine (127.0.0.1, or 0.0.0.0 for every address)"
        else:
            raise
        raise StartupError(f"cannot serve /metrics, /healthz, /readyz and /model: {problem}") from None


class _Connection:
    __slots__ = ("closed", "deadline", "out", "received", "sent", "sock")

    def __init__(self, sock: socket.socket, deadline: float):
        self.sock = sock
        self.closed = False
        self.deadline = deadline
        self.received = b""
        self.out = b""  # the response, once the request is complete (never empty: a status line at least)
        self.sent = 0

    @property
    def idle(self) -> bool:
        """Still waiting for its complete request head."""
        return not self.out


class HttpEndpoints:
    """/metrics, /healthz, /readyz and /model on ``host:port`` in a background thread.

    /metrics then also reports ``health``'s poll-loop beat (see
    :meth:`ServiceMetrics.track_poll_loop`). The keyword arguments are the
    limits of the module docstring (tests shorten them).
    """

    def __init__(
        self,
        metrics: ServiceMetrics,
        health: Health,
        host: str,
        port: int,
        *,
        max_connections: int | None = None,
        head_timeout_s: float = HEAD_TIMEOUT_S,
        write_timeout_s: float = WRITE_TIMEOUT_S,
        model_report=None,
    ):
        self._registry = metrics.registry
        self.model_report = model_report  # () -> the JSON-able report of GET /model (read-only), or None
        self.health = health
        metrics.track_poll_loop(health)
        self.max_connections = max_connections or connection_cap(_open_files_limit())
        self.head_timeout_s, self.write_timeout_s = head_timeout_s, write_timeout_s
        self._listener = listen(host, port)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._connections: OrderedDict[int, _Connection] = OrderedDict()  # by id, in accept order: the oldest first
        self._reserve: int | None = None
        self._take_reserve()
        self._accept_paused_until: float | None = None
        self._backoff = Backoff(*BACKOFF_S)  # the pause of accept, doubling while accepts fail
        self._accept_failing = False  # since the last accept that took a connection: said once, at the first
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="http-endpoints", daemon=True)

    def start(self) -> HttpEndpoints:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread.is_alive():
            self._thread.join(10)
        for conn in list(self._connections.values()):
            self._close(conn)
        self._selector.close()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None

    # the loop ------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            try:
                self._turn()
            except Exception:  # a bug here must not end /healthz for good; the pause keeps it from spinning
                log.exception("http: unexpected error in the server loop")
                time.sleep(BACKOFF_S[1])

    def _turn(self) -> None:
        now = time.monotonic()
        deadlines = [conn.deadline for conn in self._connections.values()]
        if self._accept_paused_until is not None:
            deadlines.append(self._accept_paused_until)
        timeout = max(0.0, min(deadlines) - now) if deadlines else None
        for key, mask in self._selector.select(timeout):
            if key.fileobj is self._listener:
                self._accept()
            elif key.fileobj is self._wake_r:
                self._wake_r.recv(64)
            elif not key.data.closed:  # not closed earlier in this turn
                if mask & selectors.EVENT_READ:
                    self._read(key.data)
                if mask & selectors.EVENT_WRITE and not key.data.closed:
                    self._write(key.data)
        now = time.monotonic()
        for conn in [c for c in self._connections.values() if c.deadline <= now]:
            log.debug(
                "http: closing a connection that %s in time",
                "sent no complete request" if conn.idle else "did not take its response",
            )
            self._close(conn)
        if self._accept_paused_until is not None and now >= self._accept_paused_until:
            self._accept_paused_until = None
            self._selector.register(self._listener, selectors.EVENT_READ)

    # accepting -----------------------------------------------------------
    def _accept(self) -> None:
        """The listener is readable: take in what waits, a burst at a time."""
        for _ in range(ACCEPTS_PER_TURN):
            sock = self._accept_one()
            if sock is None:
                return
            self._admit(sock)
            if self._reserve is None:
                # At the limit. Linux fails accept with EMFILE before it looks at the
                # queue, so a further EMFILE now would not mean a connection waits:
                # accept again when select says one does.
                return

    def _accept_one(self) -> socket.socket | None:
        freed = False
        while True:
            try:
                sock, _ = self._listener.accept()
            except BlockingIOError:  # nothing waits (any more)
                if self._reserve is None:
                    self._take_reserve()
                return None
            except OSError as exc:
                if exc.errno == errno.ECONNABORTED:  # the client gave up while queued
                    continue
                if exc.errno in _OUT_OF_DESCRIPTORS and not freed and self._free_a_descriptor():
                    freed = True
                    continue
                self._pause_accepting(exc)
                return None
            self._backoff.reset()
            self._accept_failing = False
            return sock

    def _free_a_descriptor(self) -> bool:
        """Out of descriptors: close the reserve (the next accept takes its place) or the oldest idle connection."""
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None
            return True
        oldest_idle = next((c for c in self._connections.values() if c.idle), None)
        if oldest_idle is None:
            return False
        self._close(oldest_idle, take_reserve=False)  # the descriptor is for the accept that follows
        return True

    def _pause_accepting(self, exc: OSError) -> None:
        """Stop watching the listener for a moment: it stays readable, so watching it now would spin."""
        if not self._accept_failing:
            log.warning("http: accept failed (%s); pausing accept, answering what is open", exc)
            self._accept_failing = True
        self._accept_paused_until = time.monotonic() + self._backoff.next()
        self._selector.unregister(self._listener)

    def _admit(self, sock: socket.socket) -> None:
        # Over the cap, or out of descriptors (no reserve): the newcomer replaces
        # the oldest connection that has sent no complete request. A newcomer
        # over the cap with every connection busy answering replaces the oldest.
        over_cap = len(self._connections) >= self.max_connections
        if over_cap or self._reserve is None:
            victim = next((c for c in self._connections.values() if c.idle), None)
            if victim is None and over_cap:
                victim = next(iter(self._connections.values()))
            if victim is not None:
                self._close(victim)
        sock.setblocking(False)
        conn = _Connection(sock, time.monotonic() + self.head_timeout_s)
        self._connections[id(conn)] = conn
        self._selector.register(sock, selectors.EVENT_READ, conn)
        self._read(conn)  # a probe's request is often there already

    def _take_reserve(self) -> None:
        try:
            self._reserve = os.open(os.devnull, os.O_RDONLY)
        except OSError:
            self._reserve = None  # taken again when a connection closes

    def _close(self, conn: _Connection, take_reserve: bool = True) -> None:
        if conn.closed:
            return
        self._selector.unregister(conn.sock)
        conn.sock.close()
        conn.closed = True
        del self._connections[id(conn)]
        if take_reserve and self._reserve is None:
            self._take_reserve()

    # one request, one response ---------------------------------------------
    def _read(self, conn: _Connection) -> None:
        if not conn.idle:
            return  # answered already; what else comes is not read
        try:
            data = conn.sock.recv(MAX_HEAD_BYTES + 1 - len(conn.received))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if not data:
            self._close(conn)
            return
        conn.received += data
        end = head_end(conn.received)
        if end < 0 and len(conn.received) <= MAX_HEAD_BYTES:
            return
        if end < 0 or end > MAX_HEAD_BYTES:
            self._respond(
                conn, response("431 Request Header Fields Too Large", "text/plain", b"request head too large\n")
            )
            return
        request = parse_head(conn.received[:end])
        if request is None:
            self._respond(conn, response("400 Bad Request", "text/plain", b"bad request\n"))
            return
        method, path, query, headers = request
        self._respond(conn, self._answer(method, path, query, headers))
        log.debug("http: %s %s", method, path)

    def _respond(self, conn: _Connection, data: bytes) -> None:
        conn.out, conn.sent = data, 0
        conn.deadline = time.monotonic() + self.write_timeout_s
        self._selector.modify(conn.sock, selectors.EVENT_WRITE, conn)
        self._write(conn)

    def _write(self, conn: _Connection) -> None:
        try:
            conn.sent += conn.sock.send(memoryview(conn.out)[conn.sent :])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if conn.sent == len(conn.out):
            self._close(conn)

    def _answer(self, method: str, path: str, query: str, headers: dict[str, str]) -> bytes:
        if path == "/metrics":
            return self._metrics(method, query, headers)
        if path == "/model" and self.model_report is not None:
            if method not in ("GET", "HEAD"):
                return response(
                    "405 Method Not Allowed", "text/plain", b"/model is read-only: GET\n", (("Allow", "GET"),)
                )
            page = model_page(query)
            if isinstance(page, str):
                return response("400 Bad Request", "text/plain", page.encode())
            return response(
                "200 OK", "application/json", orjson.dumps(self.model_report(*page)), send_body=method != "HEAD"
            )
        checks = {"/healthz": self.health.live, "/readyz": self.health.ready}
        send_body = method != "HEAD"
        if path not in checks:
            return response("404 Not Found", "text/plain", NOT_FOUND, send_body=send_body)
        ok, detail = checks[path]()
        body = json.dumps({"ok": ok, **detail}).encode()
        return response("200 OK" if ok else "503 Service Unavailable", "application/json", body, send_body=send_body)

    def _metrics(self, method: str, query: str, headers: dict[str, str]) -> bytes:
        """What prometheus-client's own WSGI app answers: format by Accept, gzip by Accept-Encoding, ``name[]`` filters."""
        if method == "OPTIONS":
            return response("200 OK", None, b"", (("Allow", "OPTIONS,GET"),))
        if method != "GET":
            return response(
                "405 Method Not Allowed",
                None,
                f"# HTTP 405 Method Not Allowed: {method}; use OPTIONS or GET\n".encode(),
                (("Allow", "OPTIONS,GET"),),
            )
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        registry: CollectorRegistry | RestrictedRegistry = self._registry
        names = parse_qs(query).get("name[]")
        if names:
            registry = self._registry.restricted_registry(names)
        try:
            body = encoder(registry)
        except Exception:
            log.exception("http: /metrics failed")
            return response(
                "500 Internal Server Error", "text/plain", b"collecting the metrics failed; see the service log\n"
            )
        extra: tuple[tuple[str, str], ...] = ()
        if gzip_accepted(headers.get("accept-encoding", "")):
            body, extra = gzip.compress(body), (("Content-Encoding", "gzip"),)
        return response("200 OK", content_type, body, extra)
