"""A fatal error raised by the service's own rebalance callback stops `serve`, on both clients and a real broker.

The callbacks run inside the client's poll. kafka-python 3.0.12 logs what a
listener raised and raises a plain KafkaError in its place ("User rebalance
callback throws an error"), which the service took for brokers that are away
and retried forever; librdkafka's rebalance must not be raised into, and the
error was logged and dropped. Here the service process's ``on_assigned`` or
``on_revoked`` raises a StartupError (as a restore that finds foreign state
does): the process must exit 1 naming it, once, without a traceback.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from kafka import KafkaConsumer

from tests.support import ROOT
from tests.support.launch import settings_args
from tests.support.service import has_traceback, make_events, tail, wait_assigned
from tests.support.topics import produce

pytestmark = pytest.mark.integration

PROBLEM = "the test's fatal problem"

#: `serve`, with one of the rebalance callbacks (perceptron_stream.runtime.partitions.Assignments) raising StartupError
SERVE_WITH_FAILING_CALLBACK = textwrap.dedent("""
    import sys
    from perceptron_stream.cli import main
    from perceptron_stream.runtime.partitions import Assignments
    from perceptron_stream.runtime.retry import StartupError

    callback = sys.argv[1]
    original = getattr(Assignments, callback)

    def fail(self, partitions):
        if not partitions:  # kafka-python revokes nothing before the first join
            return original(self, partitions)
        raise StartupError(f"{problem} in {callback}")

    setattr(Assignments, callback, fail)
    sys.exit(main(["serve", *sys.argv[2:]]))
""").replace("{problem}", PROBLEM)


def _start(callback: str, args: list[str], log_path) -> subprocess.Popen:
    with open(log_path, "ab") as log:  # the child has its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-c", SERVE_WITH_FAILING_CALLBACK, callback, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )


def _exit_code(process: subprocess.Popen, timeout: float = 30.0) -> int | None:
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        return None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _check_stopped(code: int | None, log_path, callback: str) -> None:
    log = log_path.read_text()
    assert code == 1, f"exit {code}:\n{log[-3000:]}"
    assert f"{PROBLEM} in {callback}" in log, log[-3000:]
    assert "retrying" not in log and "trying again later" not in log, log[-3000:]  # not taken for brokers that are away
    assert not has_traceback(log), log[-3000:]


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
@pytest.mark.parametrize("kafka_broker", ["apache-kafka"], indirect=True)
def test_a_fatal_error_in_on_assigned_stops_the_service(kafka_broker, topics, tmp_path, client):
    produce(kafka_broker.bootstrap_servers, topics["input_topic"], make_events(10, seed=3))
    args = settings_args(kafka_broker, topics, tmp_path, kafka_client=client, state_store="none")
    log_path = tmp_path / "serve.log"
    _check_stopped(_exit_code(_start("on_assigned", args, log_path)), log_path, "on_assigned")


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_a_fatal_error_in_on_revoked_stops_the_service(broker, topics, tmp_path, client):
    """The revocation comes when another member joins the group (a plain consumer here)."""
    produce(broker.bootstrap_servers, topics["input_topic"], make_events(10, seed=3))
    args = settings_args(broker, topics, tmp_path, kafka_client=client, state_store="none")
    log_path = tmp_path / "serve.log"
    process = _start("on_revoked", args, log_path)
    other = None
    try:
        wait_assigned(process, log_path, topics["input_topic"])
        other = KafkaConsumer(
            topics["input_topic"],
            bootstrap_servers=broker.bootstrap_servers,
            group_id=topics["group_id"],
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
            enable_auto_commit=False,
        )
        for _ in range(100):  # the other member joins inside its polls
            other.poll(timeout_ms=100)
            if process.poll() is not None:
                break
        code = _exit_code(process)
    finally:
        if other is not None:
            other.close(autocommit=False)
        if process.poll() is None:
            process.kill()
            process.wait()
    assert code is not None, tail(log_path)
    _check_stopped(code, log_path, "on_revoked")
