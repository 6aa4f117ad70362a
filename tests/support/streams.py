"""The poll loop's stream (:func:`perceptron_stream.kafka.open_stream`) as the tests open it: one group, the test's input topic."""

from __future__ import annotations

from perceptron_stream.config import KafkaSettings
from perceptron_stream.kafka import Stream, open_stream


def open_test_stream(
    settings: KafkaSettings, client: str, topics: dict, *, max_poll_records: int = 1000, **callbacks
) -> Stream:
    """``client``'s stream in ``topics["group_id"]`` on ``topics["input_topic"]``, from its start; ``on_assigned`` and
    ``on_revoked`` may be given (by default, nothing is done on a rebalance)."""
    return open_stream(
        settings,
        client,
        group_id=topics["group_id"],
        topics=[topics["input_topic"]],
        auto_offset_reset="earliest",
        on_assigned=callbacks.get("on_assigned", lambda partitions: None),
        on_revoked=callbacks.get("on_revoked", lambda partitions: None),
        max_poll_records=max_poll_records,
        fetch_max_wait_ms=20,
    )
