"""The commands that talk to a broker: produce into the embedded broker, and the broker in the foreground.

The command line's checks that need no broker are tests/test_cli.py's.
"""

import errno
import json
import signal
import socket
import subprocess
import sys

import pytest
from perceptron_stream.broker import EmbeddedBroker
from perceptron_stream.cli import main

from tests.support import ROOT, SEED_003
from tests.support.topics import consume
from tests.support.waiting import wait_until


def test_produce_writes_a_seeded_stream_and_replays_files(broker, topics, tmp_path, capsys, signal_handlers):
    topic = topics["input_topic"]
    args = ["--bootstrap-servers", broker.bootstrap_servers, "--topic", topic, "--no-progress"]
    assert main(["produce", *args, "--stream", "credit", "--count", "300", "--seed", "7"]) == 0
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"wrote 300 messages to {topic}"  # acknowledged ones
    data = tmp_path / "d.csv"
    data.write_text(SEED_003)
    assert main(["produce", *args, "--file", str(data)]) == 0
    records = consume(broker.bootstrap_servers, topic, 305)
    events = [json.loads(r.value) for r in records]
    assert [e["id"] for e in events[:3]] == ["app-0", "app-1", "app-2"]
    assert set(events[0]["features"]) == {"age", "salary", "years_in_job", "debt"}
    assert records[0].key == b"app-0"
    assert events[300:] == [
        {"features": {"x1": 1.0, "x2": 2.0}, "y": 1},
        {"features": {"x1": 2.0, "x2": 4.0}, "y": 1},
        {"features": {"x1": 3.0, "x2": 4.0}, "y": 1},
        {"features": {"x1": 2.0, "x2": 1.0}, "y": -1},
        {"features": {"x1": 4.0, "x2": 2.0}, "y": -1},
    ]


def test_produce_exits_1_when_messages_are_not_acknowledged(broker, topics, tmp_path, capsys, signal_handlers):
    """A line over the client's 4 MiB request limit is refused; the others still go, and the run fails saying so."""
    topic = topics["input_topic"]
    data = tmp_path / "d.jsonl"
    good = [b'{"x": [1.0], "y": 1}', b'{"x": [2.0], "y": -1}', b'{"x": [3.0]}']
    data.write_bytes(b"\n".join([good[0], b'{"x": [' + b"1.0," * 1_500_000 + b"1.0]}", *good[1:]]) + b"\n")
    assert (
        main(
            [
                "produce",
                "--bootstrap-servers",
                broker.bootstrap_servers,
                "--topic",
                topic,
                "--file",
                str(data),
                "--no-progress",
            ]
        )
        == 1
    )
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "3 of 4 messages acknowledged" in last and "MessageSizeTooLargeError" in last, last
    assert [r.value for r in consume(broker.bootstrap_servers, topic, 3)] == good


def test_produce_command_through_pipes(broker, topics):
    """Not a terminal: no progress bar, no control codes, exit 0 and the acknowledged count last."""
    topic = topics["input_topic"]
    process = subprocess.run(
        [
            sys.executable,
            "-m",
            "perceptron_stream.cli",
            "produce",
            "--bootstrap-servers",
            broker.bootstrap_servers,
            "--topic",
            topic,
            "--stream",
            "noisy",
            "--count",
            "200",
            "--rate",
            "1000",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert process.returncode == 0, process.stderr
    assert process.stderr.strip().splitlines()[-1] == f"wrote 200 messages to {topic}"
    assert "\x1b[" not in process.stdout + process.stderr and process.stdout == ""
    assert len(consume(broker.bootstrap_servers, topic, 200)) == 200


def test_broker_command_serves_until_sigterm(tmp_path):
    from perceptron_stream.broker import free_port

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "perceptron_stream.cli", "broker", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    assert process.stdout is not None
    try:
        first = process.stdout.readline()
        assert f"127.0.0.1:{port}" in first

        admin = wait_until(lambda: _admin(port), 60, what="the broker to answer")
        admin.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()


def _admin(port):
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    try:
        return KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{port}", bootstrap_timeout_ms=2000)
    except KafkaError:
        return None


def test_the_broker_and_the_demo_on_a_port_another_process_listens_on_exit_2_naming_the_flag(capsys):
    """Tansu on a taken port panics in a thread and runs on, listening nowhere: the commands said "listening" and
    the clients talked to whatever held the port."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        assert main(["broker", "--port", str(port)]) == 2
        assert f"--port {port}: 127.0.0.1:{port} is in use" in capsys.readouterr().err
        assert main(["demo", "--broker-port", str(port), "--duration", "1", "--no-live"]) == 2
        assert f"--broker-port {port}: 127.0.0.1:{port} is in use" in capsys.readouterr().err


def test_a_broker_holds_the_port_it_picked_until_it_listens_there():
    """Between the pick and the broker's bind, no other pick of the OS gets that port (free_port's race: the
    broker on a port another process took, its pause pausing nothing), and the broker then listens on it."""
    broker = EmbeddedBroker()
    try:
        with socket.socket() as other, pytest.raises(OSError) as taken:
            other.bind(("127.0.0.1", broker.port))  # as another process's pick, or its listener, would
        assert taken.value.errno == errno.EADDRINUSE
        with broker:
            with socket.create_connection(("127.0.0.1", broker.port), timeout=5):
                pass
            assert broker.process is not None and broker.process.poll() is None
        assert broker.process is None  # stopped by the context
    finally:
        broker.stop()
