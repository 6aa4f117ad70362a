"""Limits that keep one event from stopping the service: an output the brokers refuse for good."""

from __future__ import annotations

import json

import pytest
from perceptron_stream.config import ServeSettings, load
from perceptron_stream.kafka.contract import RECORD_OVERHEAD_BYTES

from tests.support.endpoints import http_get
from tests.support.labels import label_topics
from tests.support.launch import settings_args, start_service_process
from tests.support.service import (
    OutputWatcher,
    exit_code,
    has_traceback,
    label_offset,
    stop_process,
    store_args,
    tail,
)
from tests.support.topics import consume, create_topic, produce, stable_offsets
from tests.support.waiting import wait_until


def _args(broker, names: dict, tmp_path, client: str, guarantee: str, **extra) -> list[str]:
    """The service's arguments on ``client`` under ``guarantee`` (exactly-once: a commit every 100 ms)."""
    timing = {"commit_interval_ms": 100} if guarantee == "exactly-once" else {}
    return settings_args(
        broker, names, tmp_path, kafka_client=client, processing_guarantee=guarantee, **timing, **extra
    )


def _wait_committed(settings, topic: str, offset: int) -> None:
    """Until the group's stable committed offset of ``topic``'s partition 0 is ``offset``."""
    wait_until(
        lambda: stable_offsets(settings, settings.group_id, topic).get(0) == offset,
        60,
        what=f"{topic}'s offsets committed up to {offset}",
    )


def test_an_output_the_brokers_refuse_becomes_a_dead_letter_and_the_stream_goes_on(
    broker, topics, tmp_path, service_thread, kafka_client
):
    """A 4.5 MB id makes a prediction larger than the producer's 4 MiB request limit: refused for good.

    Waiting for it would hold every later event (and the commits) forever; the
    service publishes a short dead letter pointing at the input instead.
    """
    from kafka import KafkaProducer

    create_topic(broker.bootstrap_servers, topics["input_topic"])
    events = [
        {"id": "a", "x": [1.0, 2.0], "y": 1},
        {"id": "i" * 4_500_000, "x": [1.0, 2.0], "y": 1},
        {"id": "c", "x": [1.0, 2.0], "y": -1},
    ]
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, acks="all", max_request_size=8 * 1024 * 1024)
    for i, e in enumerate(events):
        producer.send(topics["input_topic"], json.dumps(e).encode(), key=b"key-%d" % i)
    producer.flush()
    producer.close()

    service = service_thread(settings_args(broker, topics, tmp_path, max_message_bytes=6_000_000))
    predictions = consume(broker.bootstrap_servers, topics["output_topic"], 2)
    letters = consume(broker.bootstrap_servers, topics["dlq_topic"], 1)
    assert [json.loads(m.value)["source"]["offset"] for m in predictions] == [0, 2]
    assert json.loads(predictions[1].value)["model"]["seen"] == 3  # the refused event's prediction was made and learned
    (letter,) = letters
    body = json.loads(letter.value)
    assert letter.key is None and body["raw"] == "" and body["reason"] == "output_refused"
    assert body["source"] == {"topic": topics["input_topic"], "partition": 0, "offset": 1}
    assert "the brokers refused this event's output" in body["error"] and "MessageSizeTooLargeError" in body["error"]
    wait_until(
        lambda: (
            'perceptron_rejected_events_total{reason="output_refused"} 1.0'
            in http_get(service.metrics_url + "/metrics")[1]
        ),
        30,
        what="the refusal counted",
    )


def _refused_outputs_run(apache_kafka, topics, tmp_path, client: str, guarantee: str):
    """The service on Apache Kafka over a compacted output topic that takes records of at most 100,000 bytes and
    a dead-letter topic of at most 20,000: one valid point with a 200,000-character id, one input of 60,000 bytes
    that is no JSON, 50 valid points, then one valid point without a key (a compacted topic refuses a record
    without one). Returns the process, its log, and the predictions and dead letters."""
    bootstrap = apache_kafka.bootstrap_servers
    create_topic(bootstrap, topics["output_topic"], config={"max.message.bytes": "100000", "cleanup.policy": "compact"})
    create_topic(bootstrap, topics["dlq_topic"], config={"max.message.bytes": "20000"})
    valid = [{"id": f"e-{i}", "x": [1.0, float(i % 3)], "y": 1 if i % 2 else -1} for i in range(51)]
    values = [
        json.dumps(valid[0]).encode(),
        json.dumps({"id": "i" * 200_000, "x": [1.0, 2.0], "y": 1}).encode(),
        b"\x01" * 60_000,  # not JSON: its dead letter quotes its head, every byte escaped as \u0001
        *(json.dumps(e).encode() for e in valid[1:]),
        json.dumps({"id": "keyless", "x": [1.0, 1.0], "y": 1}).encode(),
    ]
    keys = [b"e-0", b"big", b"bad", *(f"e-{i}".encode() for i in range(1, 51)), None]
    produce(bootstrap, topics["input_topic"], values, keys=keys)
    exactly_once = guarantee == "exactly-once"
    args = _args(
        apache_kafka, topics, tmp_path, client, guarantee, **(store_args("kafka", topics) if exactly_once else {})
    )
    outputs = OutputWatcher(bootstrap, topics["output_topic"], read_committed=exactly_once).start()
    letters = OutputWatcher(bootstrap, topics["dlq_topic"], read_committed=exactly_once).start()
    log_path = tmp_path / "serve.log"
    process = start_service_process(args, log_path)
    return process, log_path, outputs, letters, args


@pytest.mark.parametrize("guarantee", ["at-least-once", "exactly-once"])
@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_an_output_larger_than_its_topic_allows_is_dead_lettered_and_the_service_goes_on(
    client, guarantee, apache_kafka, topics, tmp_path
):
    """An output topic with max.message.bytes=100000 and a valid point whose prediction would be 200 kB: the
    prediction is never sent (under exactly-once it would abort every retry of its transaction); an output_refused
    dead letter names the topic and its setting; the 50 events behind it are published and their offsets
    committed. A dead letter too large for its own topic is cut to fit, keeping its reason and source. The other
    refusal for good an output can meet, a record without a key on a compacted topic, goes the same way."""
    process, log_path, outputs, letters, args = _refused_outputs_run(apache_kafka, topics, tmp_path, client, guarantee)
    try:
        wait_until(
            lambda: (outputs.distinct() >= 51 and letters.distinct() >= 3) or process.poll() is not None,
            120,
            what="51 predictions and 3 dead letters",
        )
        assert process.poll() is None, f"exited with {process.returncode}:\n{tail(log_path)}"
        settings = load(ServeSettings, args)
        _wait_committed(settings, topics["input_topic"], 54)
        assert stop_process(process, log_path) == 0, tail(log_path)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        predicted, lettered = outputs.stop(), letters.stop()
    assert sorted(predicted) == [0, *range(3, 53)]
    assert all(len(values) == 1 for values in predicted.values())
    refused = json.loads(lettered[1][0])
    assert refused["reason"] == "output_refused" and refused["source"]["offset"] == 1
    assert f"exceeds max.message.bytes=100000 of topic {topics['output_topic']}" in refused["error"]
    (cut,) = lettered[2]
    assert len(cut) <= 20_000 - RECORD_OVERHEAD_BYTES
    letter = json.loads(cut)
    assert letter["reason"] == "invalid_json" and letter["raw_truncated"] and letter["raw"].startswith("\x01")
    assert letter["source"] == {"topic": topics["input_topic"], "partition": 0, "offset": 2}
    keyless = json.loads(lettered[53][0])
    assert keyless["reason"] == "output_refused" and keyless["source"]["offset"] == 53
    assert f"topic {topics['output_topic']} is compacted (cleanup.policy=compact)" in keyless["error"]
    assert sorted(lettered) == [1, 2, 53]
    assert not has_traceback(log_path.read_text(errors="replace")), tail(log_path)


#: Where the client matters: under at-least-once the Kafka store writes with kafka-python whichever client the
#: poll loop runs; under exactly-once the stream's producer (either client) writes into the transaction.
STATE_WRITERS = [("kafka-python", "at-least-once"), ("kafka-python", "exactly-once"), ("confluent", "exactly-once")]


@pytest.mark.parametrize(("client", "guarantee"), STATE_WRITERS)
def test_a_point_near_the_size_limit_is_kept_in_a_pending_changelog_of_the_brokers_defaults(
    client, guarantee, apache_kafka, topics, tmp_path
):
    """A point of 978,916 bytes whose feature names are quotes: its pending-changelog record was a JSON string of
    it inside JSON (every escape doubled: 1,879,113 bytes), which a changelog topic of the brokers' 1 MiB default
    refused forever while the service called the brokers silent, committed nothing, and exited 0 at SIGTERM. Kept
    as the JSON it is, it fits: its label joins, the span is checkpointed and committed."""
    bootstrap = apache_kafka.bootstrap_servers
    names = label_topics(apache_kafka, topics)
    pending = f"pending-{topics['group_id']}"
    create_topic(bootstrap, pending, config={"cleanup.policy": "compact"})  # max.message.bytes: the brokers'
    x = {f"{i:03d}" + '"' * 4_850: 1.0 for i in range(100)}
    big = json.dumps({"id": "big", "features": x}, separators=(",", ":")).encode()
    big += b" " * (978_916 - len(big))  # the finding's size
    produce(bootstrap, names["input_topic"], [big, {"id": "small", "features": {"a": 1.0}}], keys=[b"big", b"small"])
    exactly_once = guarantee == "exactly-once"
    args = _args(apache_kafka, names, tmp_path, client, guarantee, pending_topic=pending, **store_args("kafka", topics))
    predictions = OutputWatcher(bootstrap, names["output_topic"], read_committed=exactly_once).start()
    outcomes = OutputWatcher(bootstrap, names["outcome_topic"], read_committed=exactly_once, by=label_offset).start()
    log_path = tmp_path / "serve.log"
    process = start_service_process(args, log_path)
    try:
        wait_until(lambda: predictions.distinct() >= 2 or process.poll() is not None, 120, what="both predicted")
        assert process.poll() is None, f"exited with {process.returncode}:\n{tail(log_path)}"
        settings = load(ServeSettings, args)
        # checkpointed (and committed) with the big point pending: its change in the changelog
        _wait_committed(settings, names["input_topic"], 2)
        labels = [{"id": "big", "y": 1}, {"id": "small", "y": -1}]
        produce(bootstrap, names["label_topic"], labels, keys=[b"big", b"small"])
        wait_until(lambda: outcomes.distinct() >= 2 or process.poll() is not None, 120, what="both labels joined")
        assert process.poll() is None, f"exited with {process.returncode}:\n{tail(log_path)}"
        _wait_committed(settings, names["label_topic"], 2)
        assert stop_process(process, log_path) == 0, tail(log_path)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        joined = outcomes.stop()
        predictions.stop()
    assert {json.loads(values[0])["id"] for values in joined.values()} == {"big", "small"}
    log = log_path.read_text(errors="replace")
    assert "do not answer" not in log and not has_traceback(log), tail(log_path)


def test_a_compacted_dead_letter_topic_is_refused_at_start_up_naming_it(apache_kafka, topics, tmp_path):
    """It would refuse the dead letter of every input without a key, for good: said before anything is read."""
    create_topic(apache_kafka.bootstrap_servers, topics["dlq_topic"], config={"cleanup.policy": "compact"})
    log_path = tmp_path / "serve.log"
    assert exit_code(settings_args(apache_kafka, topics, tmp_path), log_path) == 1
    log = log_path.read_text(errors="replace")
    assert f"dead-letter topic {topics['dlq_topic']} is compacted (cleanup.policy=compact)" in log, tail(log_path)
    assert "cleanup.policy=delete" in log and not has_traceback(log), tail(log_path)


@pytest.mark.parametrize(("client", "guarantee"), STATE_WRITERS)
def test_a_checkpoint_larger_than_its_topic_allows_stops_the_service_naming_the_topic_and_setting(
    client, guarantee, apache_kafka, topics, tmp_path
):
    """A write that can never succeed: before, retried every few seconds as "the brokers do not answer" while
    nothing was committed (at-least-once), or a transaction aborted again on each restart (exactly-once)."""
    bootstrap = apache_kafka.bootstrap_servers
    store = store_args("kafka", topics)
    create_topic(
        bootstrap, store["checkpoint_topic"], config={"cleanup.policy": "compact", "max.message.bytes": "4000"}
    )
    produce(bootstrap, topics["input_topic"], [{"features": {f"f{i}": 1.0 for i in range(300)}, "y": 1}] * 5)
    args = _args(apache_kafka, topics, tmp_path, client, guarantee, **store)
    log_path = tmp_path / "serve.log"
    assert exit_code(args, log_path) == 1, tail(log_path)
    log = log_path.read_text(errors="replace")
    assert f"exceeds max.message.bytes=4000 of topic {store['checkpoint_topic']}" in log, tail(log_path)
    assert "do not answer" not in log and not has_traceback(log), tail(log_path)
