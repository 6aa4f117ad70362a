"""Delivery alone (perceptron_stream.runtime.delivery): the outage wait, the stop, and refused outputs as dead letters."""

from __future__ import annotations

import logging
import re

import orjson
import pytest
from perceptron_stream.config import ServeSettings, load
from perceptron_stream.kafka import DEFAULT_MAX_MESSAGE_BYTES, DeliveryError, KafkaFatal, RecordLimits, Refused
from perceptron_stream.kafka.contract import RECORD_OVERHEAD_BYTES
from perceptron_stream.metrics import ServiceMetrics
from perceptron_stream.runtime.delivery import FLUSH_WAIT_S, Delivery
from perceptron_stream.runtime.health import Health
from perceptron_stream.runtime.retry import StartupError
from perceptron_stream.wire.messages import DeadLetter, Rejection
from perceptron_stream.wire.outputs import dead_letter_value

SOURCE = {"topic": "points", "partition": 2, "offset": 41}


class Stream:
    """A stream whose flushes answer, in turn, what ``answers`` holds: a list of refused outputs, or an error."""

    def __init__(self, *answers):
        self.answers, self.sent, self.waits = list(answers), [], []

    def send(self, topic, key, value):
        self.sent.append((topic, key, value))

    def flush(self, timeout_s):
        self.waits.append(timeout_s)
        answer = self.answers.pop(0) if self.answers else []
        if isinstance(answer, Exception):
            raise answer
        return answer


def _delivery(stopping=lambda: False):
    s = load(ServeSettings, ["--metrics-port", "0"])
    metrics = ServiceMetrics(window=10, version="test", variant=s.variant, scope=s.model_scope, challengers=[])
    return Delivery(s, Health(60.0), metrics, stopping), metrics


def _prediction(size: int) -> bytes:
    return orjson.dumps({"source": SOURCE, "padding": "x" * size})


def test_an_outage_is_waited_out_and_said_once(caplog):
    delivery, _ = _delivery()
    stream = Stream(*[DeliveryError("2 messages not acknowledged")] * 3, [])
    with caplog.at_level(logging.INFO, "perceptron_stream"):
        delivery.flush(stream)
    assert stream.waits == [FLUSH_WAIT_S] * 4
    assert delivery.health.broker_ok  # answered in the end
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2, said  # the outage, and its end
    assert "do not answer (could not send the outputs: 2 messages not acknowledged)" in said[0]
    assert "--bootstrap-servers" in said[0] and "answer again" in said[1] and "3 failed" in said[1]


def test_a_stop_ends_the_wait_with_the_batch_unacknowledged():
    delivery, _ = _delivery(stopping=lambda: True)
    stream = Stream(DeliveryError("not acknowledged"), [])
    with pytest.raises(DeliveryError):
        delivery.flush(stream)
    assert len(stream.waits) == 1 and not delivery.health.broker_ok


def test_a_fatal_error_stops_the_service_naming_it():
    delivery, _ = _delivery()
    with pytest.raises(StartupError, match="could not send the outputs: denied; retrying cannot help"):
        delivery.flush(Stream(KafkaFatal("denied")))


def test_a_refused_prediction_becomes_a_dead_letter_without_key_or_raw():
    delivery, metrics = _delivery()
    refused = Refused("predictions", b"k" * 7, _prediction(2000), ValueError("too large"))
    stream = Stream([refused], [])
    delivery.flush(stream)
    [(topic, key, value)] = stream.sent
    letter = DeadLetter.model_validate_json(value)
    assert (topic, key, letter.reason, letter.raw) == ("points.dlq", None, "output_refused", "")
    assert (letter.source.topic, letter.source.partition, letter.source.offset) == ("points", 2, 41)
    assert "refused this event's output" in letter.error and "key 7 bytes" in letter.error
    assert metrics.registry.get_sample_value("perceptron_rejected_events_total", {"reason": "output_refused"}) == 1


def test_a_refused_mix_record_is_counted_and_not_replaced():
    delivery, metrics = _delivery()
    stream = Stream([Refused(delivery.settings.mix_topic, b"k", b"state", ValueError("too large"))], [])
    delivery.flush(stream)
    assert stream.sent == []
    assert metrics.registry.get_sample_value("perceptron_mix_records_rejected_total", {"reason": "refused"}) == 1


def test_a_refused_dead_letter_for_the_refused_output_stops_the_service():
    delivery, _ = _delivery()
    refused = Refused("predictions", None, _prediction(10), ValueError("too large"))
    again = Refused("points.dlq", None, b"{}", ValueError("still too large"))
    with pytest.raises(StartupError, match=re.escape("the brokers refuse even a short dead letter on points.dlq")):
        delivery.flush(Stream([refused], [again]))


def test_outputs_their_topic_would_refuse_are_never_sent_but_dead_lettered_or_cut_or_left_out():
    """Measured against each topic's limit before the stream sees them (RecordLimits): a prediction too large and
    an outcome without a key for a compacted topic become output_refused letters pointing at their input (an
    outcome's is its label); a dead letter too large is cut, keeping its reason and source; a mix record is left
    out, counted."""
    delivery, metrics = _delivery()
    s = delivery.settings
    delivery.limits = RecordLimits(
        {s.output_topic: 1000, s.dlq_topic: 1200}, DEFAULT_MAX_MESSAGE_BYTES, keyed={s.outcome_topic}
    )
    stream = Stream()
    send = delivery.sender(stream)
    send(s.output_topic, b"k", _prediction(100))  # fits
    send(s.output_topic, b"k", _prediction(1000))
    label = {"topic": "labels", "partition": 0, "offset": 9}
    send(s.outcome_topic, None, orjson.dumps({"source": SOURCE, "label_source": label}))
    letter = dead_letter_value(Rejection("invalid_json", "bad"), b"\x01" * 5000, "points", 2, 42)
    send(s.dlq_topic, b"key", letter)
    send(s.mix_topic, b"m", b"x" * 2_000_000)
    sent = [(t, k) for t, k, _ in stream.sent]
    assert sent == [(s.output_topic, b"k"), (s.dlq_topic, None), (s.dlq_topic, None), (s.dlq_topic, b"key")]
    too_large, keyless, cut = (orjson.loads(v) for _, _, v in stream.sent[1:])
    assert too_large["reason"] == "output_refused" and too_large["source"] == SOURCE
    assert f"exceeds max.message.bytes=1000 of topic {s.output_topic}" in too_large["error"]
    assert keyless["source"] == label and f"topic {s.outcome_topic} is compacted" in keyless["error"]
    assert cut["reason"] == "invalid_json" and cut["source"] == {"topic": "points", "partition": 2, "offset": 42}
    assert cut["raw_truncated"] and len(stream.sent[3][2]) + 3 <= 1200 - RECORD_OVERHEAD_BYTES
    assert metrics.registry.get_sample_value("perceptron_rejected_events_total", {"reason": "output_refused"}) == 2
    assert metrics.registry.get_sample_value("perceptron_mix_records_rejected_total", {"reason": "refused"}) == 1
