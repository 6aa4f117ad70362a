"""The Kafka store's changelog of pending tables: a checkpoint's table rebuilt from it, a crashed run's changes undone."""

from __future__ import annotations

import json

import orjson
import pytest
from perceptron_stream.kafka import DEFAULT_MAX_MESSAGE_BYTES, RecordLimits, RecordTooLarge
from perceptron_stream.kafka.contract import RECORD_OVERHEAD_BYTES
from perceptron_stream.state.changelog import CHANGE_OVERHEAD_BYTES, Changelog
from perceptron_stream.state.pending import PendingTable

from tests.support.labels import MemoryLog


def test_the_changelog_restores_a_checkpoints_table_and_undoes_a_crashed_runs_later_changes():
    log = MemoryLog()
    refused: list[str] = []
    changelog = Changelog(log, "g", on_reject=refused.append)
    table = PendingTable(":memory:", ttl_seconds=1e9, max_pending=100, track_changes=True)
    table.add("a", {"x": [1.0], "score": 0.5}, now=1.0)
    table.add("b", {"x": [2.0], "score": 0.5}, now=2.0)
    changelog.write(0, table.changed(), 1, "run-1")  # checkpoint 1 by run-1
    table.checkpoint(1)
    assert table.take("a", now=3.0) == {"x": [1.0], "score": 0.5}
    table.add("c", {"x": [3.0], "score": 0.5}, now=4.0)
    changelog.write(0, table.changed(), 2, "run-1")  # written, then run-1 died before checkpoint 2 was saved
    log.send(0, b"g/0/s:x", b"not json")  # and someone wrote garbage
    log.send(1, b"g/1/s:z", b'{"epoch": 1, "run": "run-1", "row": ["pending", 1.0, "{}"]}')  # another partition

    restored = PendingTable(":memory:", ttl_seconds=1e9, max_pending=100)
    changelog.restore(0, restored, 1, [[1, "run-1"], [2, "run-2"]])  # run-2 restores checkpoint 1
    assert (
        restored.pending_count() == 2
        and restored.take("a", now=5.0) == {"x": [1.0], "score": 0.5}
        and restored.take("c", now=5.0) is None
    )
    assert refused == ["damaged"]  # the garbage, counted (perceptron_rejected_state_total{kind="changelog"})
    # the stale changes were written again with their valid values: the newest record of every key is this lineage's
    again = PendingTable(":memory:", ttl_seconds=1e9, max_pending=100)
    changelog.restore(0, again, 5, [[1, "run-1"], [2, "run-2"]])  # even read as of a later checkpoint of run-2
    assert again.pending_count() == 2 and again.take("c", now=6.0) is None and log.flushes >= 1


class Transaction:
    """A stream's open transaction, as Changelog.write(into=...) uses it: what was sent to which partition."""

    def __init__(self):
        self.sent: list = []

    def send_to(self, topic, partition, key, value):
        self.sent.append((topic, partition, key, value))


def test_in_transactions_the_epochs_changes_and_a_restores_repairs_go_into_the_next_transaction_only():
    log = MemoryLog()
    table = PendingTable(":memory:", ttl_seconds=1e9, max_pending=100, track_changes=True)
    table.add("a", {"x": [1.0], "score": 0.5}, now=1.0)
    Changelog(log, "g").write(0, table.changed(), 1, "run-1")  # at-least-once: run-1's checkpoint 1...
    table.checkpoint(1)
    table.add("b", {"x": [2.0], "score": 0.5}, now=2.0)
    Changelog(log, "g").write(0, table.changed(), 2, "run-1")  # ...and its change after it, then it died
    written = len(log.records[0])

    changelog = Changelog(log, "g", in_transactions=True)  # an exactly-once run restores checkpoint 1
    restored = PendingTable(":memory:", ttl_seconds=1e9, max_pending=100, track_changes=True)
    changelog.restore(0, restored, 1, [[1, "run-1"], [2, "run-2"]])
    assert restored.pending_count() == 1 and len(log.records[0]) == written  # nothing written around a transaction
    restored.add("c", {"x": [3.0], "score": 0.5}, now=3.0)
    into = Transaction()
    changelog.write(0, restored.changed(), 2, "run-2", into=into)
    assert [(t, p, k) for t, p, k, _ in into.sent] == [("pending", 0, b"g/0/s:b"), ("pending", 0, b"g/0/s:c")]
    assert into.sent[0][3] == b'{"epoch":1,"run":"repair","row":null}'  # the repair first, then the epoch's change
    assert len(log.records[0]) == written and log.flushes == 0  # nothing by the changelog's own producer
    changelog.write(0, [], 3, "run-2", into=(later := Transaction()))
    assert later.sent == []  # a repair goes once


def test_a_stored_point_beyond_the_bounds_is_refused_counted_and_never_learned():
    """A point read back from the changelog is learned when its label comes, without the decoder's checks between:
    a forged x of 1e300 would have made a weight of 1e300 and every later score infinite (a null score)."""
    log = MemoryLog()
    refused: list[str] = []
    changelog = Changelog(log, "g", on_reject=refused.append)
    good = '{"x": [1.0, 2.0], "y_pred": 1, "score": 0.5, "version": 0}'
    for key, point in [
        ("s:a", good),
        ("s:b", '{"x": [1e300, 2.0], "y_pred": 1, "score": 0.5, "version": 0}'),
        ("s:c", '{"x": {"f": 1.0}, "y_pred": 1, "score": 1e400, "version": 0}'.replace("1e400", '"inf"')),
        ("s:d", '{"x": "not features", "score": 0.5}'),
    ]:
        log.send(0, f"g/0/{key}".encode(), orjson.dumps({"epoch": 1, "run": "run-1", "row": ["pending", 1.0, point]}))
    table = PendingTable(":memory:", ttl_seconds=1e9, max_pending=100)
    changelog.restore(0, table, 1, [[1, "run-1"]])
    assert table.pending_count() == 1 and table.take("a", now=2.0) == orjson.loads(good)
    assert table.take("b", now=2.0) is None
    assert refused == ["non_finite", "damaged", "damaged"]


def test_a_stored_point_is_written_as_the_json_it_is_and_records_of_either_form_read_back():
    """A point whose feature names are quotes: as a JSON string inside JSON every escape doubled (the record twice
    the point); embedded, the record is the point and a few bytes. A record written before (the point a string)
    still reads back."""
    log = MemoryLog()
    changelog = Changelog(log, "g")
    table = PendingTable(":memory:", ttl_seconds=1e9, max_pending=100, track_changes=True)
    point = {"x": {'"' * 1000: 1.0}, "y_pred": 1, "score": 0.5, "version": 0}
    table.add("a", point, now=1.0)
    changelog.write(0, table.changed(), 1, "run-1")
    table.checkpoint(1)
    ((key, value),) = log.records[0]
    stored = len(json.dumps(point, separators=(",", ":")))
    assert key == b"g/0/s:a" and stored < len(value) <= stored + CHANGE_OVERHEAD_BYTES
    before = '{"x": [1.0], "y_pred": 1, "score": 0.5, "version": 0}'
    log.send(0, b"g/0/s:b", json.dumps({"epoch": 1, "run": "run-1", "row": ["pending", 2.0, before]}).encode())
    restored = PendingTable(":memory:", ttl_seconds=1e9, max_pending=100)
    changelog.restore(0, restored, 1, [[1, "run-1"]])
    assert restored.take("a", now=3.0) == point and restored.take("b", now=3.0) == json.loads(before)


def test_a_change_larger_than_its_topic_allows_is_an_error_naming_the_topic_and_its_setting():
    log = MemoryLog()
    log.limits = RecordLimits({"pending": 2000}, DEFAULT_MAX_MESSAGE_BYTES)
    changelog = Changelog(log, "g")
    table = PendingTable(":memory:", ttl_seconds=1e9, max_pending=100, track_changes=True)
    table.add("a", {"features": {"f": 1.0}, "pad": "x" * 3000}, now=1.0)
    with pytest.raises(RecordTooLarge, match=r"exceeds max\.message\.bytes=2000 of topic pending") as raised:
        changelog.write(0, table.changed(), 1, "run-1")
    assert "max.message.bytes" in raised.value.hint and log.records == {}
    assert changelog.room(0, "a") == 2000 - RECORD_OVERHEAD_BYTES - len(b"g/0/s:a") - CHANGE_OVERHEAD_BYTES
