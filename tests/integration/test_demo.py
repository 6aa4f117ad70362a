"""`perceptron-stream demo` runs for a bounded time, counts events and leaves nothing behind."""

import re
import subprocess
import sys
import time
from pathlib import Path

from perceptron_stream.broker import free_port

from tests.support import ROOT
from tests.support.endpoints import http_get
from tests.support.waiting import wait_until


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            pass
    return found


def _metric(port: int, name: str) -> float | None:
    """A sample of the demo's /metrics (``name`` with its labels, as exposed); None when absent."""
    status, text = http_get(f"http://127.0.0.1:{port}/metrics")
    match = re.search(rf"^{re.escape(name)} ([0-9.e+-]+|NaN)$", text, re.M) if status == 200 else None
    return float(match.group(1)) if match else None


def _broker_address(output: str) -> str:
    found = re.search(r"embedded broker on (\S+)", output)
    assert found, f"the demo did not say where its broker is:\n{output}"
    return found.group(1)


def _demo(port: int, *args: str, **popen) -> subprocess.Popen:
    """``perceptron-stream demo --no-live --metrics-port PORT ARGS...`` started from the repository."""
    command = [sys.executable, "-m", "perceptron_stream.cli", "demo", "--no-live", "--metrics-port", str(port)]
    return subprocess.Popen([*command, *args], cwd=ROOT, **popen)


def test_demo_counts_events_and_mistakes_then_stops_everything(tmp_path):
    """Stopped with Ctrl-C once /metrics shows the counts: a --duration counts from when the metrics are up, before
    the group join, so on a loaded machine a short one could end before a mistake was counted. (--duration's own
    stop is test_duration_stops_the_demo_by_itself's.)"""
    import signal

    port = free_port()
    with open(tmp_path / "demo.out", "w") as out:  # the demo writes to its own copy of the descriptor
        # --duration 600: a bound for a test that fails; SIGINT stops it
        demo = _demo(port, "--duration", "600", "--rate", "1000", stdout=out, stderr=subprocess.STDOUT)
    try:

        def metric(name):
            return _metric(port, name) or 0.0

        wait_until(
            lambda: (
                metric("perceptron_mistakes_total") > 0 and metric('perceptron_events_total{kind="labeled"}') > 1000
            ),
            120,
            what="the demo to count mistakes and over 1000 events",
        )
        for challenger in ("plain", "pocket"):  # the champion is averaged
            assert _metric(port, f'perceptron_challenger_mistake_rate{{challenger="{challenger}"}}') is not None, (
                challenger
            )
        broker_address = _broker_address((tmp_path / "demo.out").read_text())
        assert _processes_mentioning(f"tcp://{broker_address}"), "the demo's broker should be running"
        demo.send_signal(signal.SIGINT)
        code = demo.wait(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
    log = (tmp_path / "demo.out").read_text()
    assert code == 0, log
    assert "stopped: broker, producer and service are down" in log
    last = re.findall(r"events=(\d+) .*mistakes=(\d+)", log)[-1]
    assert int(last[0]) > 1000 and int(last[1]) > 0
    time.sleep(0.5)
    assert _processes_mentioning(f"tcp://{broker_address}") == [], "a child process outlived the demo"


def test_duration_stops_the_demo_by_itself(tmp_path):
    """--duration: the demo ends on its own, exit 0, its broker and every child gone, whatever it was doing then."""
    port = free_port()
    started = time.monotonic()
    demo = _demo(port, "--duration", "5", stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = demo.communicate(timeout=180)  # its start, 5 s, its stop
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 0, output
    assert time.monotonic() - started >= 5.0, output  # it ran its duration: not an early exit that looked clean
    assert re.search(r"metrics on http://\S+/metrics", output), output
    assert "stopped: broker, producer and service are down" in output, output
    broker_address = _broker_address(output)
    time.sleep(0.5)
    assert _processes_mentioning(f"tcp://{broker_address}") == [], "a child process outlived the demo"


def test_ctrl_c_stops_the_demo_cleanly(tmp_path):
    import signal

    port = free_port()
    demo = _demo(port, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(
            lambda: http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200 if _listening(port) else False,
            90,
            what="the demo's service",
        )
        demo.send_signal(signal.SIGINT)
        output, _ = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 0, output
    broker_address = _broker_address(output)
    assert _processes_mentioning(f"tcp://{broker_address}") == []


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_service_that_cannot_start_fails_the_demo_with_the_cause(tmp_path):
    """Metrics port taken: exit 1, a message naming the port and the flag, and the broker is gone too."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        demo = _demo(port, "--duration", "20", stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            stdout, stderr = demo.communicate(timeout=60)
        finally:
            if demo.poll() is None:
                demo.kill()
    assert demo.returncode == 1, stdout + stderr
    assert f"--metrics-port {port}: 127.0.0.1:{port} is in use" in stderr, stderr
    assert "Traceback" not in stderr, stderr  # the message says it all
    assert "stopped: broker, producer and service are down" not in stdout  # no success line after a failure
    broker_address = _broker_address(stdout)
    time.sleep(0.5)
    assert _processes_mentioning(f"tcp://{broker_address}") == [], "a child process outlived the demo"


def test_demo_with_delayed_labels_joins_them_and_scores_the_challengers(tmp_path):
    """--delayed-labels: applications now, outcomes 3 s later on a label topic; the service joins them."""
    import signal

    port = free_port()
    with open(tmp_path / "demo.out", "w") as out:  # the demo writes to its own copy of the descriptor
        demo = _demo(
            port, "--delayed-labels", "--duration", "120", "--rate", "1000", stdout=out, stderr=subprocess.STDOUT
        )
    try:
        try:
            wait_until(
                lambda: (_metric(port, 'perceptron_labels_total{outcome="joined"}') or 0) > 0,
                90,
                what="the demo to join labels",
            )
        except AssertionError as exc:  # what the demo said meanwhile: its status lines and any warning
            raise AssertionError(f"{exc}; the demo's output:\n{(tmp_path / 'demo.out').read_text()[-6000:]}") from None
        for challenger in ("plain", "pocket"):
            assert _metric(port, f'perceptron_challenger_mistake_rate{{challenger="{challenger}"}}') is not None, (
                challenger
            )
        demo.send_signal(signal.SIGINT)
        code = demo.wait(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
    log = (tmp_path / "demo.out").read_text()
    assert code == 0, log
    assert "stopped: broker, producer and service are down" in log
    assert int(re.findall(r" joined=(\d+) ", log)[-1]) > 0, log
