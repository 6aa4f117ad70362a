"""What the producer owes: the one book-keeping of deliveries, shared by both clients and ``produce``.

A send is only a request. Until a flush settles it, a message may be
acknowledged, fail for a while (brokers away: send it again, on a fresh
producer), be refused for good (too large: the caller replaces it with a dead
letter), or fail fatally (no permission: stop). :meth:`Ledger.settle` is that
flush loop, written once; each client only says how to wait for its producer
and how to renew it (:class:`Producer`).

>>> class Flaky:  # fails every message once, then delivers
...     def __init__(self): self.sent, self.tries = [], 0
...     def send(self, topic, key, value): self.sent.append(value)
...     def wait(self, timeout_s, ledger):
...         self.tries += 1
...         if self.tries == 1:
...             for v in self.sent: ledger.failed(("t", None, v), "retry")
...         self.sent = []
...         return 0
...     def renew(self): pass
>>> producer, ledger = Flaky(), Ledger(first_delay_s=0.0)
>>> producer.send("t", None, b"a")
>>> ledger.settle(producer, timeout_s=5.0), producer.tries
([], 2)

``perceptron-stream produce`` sends nothing again: it counts the brokers'
answers as they come (:class:`DeliveryCounts`), with the same classification
(:func:`perceptron_stream.kafka.errors.delivery_kind`), and reports what was lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Protocol

from perceptron_stream.kafka.backoff import FIRST_DELAY_S, MOST_DELAY_S, Backoff
from perceptron_stream.kafka.contract import DeliveryError, KafkaFatal, KafkaUnavailable, Refused
from perceptron_stream.kafka.errors import FATAL, REFUSED, RETRY, delivery_kind, describe

log = logging.getLogger(__name__)

__all__ = ["FATAL", "REFUSED", "RETRY", "DeliveryCounts", "Ledger", "Producer"]


class Producer(Protocol):
    def send(self, topic: str, key: bytes | None, value: bytes) -> None: ...

    def wait(self, timeout_s: float, ledger: Ledger) -> int:
        """Wait up to ``timeout_s`` for the acknowledgements, reporting each failure to ``ledger.failed``;
        the number of messages still waiting."""

    def renew(self) -> None:
        """A fresh producer (after failures an idempotent one may be fenced, or stuck on a sequence gap)."""


class Ledger:
    """Failures reported since the last settled flush, and the refused messages to hand back."""

    def __init__(self, first_delay_s: float = FIRST_DELAY_S, most_delay_s: float = MOST_DELAY_S):
        self.first_delay_s, self.most_delay_s = first_delay_s, most_delay_s
        self._failed: list[tuple[tuple[str, bytes | None, bytes], BaseException | None]] = []
        self._refused: list[Refused] = []
        self._fatal: BaseException | None = None

    def failed(self, message: tuple[str, bytes | None, bytes], kind: str, error: BaseException | None = None) -> None:
        """A message was not delivered: ``kind`` RETRY, REFUSED or FATAL (``error`` says why)."""
        if kind == REFUSED:
            self._refused.append(Refused(*message, error))
        elif kind == FATAL:
            self._fatal = self._fatal or error or KafkaFatal("the brokers refused a message")
        else:
            self._failed.append((message, error))

    def owed(self) -> int:
        """Messages reported failed and not yet sent again."""
        return len(self._failed)

    def forget(self) -> None:
        """Drop every failure and refusal reported: their messages were in a transaction that was aborted."""
        self._failed, self._refused, self._fatal = [], [], None

    def settle(self, producer: Producer, timeout_s: float, resend: bool = True) -> list[Refused]:
        """Every message acknowledged: failures sent again, in order, with backoff and a fresh producer, until
        ``timeout_s`` (then DeliveryError: the caller must not commit); the refused ones returned; a fatal one raised.

        Refused messages stay in the ledger across a DeliveryError: a flush
        that ends so must not drop them, the next settled one returns them.
        ``resend`` False (a transaction: a failed delivery dooms it, and a
        fresh producer would leave it): DeliveryError at the first failure,
        raised from the first failure's error.
        """
        deadline = time.monotonic() + timeout_s
        backoff = Backoff(self.first_delay_s, self.most_delay_s)
        while True:
            waiting = producer.wait(max(0.0, deadline - time.monotonic()), self)
            if self._fatal is not None:
                error, self._fatal = self._fatal, None
                raise error
            if not waiting and not self._failed:
                refused, self._refused = self._refused, []
                return refused
            if not resend and self._failed:
                failed, self._failed = self._failed, []
                raise DeliveryError(f"{len(failed)} message(s) of the transaction not delivered") from failed[0][1]
            if waiting or time.monotonic() >= deadline:
                raise DeliveryError(
                    f"{waiting + len(self._failed)} message(s) not acknowledged by the brokers within {timeout_s:g} s",
                    timed_out=True,
                )
            delay = backoff.next()
            log.warning("%d message(s) not acknowledged; sending them again in %.1f s", len(self._failed), delay)
            time.sleep(delay)
            try:
                producer.renew()
            except KafkaUnavailable as exc:  # no broker to start a producer with yet (a long outage): next round
                log.warning("could not start a new producer (%s); trying again", exc)
                continue
            again, self._failed = self._failed, []
            for message, _ in again:
                producer.send(*message)


class DeliveryCounts:
    """The brokers' answers to sends that are never sent again, counted as they arrive (the callbacks run on
    the producer's I/O thread): ``perceptron-stream produce``'s book-keeping.

    ``broken``: a failure that is not about one message (anything but
    REFUSED: the brokers are away or refuse the topic), after which the
    sender stops. ``errors``: how many failed with each error, described once.

    >>> from kafka.errors import KafkaConnectionError, MessageSizeTooLargeError
    >>> counts = DeliveryCounts()
    >>> counts.ok(); counts.fail(MessageSizeTooLargeError("too large")); counts.broken
    False
    >>> counts.fail(KafkaConnectionError("broker gone")); counts.broken, counts.acknowledged, counts.failed
    (True, 1, 2)
    >>> sorted(counts.errors)
    ['KafkaConnectionError: broker gone', 'MessageSizeTooLargeError: too large']
    """

    def __init__(self):
        self.lock = threading.Lock()
        self.acknowledged = self.failed = 0
        self.errors: Counter[str] = Counter()
        self.broken = False

    def ok(self, _metadata=None) -> None:
        with self.lock:
            self.acknowledged += 1

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            self.failed += 1
            self.errors[describe(exc)] += 1
            self.broken |= delivery_kind(exc) != REFUSED
