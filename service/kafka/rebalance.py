"""The application's rebalance callbacks as both clients call them: the home of what happens when one fails.

The callbacks run inside the client's poll, on the client's terms: a
failure must not be raised into the client's rebalance (librdkafka's
assignment would be left half done; kafka-python 3.0.12 logs it with a
traceback and raises a plain ``KafkaError("User rebalance callback throws an
error")`` in its place, which reads as brokers that are away and was retried
forever). So a failure is kept, the callbacks after it are skipped (the
service is stopping), and the stream raises it, as it was raised, from the
call the rebalance ran in (:meth:`RebalanceCallbacks.raise_failure`): a
StartupError or KafkaFatal stops the service naming the problem, a
KafkaUnavailable is retried like any other.

>>> def assigned(partitions): raise ValueError(f"cannot take {partitions}")
>>> callbacks = RebalanceCallbacks(assigned, lambda partitions: None)
>>> callbacks.assigned([("t", 1), ("t", 0)])
>>> callbacks.raise_failure()
Traceback (most recent call last):
ValueError: cannot take [('t', 0), ('t', 1)]
>>> callbacks.raise_failure()  # raised once
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


class RebalanceCallbacks:
    """``on_assigned``, ``on_revoked`` and ``on_lost`` of the application, given sorted ``(topic, partition)``
    lists. ``on_lost``: partitions taken away after the group removed this member (its session expired): they may
    be another member's already, so nothing of them may be committed. Without one, as a revocation (both clients'
    own default)."""

    def __init__(
        self,
        on_assigned: Callable[[list[tuple[str, int]]], None],
        on_revoked: Callable[[list[tuple[str, int]]], None],
        on_lost: Callable[[list[tuple[str, int]]], None] | None = None,
    ):
        self.on_assigned, self.on_revoked, self.on_lost = on_assigned, on_revoked, on_lost or on_revoked
        self.failure: BaseException | None = None  # what a callback raised, until the stream raises it

    def assigned(self, partitions: Iterable[tuple[str, int]]) -> None:
        self._call(self.on_assigned, partitions)

    def revoked(self, partitions: Iterable[tuple[str, int]]) -> None:
        self._call(self.on_revoked, partitions)

    def lost(self, partitions: Iterable[tuple[str, int]]) -> None:
        self._call(self.on_lost, partitions)

    def _call(self, callback: Callable, partitions: Iterable[tuple[str, int]]) -> None:
        if self.failure is not None:  # the service stops at the next raise_failure: nothing more to tell it
            return
        try:
            callback(sorted(partitions))
        except Exception as exc:
            self.failure = exc

    def raise_failure(self) -> None:
        """Raise what a callback raised since the last call, if anything."""
        if self.failure is not None:
            failure, self.failure = self.failure, None
            raise failure
