"""The confluent-kafka client (perceptron_stream.kafka.confluent) against the embedded broker, over TCP.

First the stream object alone (KafkaIO's contract: poll, seeks made in
on_assigned, send/flush with retries, commit, lag, never hanging on frozen
brokers), then the service on this client. The service's own end-to-end tests
(test_service.py, test_limits.py) run on both clients through the
``kafka_client`` fixture (tests/integration/conftest.py).
"""

from __future__ import annotations

import contextlib
import time

import pytest
from kafka import errors as kerrors
from perceptron_stream.broker import EmbeddedBroker
from perceptron_stream.config import KafkaSettings
from perceptron_stream.kafka import (
    BEGINNING,
    DeliveryError,
    KafkaUnavailable,
    committed_offsets,
    confluent,
)
from perceptron_stream.kafka.confluent import ConfluentIO

from tests.support.topics import consume, create_topic, produce
from tests.support.waiting import wait_until


def _io(bootstrap: str, topics: dict, on_assigned=None, on_revoked=None, auto_offset_reset="earliest") -> ConfluentIO:
    return ConfluentIO(
        KafkaSettings(bootstrap_servers=bootstrap),
        group_id=topics["group_id"],
        topics=[topics["input_topic"]],
        auto_offset_reset=auto_offset_reset,
        on_assigned=on_assigned or (lambda partitions: None),
        on_revoked=on_revoked or (lambda partitions: None),
        max_poll_records=1000,
        fetch_max_wait_ms=20,
    )


def _poll_until(io: ConfluentIO, count: int, max_records: int = 1000, timeout: float = 30.0) -> list:
    records: list = []
    deadline = time.monotonic() + timeout
    while len(records) < count and time.monotonic() < deadline:
        records += [r for batch in io.poll(100, min(max_records, count - len(records))) for r in batch]
    assert len(records) == count, f"polled {len(records)} of {count} records"
    return records


#: How much longer than its own timeout a call may take on a busy machine before it counts as not giving up in time:
#: far below the 30-60 s librdkafka waits for a broker when a call ignores the timeout it was given.
SLACK_S = 8.0


@contextlib.contextmanager
def within(timeout_s: float):
    """The block returns within ``timeout_s`` plus :data:`SLACK_S`."""
    started = time.monotonic()
    yield
    took = time.monotonic() - started
    assert took < timeout_s + SLACK_S, f"took {took:.1f} s for a timeout of {timeout_s} s"


def _first_occurrences(values: list) -> list:
    return list(dict.fromkeys(values))  # at-least-once: a value sent again may be stored twice


# the stream object ----------------------------------------------------------
def test_poll_send_flush_commit_and_lag(broker, topics):
    bootstrap, topic = broker.bootstrap_servers, topics["input_topic"]
    produce(bootstrap, topic, [b"v%d" % i for i in range(300)], keys=[b"k%d" % i for i in range(300)])
    create_topic(bootstrap, topics["output_topic"])
    assigned: list = []
    io = _io(bootstrap, topics, on_assigned=assigned.append)
    try:
        records = _poll_until(io, 100, max_records=40)
        assert assigned == [[(topic, 0)]] and io.assignment() == [(topic, 0)]
        assert [(r.topic, r.partition, r.offset, r.key, r.value) for r in records] == [
            (topic, 0, i, b"k%d" % i, b"v%d" % i) for i in range(100)
        ]
        assert all(r[5] > 1_600_000_000_000 for r in records)  # CreateTime, ms
        assert io.lag(ask_broker=False) == {(topic, 0): 200}  # the fetch responses' high watermark
        # lag(ask_broker=True), exact on Apache Kafka and short on this broker: tests/integration/test_lag.py

        for r in records:
            io.send(topics["output_topic"], r.key, r.value)
        assert io.flush(timeout_s=10) == []
        out = consume(bootstrap, topics["output_topic"], 100)
        assert [(m.key, m.value) for m in out] == [(r.key, r.value) for r in records]

        io.commit({(topic, 0): 100, (topic, 7): 5}, timeout_s=10)  # partition 7 is not ours: left out
        assert committed_offsets(KafkaSettings(bootstrap_servers=bootstrap), topics["group_id"], topic) == {0: 100}
        # what consume() returned while the commit waited for its answer comes next, once
        assert [r.offset for r in _poll_until(io, 200, max_records=150)] == list(range(100, 300))
        assert io.poll(200, 100) == []
    finally:
        io.close()


def test_paused_partitions_give_nothing_until_resumed_and_records_put_back_come_again(broker, topics):
    """What the service does while a crashed member is still in its group (perceptron_stream.runtime.partitions.OneInstance.check)."""
    bootstrap, topic = broker.bootstrap_servers, topics["input_topic"]
    produce(bootstrap, topic, [b"v%d" % i for i in range(50)])
    io = _io(bootstrap, topics)
    try:
        first = _poll_until(io, 50)
        io.pause()
        io.seek(topic, 0, first[0].offset)  # put back what was polled
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            assert io.poll(100, 1000) == []
        io.resume()
        assert [r.value for r in _poll_until(io, 50)] == [b"v%d" % i for i in range(50)]
    finally:
        io.close()


def test_seeks_made_in_on_assigned_start_the_assignment_there(broker, topics):
    bootstrap, topic = broker.bootstrap_servers, topics["input_topic"]
    create_topic(bootstrap, topic, partitions=3)
    for p in range(3):
        produce(bootstrap, topic, [b"p%d-%d" % (p, i) for i in range(30)], partition=p)
    first = _io(bootstrap, topics)
    try:
        wait_until(lambda: first.poll(100, 1) is not None and first.assignment(), 30, what="the first assignment")
        first.commit({(topic, 0): 20, (topic, 1): 20, (topic, 2): 20}, timeout_s=10)
    finally:
        first.close()

    io: ConfluentIO | None = None

    def on_assigned(partitions):  # p0 from its committed offset, p1 from 5, p2 from its start (not 'latest')
        assert io is not None  # called back inside its poll
        assert partitions == [(topic, 0), (topic, 1), (topic, 2)]
        io.seek(topic, 1, 5)
        io.seek(topic, 2, BEGINNING)

    io = _io(bootstrap, topics, on_assigned=on_assigned, auto_offset_reset="latest")
    try:
        records = _poll_until(io, 10 + 25 + 30)
        starts = {p: min(r.offset for r in records if r.partition == p) for p in range(3)}
        assert starts == {0: 20, 1: 5, 2: 0}
        assert sorted((r.partition, r.offset) for r in records) == sorted({(r.partition, r.offset) for r in records})
        assert io.lag(ask_broker=False) == {(topic, 0): 0, (topic, 1): 0, (topic, 2): 0}

        io.seek(topic, 1, 25)  # outside the callback: a plain seek
        again = _poll_until(io, 5)
        assert [(r.partition, r.offset) for r in again] == [(1, o) for o in range(25, 30)]
    finally:
        io.close()


def test_a_full_local_queue_is_waited_out_and_a_message_too_large_is_returned(broker, topics, monkeypatch):
    monkeypatch.setattr(confluent, "PRODUCER", {**confluent.PRODUCER, "queue.buffering.max.messages": 10})
    create_topic(broker.bootstrap_servers, topics["output_topic"])
    io = _io(broker.bootstrap_servers, topics)
    try:
        for i in range(100):
            io.send(topics["output_topic"], None, b"%d" % i)
        io.send(topics["output_topic"], b"big", b"x" * (5 * 1024 * 1024))  # above message.max.bytes
        io.send(topics["output_topic"], None, b"100")
        (refused,) = io.flush(timeout_s=30)
        assert refused.key == b"big" and isinstance(refused.error, kerrors.MessageSizeTooLargeError)
        values = [m.value for m in consume(broker.bootstrap_servers, topics["output_topic"], 101)]
        assert values == [b"%d" % i for i in range(101)]
    finally:
        io.close()


def test_frozen_brokers_fail_flushes_commits_and_probes_in_time_and_nothing_is_lost(tmp_path, topics, monkeypatch):
    """SIGSTOP/SIGCONT of a broker of this test's own (the session's broker is shared).

    "In time" is each call's own bound, not a sum over a busy machine: every
    call must give up within its timeout plus a margin (SLACK_S) far below the
    clients' own defaults (librdkafka waits 30-60 s for a frozen broker), so a
    call that ignored its timeout still fails here, while a loaded machine's
    scheduling delays do not. (The old bound, 4.5 s for all four calls
    together, failed once in a full run under load.) A pause that outlasts the
    group's session (6 s) on a slow machine is no failure either: the commit
    after it polls, which joins the group again.
    """
    monkeypatch.setattr(confluent, "PRODUCER", {**confluent.PRODUCER, "message.timeout.ms": 1000, "linger.ms": 100})
    monkeypatch.setattr(confluent, "CLOSE_TIMEOUT_S", 1.0)
    with EmbeddedBroker(log_path=tmp_path / "tansu.log") as own:
        topic, tp = topics["input_topic"], (topics["input_topic"], 0)
        produce(own.bootstrap_servers, topic, [b"in"] * 20)
        create_topic(own.bootstrap_servers, topics["output_topic"])
        io = _io(own.bootstrap_servers, topics)
        closed = False
        try:
            _poll_until(io, 20)
            for i in range(5):
                io.send(topics["output_topic"], None, b"%d" % i)
            assert io.flush(timeout_s=10) == []

            own.pause()
            try:
                for i in range(5, 10):
                    io.send(topics["output_topic"], None, b"%d" % i)
                with within(2.0), pytest.raises(DeliveryError):
                    io.flush(timeout_s=2.0)  # failed after 1 s, sent again on a new producer, still waiting
                with within(0.5), pytest.raises(KafkaUnavailable):
                    io.commit({tp: 20}, timeout_s=0.5)
                with (
                    within(0.5),
                    pytest.raises(KafkaUnavailable),
                ):  # queued behind the first one: librdkafka keeps them in order
                    io.commit({tp: 20}, timeout_s=0.5)
                with within(0.5), pytest.raises(KafkaUnavailable):
                    io.lag(timeout_s=0.5, ask_broker=True)
            finally:
                own.resume()
            assert io.flush(timeout_s=30) == []
            values = [m.value for m in consume(own.bootstrap_servers, topics["output_topic"], 10)]
            assert _first_occurrences(values) == [b"%d" % i for i in range(10)]

            def committed() -> bool:
                io.poll(100, 1)  # a group the pause outlasted is joined again
                try:
                    io.commit({tp: 20}, timeout_s=2)
                    return True
                except KafkaUnavailable:
                    return False

            wait_until(committed, 30, what="a commit once the broker is back")

            own.pause()  # close with a commit stuck in flight: librdkafka's close would wait for it
            try:
                with pytest.raises(KafkaUnavailable):
                    io.commit({tp: 20}, timeout_s=0.2)
                with within(confluent.CLOSE_TIMEOUT_S * 3):  # the consumer's and the producer's close, and the commit
                    io.close()
                closed = True
            finally:
                own.resume()
        finally:
            if not closed:
                io.close()


# the service on this client ---------------------------------------------------
# (its end-to-end tests in test_service.py and test_limits.py also run on it: the kafka_client fixture)
def test_a_restart_right_after_a_kill_waits_for_the_dead_member_then_goes_on(broker, topics, tmp_path):
    """A restart while the killed run is still in the group goes on once it is gone, and ends exactly where an
    uninterrupted run does (kafka-python: test_crash, where the newcomer waits with its partitions paused)."""
    from tests.support.launch import settings_args, start_service_process
    from tests.support.service import (
        OutputWatcher,
        check_outputs,
        final_checkpoint,
        make_events,
        offline,
        stop_process,
        tail,
    )
    from tests.support.topics import produce
    from tests.support.waiting import wait_until

    events = make_events(3000, seed=31)
    expected, model = offline(events)
    produce(broker.bootstrap_servers, topics["input_topic"], events[:1500])
    args = settings_args(
        broker, topics, tmp_path, batch_size=100, checkpoint_interval_events=500, kafka_client="confluent"
    )
    watcher = OutputWatcher(broker.bootstrap_servers, topics["output_topic"]).start()
    try:
        first = start_service_process(args, tmp_path / "serve-1.log")
        wait_until(lambda: watcher.distinct() >= 1000 or first.poll() is not None, 60, what="1000 predictions")
        first.kill()
        first.wait()
        produce(broker.bootstrap_servers, topics["input_topic"], events[1500:])  # work for the next run alone
        second = start_service_process(args, tmp_path / "serve-2.log")
        try:
            wait_until(
                lambda: watcher.distinct() >= len(events) or second.poll() is not None,
                90,
                what="every offset predicted",
            )
            assert second.poll() is None, tail(tmp_path / "serve-2.log")
        finally:
            assert stop_process(second, tmp_path / "serve-2.log") == 0, tail(tmp_path / "serve-2.log")
        watcher.settle()
    finally:
        by_source = watcher.stop()
    log = (tmp_path / "serve-2.log").read_text()
    # librdkafka's join itself may wait out the dead member (its first assignment then comes after the eviction),
    # or the newcomer finds it in the group and waits with its partitions paused; never an exit as a second instance
    assert "other active member" not in log, log[-3000:]
    check_outputs(by_source, expected)
    assert final_checkpoint(args, "local").model == model
