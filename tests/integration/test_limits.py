"""Limits that keep one event from stopping the service: an output the brokers refuse for good."""

from __future__ import annotations

import json

from tests.support.endpoints import http_get
from tests.support.launch import settings_args
from tests.support.topics import consume, create_topic
from tests.support.waiting import wait_until


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
    assert (
        "the brokers refused this event's prediction" in body["error"] and "MessageSizeTooLargeError" in body["error"]
    )
    wait_until(
        lambda: (
            'perceptron_rejected_events_total{reason="output_refused"} 1.0'
            in http_get(service.metrics_url + "/metrics")[1]
        ),
        30,
        what="the refusal counted",
    )
