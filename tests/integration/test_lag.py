"""perceptron_consumer_lag: messages between the service's position and the end of each input partition.

On Apache Kafka the end offsets are exact (ListOffsets LATEST answers the
high watermark), so the lag is too: M - N when N of M events are read, with
no allowance, whichever client reads them. The embedded broker answers
ListOffsets LATEST short (the start of the last batch + 1): its own test,
marked ``embedded_only``, shows by how much, and that the fetch responses'
high watermarks (which the service uses while records flow) are exact there.
"""

from __future__ import annotations

import re
import threading
import time

import pytest
from perceptron_stream.config import KafkaSettings
from perceptron_stream.kafka import KafkaUnavailable

from tests.support.endpoints import http_get
from tests.support.launch import settings_args
from tests.support.streams import open_test_stream
from tests.support.topics import create_topic, produce
from tests.support.waiting import wait_until

CLIENTS = ["kafka-python", "confluent"]


def poll_exactly(io, count: int, timeout: float = 60.0) -> list:
    """``count`` records of the stream, never one more (each poll asks for what is missing)."""
    records: list = []
    deadline = time.monotonic() + timeout
    while len(records) < count and time.monotonic() < deadline:
        records += [r for batch in io.poll(100, count - len(records)) for r in batch]
    assert len(records) == count, f"polled {len(records)} of {count} records"
    return records


def lag_gauge(metrics_url: str, topic: str, partition: int = 0) -> float | None:
    status, text = http_get(metrics_url + "/metrics")
    assert status == 200, status
    match = re.search(
        rf'^perceptron_consumer_lag{{partition="{partition}",topic="{re.escape(topic)}"}} (\S+)$', text, re.M
    )
    return float(match.group(1)) if match else None


def events(count: int, start: int = 0) -> list[dict]:
    return [
        {"id": f"e{i}", "x": [1.0, float(i % 5) - 2.0], "y": 1 if i % 3 else -1} for i in range(start, start + count)
    ]


@pytest.mark.parametrize("client", CLIENTS)
def test_the_streams_lag_is_exact_on_apache_kafka(apache_kafka, topics, client):
    total, read = 300, 120
    produce(apache_kafka.bootstrap_servers, topics["input_topic"], [b"v%d" % i for i in range(total)])
    io = open_test_stream(KafkaSettings(bootstrap_servers=apache_kafka.bootstrap_servers), client, topics)
    try:
        records = poll_exactly(io, read)
        assert [r.offset for r in records] == list(range(read))
        tp = (topics["input_topic"], 0)
        assert io.lag(timeout_s=10, ask_broker=True) == {tp: total - read}  # ListOffsets: the end, exactly
        assert io.lag(ask_broker=False) == {tp: total - read}  # the fetch responses' high watermark
        poll_exactly(io, total - read)
        assert io.lag(timeout_s=10, ask_broker=True) == {tp: 0} == io.lag(ask_broker=False)
    finally:
        io.close()


@pytest.mark.embedded_only
@pytest.mark.parametrize("client", CLIENTS)
def test_the_embedded_brokers_end_offsets_read_short_its_high_watermarks_do_not(broker, topics, client):
    """Why the embedded broker's lag reads low (docs: operations/metrics.md): Tansu answers ListOffsets LATEST with
    the start of the partition's last batch + 1, not its end. Records written in one batch then read as a lag of at
    most 1; the fetch responses' high watermark is exact. The allowance lives here, and only here."""
    from kafka import KafkaProducer

    total, read = 300, 120
    create_topic(broker.bootstrap_servers, topics["input_topic"])
    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap_servers, acks="all", linger_ms=60_000, batch_size=1 << 20
    )
    try:
        for i in range(total):  # one batch: nothing is sent before the flush
            producer.send(topics["input_topic"], b"v%d" % i, partition=0)
        producer.flush(30)
    finally:
        producer.close()
    io = open_test_stream(KafkaSettings(bootstrap_servers=broker.bootstrap_servers), client, topics)
    try:
        poll_exactly(io, read)
        tp = (topics["input_topic"], 0)
        assert io.lag(ask_broker=False) == {tp: total - read}
        asked = io.lag(timeout_s=10, ask_broker=True)[tp]
        assert asked == 0 < total - read  # the end offset read: 1 (the batch's start + 1), below the position
    finally:
        io.close()


@pytest.mark.parametrize("client", CLIENTS)
def test_a_stalled_service_reports_exactly_the_events_it_has_not_processed(
    apache_kafka, topics, tmp_path, client, service_thread, caplog, monkeypatch
):
    """N of M processed, then stalled: the gauge says M - N, exactly.

    The stall is the service's own: a newcomer of group scope processes
    nothing while another member is in its consumer group (a crashed
    instance's session, OneInstance), and meanwhile probes the brokers for
    the lag every few seconds. Here the other member is a plain consumer of
    the group that stays for the test's length. The service would conclude
    that another instance runs OTHERS_LEAVE_WAIT_S (12 s) after its first
    look, and stop: it runs in this process, so that wait is made longer
    than the test, whose reads may take more than 12 s on a loaded machine.
    """
    from kafka import KafkaConsumer
    from perceptron_stream.runtime import partitions

    monkeypatch.setattr(partitions, "OTHERS_LEAVE_WAIT_S", 600.0)

    total, processed = 500, 200
    bootstrap = apache_kafka.bootstrap_servers
    other_topic = (
        f"other-{topics['input_topic']}"  # the other member's, made first: its metadata is there when it joins
    )
    create_topic(bootstrap, other_topic)
    produce(bootstrap, topics["input_topic"], events(processed))
    args = settings_args(apache_kafka, topics, tmp_path, kafka_client=client)
    first = service_thread(args)
    wait_until(
        lambda: (
            f'perceptron_events_total{{kind="labeled"}} {processed}.0' in http_get(first.metrics_url + "/metrics")[1]
        ),
        60,
        what=f"{processed} events processed",
    )
    assert first.stop() == 0  # its final checkpoint and commit: at `processed`
    produce(bootstrap, topics["input_topic"], events(total - processed, start=processed))

    squatter = KafkaConsumer(bootstrap_servers=bootstrap, group_id=topics["group_id"], enable_auto_commit=False)
    stop = threading.Event()
    try:
        # its topic's partitions known before it joins: as the group's leader it assigns from its metadata, and with
        # none for its topic it took nothing and was not given the topic later (seen under load: the join "timed out")
        wait_until(lambda: squatter.partitions_for_topic(other_topic), 30, what=f"metadata of {other_topic}")
        squatter.subscribe([other_topic])
        wait_until(
            lambda: squatter.poll(timeout_ms=100) is not None and squatter.assignment(),
            60,
            what="the other member's join",
        )

        def keep_polling():  # it must rejoin when the service joins, or the rebalance waits for it
            while not stop.is_set():
                squatter.poll(timeout_ms=100)

        poller = threading.Thread(target=keep_polling, daemon=True)
        poller.start()
        stalled = service_thread(args)
        log_line = f"consumer group {topics['group_id']} has 1 other member(s): processing nothing until they leave"
        try:
            wait_until(lambda: log_line in caplog.text, 60, what="the service to wait for the other member")
        except AssertionError as exc:  # (once in CI under load: what the service said meanwhile, to know why)
            said = "\n".join(caplog.text.splitlines()[-40:])
            raise AssertionError(f"{exc}; the log's last lines:\n{said}") from None
        # the lag is probed at the assignment, then every LAG_EVERY_S (5 s)
        wait_until(lambda: lag_gauge(stalled.metrics_url, topics["input_topic"]) is not None, 60, what="the lag gauge")
        text = http_get(stalled.metrics_url + "/metrics")[1]
        assert lag_gauge(stalled.metrics_url, topics["input_topic"]) == total - processed, text
        assert 'perceptron_events_total{kind="labeled"} 0.0' in text  # stalled indeed: nothing processed by it
        assert stalled.stop() == 0
    finally:
        stop.set()
        squatter.close()


@pytest.mark.parametrize("own_broker", ["apache-kafka"], indirect=True)
@pytest.mark.parametrize("client", CLIENTS)
def test_the_probe_asks_the_brokers_with_no_partition_assigned(own_broker, topics, client):
    """A 6 s session lost in an outage revokes every partition; a probe that then asked nothing never learned the
    brokers were away, and the service said no outage at all (once in CI: test_log_lines' broker kill, on
    confluent-kafka, waited 60 s for the line). With nothing assigned, the probe still asks: it answers while the
    brokers do and fails when they are gone."""
    produce(own_broker.bootstrap_servers, topics["input_topic"], [b"v"])
    io = open_test_stream(KafkaSettings(bootstrap_servers=own_broker.bootstrap_servers), client, topics)
    try:
        assert io.assignment() == []  # no poll yet: nothing assigned
        assert io.lag(timeout_s=10, ask_broker=True) == {}
        own_broker.kill()
        with pytest.raises(KafkaUnavailable):
            io.lag(timeout_s=2, ask_broker=True)
        assert io.lag(ask_broker=False) == {}  # no request: nothing to fail
    finally:
        io.close()
