"""The one backoff of the service: delays that double from 0.2 s up to 5 s between attempts.

Every retry loop uses it: the runtime's calls to the brokers
(:class:`perceptron_stream.runtime.retry.Retry`, which re-exports it), the admin
client's connection attempts (:mod:`perceptron_stream.kafka.admin`) and the delivery
ledger's resends (:mod:`perceptron_stream.kafka.ledger`). It lives in the Kafka layer,
not in perceptron_stream.runtime, because perceptron_stream.runtime imports perceptron_stream.kafka: the
other way round would be an import cycle. It knows nothing of Kafka.

>>> b = Backoff(first=0.2, most=1.0)
>>> [b.next() for _ in range(5)]
[0.2, 0.4, 0.8, 1.0, 1.0]
>>> b.delay  # the next one, without taking it
1.0
>>> b.reset(); b.next()
0.2
"""

from __future__ import annotations

#: The first delay and the longest one, in seconds.
FIRST_DELAY_S, MOST_DELAY_S = 0.2, 5.0


class Backoff:
    """Delays that double from ``first`` up to ``most`` seconds; ``delay`` is the next one."""

    def __init__(self, first: float = FIRST_DELAY_S, most: float = MOST_DELAY_S):
        self.first, self.most = first, most
        self.delay = first

    def next(self) -> float:
        delay, self.delay = self.delay, min(self.delay * 2, self.most)
        return delay

    def reset(self) -> None:
        self.delay = self.first
