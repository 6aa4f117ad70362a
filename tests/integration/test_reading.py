"""What the service reads from what real producers write: every codec Kafka defines, committed records only.

Producers in other languages compress (Java and librdkafka producers are
often set to lz4 or zstd) and write in transactions (Kafka Streams or Quix
Streams with exactly-once); both clients must read all of it as it is meant:
every compressed event predicted, no record of an aborted transaction
predicted or learned.
"""

from __future__ import annotations

import json
import threading

import pytest
from confluent_kafka import Producer
from perceptron_stream.config import KafkaSettings
from perceptron_stream.kafka import KafkaFatal, KafkaIO, require_codecs
from perceptron_stream.learning import make_learner
from perceptron_stream.streams import separable

from tests.support.launch import settings_args
from tests.support.topics import consume, create_topic

CLIENTS = ["kafka-python", "confluent"]
CODECS = ["gzip", "snappy", "lz4", "zstd"]


def _events(count: int, seed: int) -> list[dict]:
    return [dict(e) for e, _ in zip(separable(dimensions=4, margin=0.05, noise=0.0, seed=seed), range(count))]


def _offline_model(events: list[dict]) -> dict:
    """The ``model`` field of the last prediction an uninterrupted run over ``events`` publishes."""
    learner = make_learner("plain")
    for e in events:
        learner.step(e["x"], e["y"])
    return {"version": learner.updates, "seen": learner.seen, "mistakes": learner.mistakes}


def _compressed(bootstrap: str, topic: str, events: list[dict], codec: str) -> None:
    """``events`` written by librdkafka with ``compression.type`` ``codec``, in batches of many records (each
    batch compressed as a whole, as a busy producer sends them)."""
    create_topic(bootstrap, topic)
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 50, "acks": "all"})
    for e in events:
        producer.produce(topic, json.dumps(e).encode(), e["id"].encode())
    assert producer.flush(30) == 0


@pytest.mark.parametrize("client", CLIENTS)
@pytest.mark.parametrize("codec", CODECS)
def test_compressed_events_are_all_predicted(codec, client, broker, topics, tmp_path, service_thread):
    events = _events(200, seed=CODECS.index(codec))
    _compressed(broker.bootstrap_servers, topics["input_topic"], events, codec)
    service = service_thread(settings_args(broker, topics, tmp_path, kafka_client=client))

    predictions = [json.loads(r.value) for r in consume(broker.bootstrap_servers, topics["output_topic"], len(events))]
    service.stop()

    assert [p["id"] for p in predictions] == [e["id"] for e in events]
    assert predictions[-1]["model"] == _offline_model(events)


def test_a_missing_codec_package_stops_the_service_at_start_up_naming_it(monkeypatch):
    from kafka import codec

    require_codecs()  # this installation has them all (the project's dependencies)
    monkeypatch.setattr(codec, "zstd", None)
    monkeypatch.setattr(codec, "snappy", None)
    with pytest.raises(KafkaFatal) as caught:
        require_codecs()
    assert "snappy, zstd" in str(caught.value) and "python-snappy, zstandard" in str(caught.value)
    assert "pip install python-snappy zstandard" in caught.value.hint


def test_records_in_a_codec_the_client_cannot_read_fail_every_poll_and_never_spin(broker, topics, monkeypatch):
    """kafka-python 3.0.12 alone raises once, then spins forever inside the next poll (issue 29): each poll here
    must end, with the fatal error naming the package to install."""
    from kafka import codec

    _compressed(broker.bootstrap_servers, topics["input_topic"], _events(50, seed=7), "zstd")
    monkeypatch.setattr(codec, "zstd", None)  # as if zstandard were not installed
    io = KafkaIO(
        KafkaSettings(bootstrap_servers=broker.bootstrap_servers),
        group_id=topics["group_id"],
        topics=[topics["input_topic"]],
        auto_offset_reset="earliest",
        on_assigned=lambda p: None,
        on_revoked=lambda p: None,
        max_poll_records=100,
        fetch_max_wait_ms=20,
    )
    failures: list[Exception] = []
    records: list = []

    def poll_until_two_failures():
        while len(failures) < 2:
            try:
                records.extend(io.poll(100, 100))
            except Exception as exc:
                failures.append(exc)

    try:
        polling = threading.Thread(target=poll_until_two_failures, daemon=True)
        polling.start()
        polling.join(60)
        assert not polling.is_alive(), "a poll never returned (kafka-python's spin after a failed batch)"
    finally:
        io.close()
    assert records == []
    assert [type(f) for f in failures] == [KafkaFatal, KafkaFatal]
    assert all(
        isinstance(f, KafkaFatal) and "UnsupportedCodecError" in str(f) and "pip install zstandard" in f.hint
        for f in failures
    )


@pytest.mark.parametrize("client", CLIENTS)
def test_aborted_transactions_are_never_predicted_nor_learned(client, apache_kafka, topics, tmp_path, service_thread):
    """A transactional upstream commits 100 points and aborts 100, ten at a time, interleaved; the last
    transaction commits, so once its last point is predicted every point before it was read."""
    bootstrap = apache_kafka.bootstrap_servers
    create_topic(bootstrap, topics["input_topic"])
    events = _events(200, seed=29)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"upstream-{topics['group_id']}"})
    producer.init_transactions(30)
    committed = []
    for n in range(20):
        chunk = events[n * 10 : (n + 1) * 10]
        producer.begin_transaction()
        for e in chunk:
            producer.produce(topics["input_topic"], json.dumps(e).encode(), e["id"].encode())
        assert producer.flush(30) == 0  # in the log before the abort (librdkafka drops what it has not sent)
        if n % 2:
            producer.commit_transaction(30)
            committed += chunk
        else:
            producer.abort_transaction(30)
    service = service_thread(settings_args(apache_kafka, topics, tmp_path, kafka_client=client))

    predictions = [json.loads(r.value) for r in consume(bootstrap, topics["output_topic"], len(committed))]
    service.stop()

    assert [p["id"] for p in predictions] == [e["id"] for e in committed]
    assert predictions[-1]["model"] == _offline_model(committed)
