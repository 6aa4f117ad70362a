"""How both clients call the application's rebalance callbacks (perceptron_stream.kafka.rebalance), without a broker:
a failure is kept, never raised into the client, and raised once, as it was, by the stream's next poll."""

from __future__ import annotations

import pytest
from perceptron_stream.kafka import KafkaUnavailable
from perceptron_stream.kafka.rebalance import RebalanceCallbacks
from perceptron_stream.runtime.retry import StartupError


def test_the_callbacks_get_sorted_partitions():
    seen = []
    callbacks = RebalanceCallbacks(lambda p: seen.append(("assigned", p)), lambda p: seen.append(("revoked", p)))
    callbacks.revoked(iter([("t", 1), ("t", 0)]))
    callbacks.assigned(iter([("u", 0), ("t", 2)]))
    callbacks.raise_failure()  # nothing failed: nothing raised
    assert seen == [("revoked", [("t", 0), ("t", 1)]), ("assigned", [("t", 2), ("u", 0)])]


@pytest.mark.parametrize("failure", [StartupError("foreign state"), KafkaUnavailable("brokers away", timed_out=True)])
def test_a_failure_is_kept_the_callbacks_after_it_skipped_and_raised_once_as_it_was(failure):
    assigned: list = []

    def revoked(partitions):
        raise failure

    callbacks = RebalanceCallbacks(assigned.append, revoked)
    callbacks.revoked([("t", 0)])  # returns: the client's rebalance goes on
    callbacks.assigned([("t", 0)])
    assert assigned == []  # the service is stopping: told nothing more
    with pytest.raises(type(failure)) as raised:
        callbacks.raise_failure()
    assert raised.value is failure
    callbacks.raise_failure()  # once


def test_lost_partitions_go_to_on_lost_or_without_one_to_on_revoked_as_both_clients_do():
    seen: list = []
    callbacks = RebalanceCallbacks(
        seen.append, lambda p: seen.append(("revoked", p)), lambda p: seen.append(("lost", p))
    )
    callbacks.lost(iter([("t", 1), ("t", 0)]))
    callbacks.revoked([("t", 2)])
    assert seen == [("lost", [("t", 0), ("t", 1)]), ("revoked", [("t", 2)])]
    seen.clear()
    RebalanceCallbacks(seen.append, lambda p: seen.append(("revoked", p))).lost([("t", 0)])
    assert seen == [("revoked", [("t", 0)])]
