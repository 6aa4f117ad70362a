"""How a test starts the service: its flags against a test broker, as a child process, or in a thread of the test.

What a run then did (its outputs, checkpoint, log) is :mod:`tests.support.service`'s.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from tests.support import ROOT
from tests.support.waiting import wait_until


def settings_args(broker, topics: dict, tmp_path: Path, **extra) -> list[str]:
    """Flags for `serve` against the test broker, with a metrics port of its own."""
    args = {
        "bootstrap_servers": broker.bootstrap_servers,
        **topics,
        "state_dir": str(tmp_path / "state"),
        "metrics_port": 0,
        "poll_timeout_ms": 100,
        "checkpoint_interval_seconds": 1.0,
        **extra,
    }
    out = []
    for name, value in args.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else f"--no-{name.replace('_', '-')}")
        else:
            out += [flag, str(value)]
    return out


def start_service_process(
    args: list[str], log_path: Path, preexec_fn=None, env: dict | None = None, fault: tuple[str, ...] = ()
) -> subprocess.Popen:
    """`perceptron-stream serve` as a real child process (signals, crashes).

    ``preexec_fn`` runs in the child before the service starts (e.g. to lower
    its open-files limit); ``env``: variables added to the test's environment;
    ``fault``: one of :mod:`tests.support.faults` (e.g. ``("abort-transaction", "1")``)."""
    runner = ["tests.support.faults", *fault] if fault else ["perceptron_stream.cli"]
    with open(log_path, "ab") as log:  # the child writes to its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", *runner, "serve", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            preexec_fn=preexec_fn,
            env=None if env is None else {**os.environ, **env},
        )


def run_command(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``perceptron-stream ARGS...`` as a child process run to its end (what it prints, its exit status): for a
    command whose lines on stderr are what the test reads, which a command run in the test's process would mix with
    the test's own logging."""
    return subprocess.run(
        [sys.executable, "-m", "perceptron_stream.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
    )


class ServiceThread:
    """The Application running in a thread of the test process (the ``service_thread`` fixture starts and stops it)."""

    def __init__(self, args: list[str]):
        from perceptron_stream.app import Application
        from perceptron_stream.config import ServeSettings, load

        self.app = Application(load(ServeSettings, args))
        self.result: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            self.result = self.app.run(install_signal_handlers=False)
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def start(self) -> ServiceThread:
        self.thread.start()
        wait_until(lambda: self.app.http is not None or self.error, 30, what="the service's HTTP endpoints")
        return self

    def stop(self, timeout: float = 30.0):
        self.app.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the service did not stop"
        if self.error:
            raise self.error
        return self.result

    @property
    def metrics_url(self) -> str:
        assert self.app.http is not None, "the service's HTTP endpoints are not up"
        return f"http://127.0.0.1:{self.app.http.port}"
