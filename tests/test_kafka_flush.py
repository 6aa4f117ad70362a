"""KafkaIO.flush's book-keeping of resends and refusals, over a stand-in producer (pure logic, no broker)."""

from __future__ import annotations

import pytest
from kafka.errors import KafkaTimeoutError, MessageSizeTooLargeError

from service.kafka.kafka_python import KafkaIO
from service.kafka.types import DeliveryError


class Future:
    def __init__(self, error: Exception | None):
        self.exception = error

    def succeeded(self) -> bool:
        return self.exception is None


class Producer:
    """Fails every send of a value in ``failing``; refuses ``b"big"`` for good."""

    def __init__(self, failing: set[bytes]):
        self.failing, self.sent = failing, []

    def send(self, topic, key=None, value=None):
        self.sent.append(value)
        if value == b"big":
            return Future(MessageSizeTooLargeError("too large"))
        return Future(KafkaTimeoutError("no ack") if value in self.failing else None)

    def flush(self, timeout=None):
        pass

    def close(self, timeout=None):
        pass


def stream(producer: Producer) -> KafkaIO:
    io = object.__new__(KafkaIO)  # no consumer: flush only touches the producer
    io.producer, io._pending, io._refused_kept, io._refused = producer, [], [], False
    io._new_producer = lambda: producer
    return io


@pytest.mark.parametrize("first_timeout_s", [0.0, 0.5])  # DeliveryError before the first resend, and after it
def test_a_refused_output_survives_a_flush_that_times_out(first_timeout_s):
    producer = Producer(failing={b"slow"})
    io = stream(producer)
    for value in (b"a", b"big", b"slow"):
        io.send("out", None, value)
    with pytest.raises(DeliveryError):
        io.flush(timeout_s=first_timeout_s)
    producer.failing.clear()  # the brokers are back
    refused = io.flush(timeout_s=5.0)
    assert [(r.value, type(r.error)) for r in refused] == [(b"big", MessageSizeTooLargeError)]
    assert io.flush(timeout_s=5.0) == []  # returned once, not again
    assert producer.sent.count(b"slow") >= 2 and producer.sent.count(b"big") == 1  # resent what failed, never the refused


def test_a_flush_that_succeeds_returns_its_refusals_at_once():
    producer = Producer(failing=set())
    io = stream(producer)
    io.send("out", b"k", b"big")
    io.send("out", b"k", b"ok")
    assert [r.key for r in io.flush(timeout_s=1.0)] == [b"k"]
    assert io._pending == []
