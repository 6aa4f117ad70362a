"""The mix topic followed: its new records fed to the mix board, a few times a second (--mix-every).

Replicas publish their states to the mix topic (:mod:`perceptron_stream.pipeline.mixer`);
every instance reads it back into its :class:`~perceptron_stream.pipeline.mixer.MixBoard`,
whose latest states the replicas mix. Read a few times a second, not every turn
of the loop: a poll of its consumer costs more than a turn of the loop on
librdkafka, and replicas mix every --mix-every events.
"""

from __future__ import annotations

import time

from perceptron_stream.kafka import TopicTail
from perceptron_stream.pipeline.mixer import MixBoard
from perceptron_stream.runtime.retry import Retry

#: How often the loop reads the mix topic's new records.
MIX_READ_EVERY_S = 0.25


class MixFeed:
    def __init__(self, board: MixBoard, tail: TopicTail, retry: Retry):
        self.board, self.tail, self.retry = board, tail, retry
        self._next_read = 0.0

    def follow(self) -> None:
        """The mix topic's new records into the board, when MIX_READ_EVERY_S passed since the last read."""
        now = time.monotonic()
        if now < self._next_read:
            return
        self._next_read = now + MIX_READ_EVERY_S
        _ok, records = self.retry.once(self.tail.poll, "read the mix topic")
        for key, value in records or ():
            self.board.offer(key, value)

    def close(self) -> None:
        self.tail.close()
