"""``produce``'s book-keeping of deliveries (perceptron_stream.kafka.ledger.DeliveryCounts): counts that hold under the producer's
I/O thread, and the one classification of a failure (refused for good, or the brokers broken)."""

from __future__ import annotations

import threading

from kafka.errors import KafkaTimeoutError, MessageSizeTooLargeError, TopicAuthorizationFailedError
from perceptron_stream.kafka.ledger import DeliveryCounts


def test_deliveries_count_from_another_thread():
    deliveries = DeliveryCounts()

    def deliver():
        for _ in range(10_000):
            deliveries.ok()

    threads = [threading.Thread(target=deliver) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert deliveries.acknowledged == 40_000 and not deliveries.broken


def test_only_a_refusal_of_one_message_leaves_the_brokers_unbroken():
    refused = DeliveryCounts()
    refused.fail(MessageSizeTooLargeError("too large"))
    assert not refused.broken and refused.failed == 1
    for error in (KafkaTimeoutError("no metadata in 10 s"), TopicAuthorizationFailedError("no write")):
        tally = DeliveryCounts()
        tally.fail(error)
        assert tally.broken and tally.errors == {f"{type(error).__name__}: {error.args[0]}": 1}
