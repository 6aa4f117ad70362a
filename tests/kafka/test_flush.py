"""The delivery ledger's book-keeping of resends and refusals, through KafkaIO over a stand-in producer
(pure logic, no broker; confluent's stream settles through the same Ledger).

A real outage long enough to matter takes minutes; what flush decides in it
(send again, renew the producer, raise DeliveryError, hand back what the
brokers refused for good) is played here with a producer whose brokers are
away, refuse, or are back.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

import pytest
from kafka.errors import KafkaTimeoutError, MessageSizeTooLargeError
from perceptron_stream.kafka import Aborted, DeliveryError, KafkaIO
from perceptron_stream.kafka.ledger import Ledger


class Future:
    is_done = True  # the stand-in producer settles every send at once

    def __init__(self, error: Exception | None):
        self.exception = error

    def succeeded(self) -> bool:
        return self.exception is None


class Producer:
    """Brokers ``away`` (sends never acknowledged, as a real producer fails them past its delivery timeout),
    ``refuses`` (no metadata: send itself raises) or ``works``; ``b"big"`` is refused for good, and values in
    ``failing`` are not acknowledged even when it works."""

    def __init__(self, mode: str = "works", delivered: list | None = None, failing: Iterable[bytes] = ()):
        self.mode, self.failing, self.closed = mode, set(failing), False
        self.delivered = [] if delivered is None else delivered
        self.sent: list[bytes] = []

    def send(self, topic, key=None, value=None):
        if self.mode == "refuses":
            raise KafkaTimeoutError("Failed to update metadata after 10.0 secs.")
        self.sent.append(value)
        if value == b"big":
            return Future(MessageSizeTooLargeError("too large"))
        if self.mode == "away" or value in self.failing:
            return Future(KafkaTimeoutError("Expiring 1 record(s): 120000 ms has passed since batch creation"))
        self.delivered.append(value)
        return Future(None)

    def flush(self, timeout=None):
        pass

    def close(self, timeout=None):
        self.closed = True


def stream(producer: Producer, new_producer=None) -> KafkaIO:
    io = KafkaIO.__new__(KafkaIO)  # no consumer: flush only touches the producer
    io.producer, io._pending, io._refused, io.ledger, io.settings = producer, [], False, Ledger(), None  # type: ignore[assignment]  # no settings: flush needs none  # noqa: SLF001 — nothing public builds a KafkaIO without a consumer (its producer side alone)
    io._new_producer = new_producer or (lambda: producer)  # type: ignore[method-assign]  # noqa: SLF001 — the stand-in producer a renew makes (no broker)
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
    assert (
        producer.sent.count(b"slow") >= 2 and producer.sent.count(b"big") == 1
    )  # resent what failed, never the refused


def test_a_flush_that_succeeds_returns_its_refusals_at_once():
    io = stream(Producer())
    io.send("out", b"k", b"big")
    io.send("out", b"k", b"ok")
    assert [r.key for r in io.flush(timeout_s=1.0)] == [b"k"]
    assert io._pending == []  # noqa: SLF001 — nothing public tells whether sends are still unsettled


def test_an_outage_longer_than_the_producers_delivery_timeout_is_waited_out(monkeypatch):
    """Past its delivery timeout (2 min) a real producer fails its messages, and while the brokers
    are away a new one can neither bootstrap nor get metadata: flush keeps raising DeliveryError,
    never anything else, and delivers every message, in order, once the brokers are back."""
    delivered: list = []
    makes = iter(["no bootstrap", "refuses", "no bootstrap", "works"])

    def new_producer():
        mode = next(makes)
        if mode == "no bootstrap":
            raise KafkaTimeoutError("Unable to bootstrap from ['127.0.0.1:9092']")
        return Producer(mode, delivered)

    io = stream(Producer("away", delivered), new_producer)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    for i in range(5):
        io.send("out", None, b"%d" % i)
    rounds = 0
    while True:
        try:
            io.flush(timeout_s=0.05)
            break
        except DeliveryError:
            rounds += 1
            assert rounds < 1000, "never delivered"
    assert delivered == [b"0", b"1", b"2", b"3", b"4"]
    assert io.producer.mode == "works" and io._pending == []  # noqa: SLF001 — nothing public tells whether sends are still unsettled
    io.send("out", None, b"5")  # and the service goes on with the new producer
    io.flush(timeout_s=0.05)
    assert delivered[-1] == b"5"


class _FailsOnce:
    """A producer whose first wait reports every message failed with a timeout (the ledger's Producer)."""

    def __init__(self):
        self.sent, self.renewed = [], 0

    def send(self, topic, key, value):
        self.sent.append(value)

    def wait(self, timeout_s, ledger):
        for value in self.sent:
            ledger.failed(("t", None, value), "retry", KafkaTimeoutError("Expiring 1 record(s)"))
        self.sent = []
        return 0

    def renew(self):
        self.renewed += 1


def test_in_a_transaction_a_failed_delivery_is_not_sent_again_and_can_be_forgotten():
    producer, ledger = _FailsOnce(), Ledger(first_delay_s=0.0)
    producer.send("t", None, b"a")
    ledger.failed(("t", None, b"too large"), "refused", MessageSizeTooLargeError())
    with pytest.raises(DeliveryError, match="1 message") as caught:
        ledger.settle(producer, timeout_s=5.0, resend=False)
    assert isinstance(caught.value.__cause__, KafkaTimeoutError)
    assert producer.renewed == 0 and producer.sent == [] and ledger.owed() == 0
    ledger.forget()  # the transaction was aborted: its refusals go with it
    assert ledger.settle(producer, timeout_s=5.0, resend=False) == []


class TransactionalProducer(Producer):
    """The stand-in producer with kafka-python's transactional calls; what was aborted is counted."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.begun = self.aborted = 0

    def begin_transaction(self):
        self.begun += 1

    def abort_transaction(self):
        self.aborted += 1


def test_a_failed_delivery_in_a_transaction_aborts_it_and_is_never_sent_again():
    producer = TransactionalProducer(failing={b"slow"})
    io = stream(producer, new_producer=lambda: pytest.fail("a transaction's producer is never renewed"))
    io.begin()
    for value in (b"a", b"slow"):
        io.send("out", None, value)
    with pytest.raises(Aborted, match="KafkaTimeoutError"):
        io.flush(timeout_s=5.0)
    assert producer.aborted == 1 and not io.in_transaction and producer.sent.count(b"slow") == 1
    assert io.flush(timeout_s=1.0) == []  # nothing of the aborted transaction is settled later
    io.begin()
    assert producer.begun == 2
