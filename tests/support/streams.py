"""The poll loop's stream (:func:`perceptron_stream.kafka.open_stream`) as the tests open it: one group, the test's input topic."""

from __future__ import annotations

import json

from perceptron_stream.config import KafkaSettings
from perceptron_stream.kafka import Record, Stream, open_stream


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


class ScriptedStream:
    """Hands over the batches it was given, one a poll (then nothing), and takes what the loop writes."""

    def __init__(self, batches: list[list[Record]]):
        self.batches = list(batches)
        self.sent: list[tuple] = []
        self.committed: list[dict] = []

    def poll(self, timeout_ms, max_records):
        return [self.batches.pop(0)] if self.batches else []

    def send(self, topic, key, value):
        self.sent.append((topic, key, value))

    def flush(self, timeout_s):
        return []

    def commit(self, positions, timeout_s=None):
        self.committed.append(dict(positions))

    def lag(self, timeout_s=None, ask_broker=True):
        return {}

    def assignment(self):
        return [("points", 0)]

    def pause(self, partitions=None):
        pass

    def resume(self, partitions=None):
        pass


def scripted_records(start: int, count: int) -> list[Record]:
    """``count`` labeled events of two features on ("points", 0), offsets from ``start``."""
    events = [
        {"id": f"e{i}", "x": [1.0, float(i % 3) - 1.0], "y": 1 if i % 2 else -1} for i in range(start, start + count)
    ]
    return [Record("points", 0, start + i, None, json.dumps(e).encode(), 0) for i, e in enumerate(events)]
