"""One line per outage of the brokers (perceptron_stream.runtime.outage), the clients' own loggers quiet meanwhile."""

from __future__ import annotations

import logging

import pytest
from kafka.errors import CoordinatorNotAvailableError, KafkaTimeoutError
from perceptron_stream.kafka.errors import service_error
from perceptron_stream.runtime.health import Health
from perceptron_stream.runtime.outage import COORDINATOR_PATIENCE_S, QUIETED, Outage

KAFKA_PYTHON = logging.getLogger("kafka.net.manager")  # where kafka-python logs a refused connection
LIBRDKAFKA = logging.getLogger("perceptron_stream.kafka.confluent")  # where librdkafka's log and errors go


@pytest.fixture(autouse=True)
def levels():
    """The quieted loggers' levels as the command line sets them (INFO; kafka-python's at WARNING), put back after."""
    before = {name: logging.getLogger(name).level for name in (*QUIETED, "perceptron_stream")}
    logging.getLogger("perceptron_stream").setLevel(logging.INFO)
    logging.getLogger("perceptron_stream.kafka").setLevel(logging.NOTSET)
    logging.getLogger("kafka").setLevel(logging.WARNING)
    yield
    for name, level in before.items():
        logging.getLogger(name).setLevel(level)


def _clients_speak() -> None:
    # lines the clients' noise filters let through (a refused connection is a DEBUG line of theirs at any time)
    KAFKA_PYTHON.error("Did you attempt to connect to a kafka controller (no metadata support)?")
    LIBRDKAFKA.warning("kafka client: 127.0.0.1:1/bootstrap: SASL authentication error: Authentication failed")


def _said(caplog, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == name]


def test_an_outage_is_one_line_with_the_setting_and_the_clients_are_quiet_until_it_ends(caplog):
    outage = Outage("kafka-1:9092,kafka-2:9092")
    caplog.set_level(logging.DEBUG, logger="")  # caplog's handler takes all; the loggers' levels decide
    assert outage.failed("check the topics", TimeoutError("Unable to bootstrap")) is True
    for _ in range(20):  # twenty more attempts, and the clients' own lines for each
        assert outage.failed("check the topics", TimeoutError("Unable to bootstrap")) is False
        _clients_speak()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("the brokers at kafka-1:9092,kafka-2:9092 do not answer (could not check the topics")
    assert "bootstrap_servers (--bootstrap-servers, PERCEPTRON_STREAM_BOOTSTRAP_SERVERS)" in warnings[0]
    assert outage.on and outage.failures == 21

    caplog.clear()
    outage.answered()
    [back] = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert back.startswith("the brokers at kafka-1:9092,kafka-2:9092 answer again, after ") and "21 failed" in back
    assert not outage.on
    _clients_speak()  # heard again
    assert _said(caplog, "kafka.net.manager") and _said(caplog, "perceptron_stream.kafka.confluent")


def test_a_second_outage_is_said_again():
    outage = Outage()
    assert outage.failed("send the outputs", OSError("x"))
    outage.answered()
    outage.answered()  # no outage: nothing to end
    assert outage.failed("send the outputs", OSError("x"))


def test_hushed_at_start_up_until_the_brokers_first_answer(caplog):
    caplog.set_level(logging.DEBUG, logger="")
    outage = Outage()
    outage.hush()
    _clients_speak()
    assert not _said(caplog, "kafka.net.manager") and not _said(caplog, "perceptron_stream.kafka.confluent")
    outage.answered()
    assert not caplog.records  # no outage began: nothing to say
    _clients_speak()
    assert _said(caplog, "kafka.net.manager") and _said(caplog, "perceptron_stream.kafka.confluent")
    assert logging.getLogger("kafka").level == logging.WARNING  # as it was


def test_log_level_debug_quiets_nothing(caplog):
    caplog.set_level(logging.DEBUG, logger="")
    logging.getLogger("perceptron_stream").setLevel(logging.DEBUG)
    outage = Outage()
    outage.failed("check the topics", TimeoutError("x"))
    outage.failed("check the topics", TimeoutError("x"))
    _clients_speak()
    assert _said(caplog, "kafka.net.manager") and _said(caplog, "perceptron_stream.kafka.confluent")
    assert any("still do not answer" in r.getMessage() for r in caplog.records)  # the later failures, at DEBUG


def test_a_coordinator_not_available_yet_is_said_as_such_not_as_brokers_that_do_not_answer(caplog, monkeypatch):
    """A new cluster's first group meets CoordinatorNotAvailableError for a second: the brokers answered. Saying
    "the brokers do not answer, check --bootstrap-servers" sent people checking a setting that was right."""
    caplog.set_level(logging.DEBUG, logger="")
    outage = Outage("kafka:9092")
    loading = service_error(CoordinatorNotAvailableError("FindCoordinatorResponse error for GROUP/g1"))
    assert outage.failed("read the group's committed offsets", loading) is True
    for _ in range(5):
        assert outage.failed("read the group's committed offsets", loading) is False
    said = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [r.levelno for r in said] == [logging.INFO], [r.getMessage() for r in said]  # one line, no warning
    text = said[0].getMessage()
    assert text.startswith("waiting for the coordinator (could not read the group's committed offsets: ")
    assert "CoordinatorNotAvailableError" in text and "the brokers at kafka:9092 answer" in text
    assert "do not answer" not in text and "--bootstrap-servers" not in text
    caplog.clear()
    assert outage.since is not None
    monkeypatch.setattr(outage, "since", outage.since - COORDINATOR_PATIENCE_S - 1)  # as if it had lasted
    outage.failed("read the group's committed offsets", loading)
    outage.failed("read the group's committed offsets", loading)
    [lasted] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]  # once it lasts: once
    assert lasted.startswith("still waiting for the coordinator after ") and "offsets.topic.replication" in lasted
    caplog.clear()
    outage.answered()
    [back] = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert back.startswith("the coordinator answers, after ") and "8 failed call(s)" in back
    assert "the brokers" not in back and not outage.on


def test_brokers_that_stop_answering_while_a_coordinator_is_awaited_are_an_outage(caplog):
    caplog.set_level(logging.DEBUG, logger="")
    outage = Outage("kafka:9092")
    outage.failed("read the group's committed offsets", service_error(CoordinatorNotAvailableError()))
    assert outage.failed("read the group's committed offsets", service_error(KafkaTimeoutError("no answer")))
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warning.startswith("the brokers at kafka:9092 do not answer") and "--bootstrap-servers" in warning
    caplog.clear()
    outage.answered()
    [back] = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert back.startswith("the brokers at kafka:9092 answer again")


def test_health_ends_the_outage_when_the_brokers_answer():
    health = Health(30.0, "b:9092")
    assert health.broker_failed("read points", TimeoutError("x")) and not health.broker_ok
    assert not health.broker_failed("read points", TimeoutError("x"))
    health.broker_ok = True
    assert health.broker_ok and not health.outage.on


def test_a_service_stopped_during_an_outage_gives_the_loggers_their_levels_back(tmp_path):
    """The demo and the tests run the service in a thread of a process that goes on: its quiet must end with it."""
    import threading

    from perceptron_stream.app import Application
    from perceptron_stream.broker import free_port
    from perceptron_stream.config import ServeSettings, load

    app = Application(
        load(
            ServeSettings,
            ["--bootstrap-servers", f"127.0.0.1:{free_port()}", "--metrics-port", "0", "--state-dir", str(tmp_path)],
        )
    )
    thread = threading.Thread(target=app.run, kwargs={"install_signal_handlers": False})
    thread.start()
    try:
        while app.http is None and thread.is_alive():
            thread.join(0.05)
        assert logging.getLogger("kafka").level == logging.CRITICAL  # hushed until the brokers answer
    finally:
        app.stop()
        thread.join(60)
    assert not thread.is_alive()
    assert logging.getLogger("kafka").level == logging.WARNING
    assert logging.getLogger("perceptron_stream.kafka").level == logging.NOTSET


def test_a_lasting_outage_is_said_again_once_a_minute_not_at_each_attempt(caplog, monkeypatch):
    """One line when it starts, one a minute while it lasts ("still no answer ... after N s"), one when it ends."""
    import perceptron_stream.runtime.outage as module

    now = [1000.0]
    monkeypatch.setattr(module.time, "monotonic", lambda: now[0])
    caplog.set_level(logging.DEBUG, logger="")
    outage = Outage("kafka-1:9092")
    outage.failed("send the outputs", TimeoutError("flush"))
    for _ in range(150):  # an attempt every second for 150 s
        now[0] += 1.0
        outage.failed("send the outputs", TimeoutError("flush"))
    outage.answered()
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert len(said) == 4, said  # the start, after 60 s, after 120 s, the end
    assert said[0].startswith("the brokers at kafka-1:9092 do not answer")
    assert said[1].startswith("still no answer from the brokers at kafka-1:9092 after 60 s (could not send the outputs")
    assert said[2].startswith("still no answer from the brokers at kafka-1:9092 after 120 s")
    assert "--bootstrap-servers" in said[1]
    assert said[3].startswith("the brokers at kafka-1:9092 answer again, after 150 s and 151 failed call(s)")
