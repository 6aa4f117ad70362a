"""The open epoch's rows in memory: the write signal, what is taken, and expiry that skips stale and early rows."""

from __future__ import annotations

from unittest import mock

from perceptron_stream.state.pending import memory
from perceptron_stream.state.pending.memory import OpenEpochRows


def test_it_asks_for_a_write_once_more_than_memory_rows_changes_wait():
    rows = OpenEpochRows()
    with mock.patch.object(memory, "MEMORY_ROWS", 2):
        assert [rows.remember(k, "pending", 1.0, b"{}") for k in ("a", "b", "a")] == [False, False, True]
    assert list(rows.rows) == ["a", "b"] and rows.rows["a"][3] == 3  # "a" changed last: its arrival is the third


def test_taking_everything_leaves_the_ids_still_to_look_up():
    rows = OpenEpochRows()
    rows.remember("a", "pending", 1.0, b"{}")
    rows.unverified.append("a")
    rows.replacing.add("a")
    taken, replacing = rows.take_all()
    assert list(taken) == ["a"] and replacing == {"a"}
    assert rows.rows == {} and rows.by_time == [] and rows.replacing == set() and rows.unverified == ["a"]


def test_expiry_goes_oldest_first_and_skips_rows_changed_since_and_early_labels():
    rows = OpenEpochRows()
    rows.remember("old", "pending", 1.0, b"{}")
    rows.remember("moved", "pending", 2.0, b"{}")
    rows.remember("moved", "labeled", 50.0, None)  # changed since: its first entry is stale
    rows.remember("waits", "early", 3.0, b"{}")  # an early label ends by the grace period, not the TTL
    rows.remember("marked", "labeled", 4.0, None)
    rows.replacing.add("marked")
    assert list(rows.expire(10.0)) == [("old", "pending", False), ("marked", "labeled", True)]
    assert set(rows.rows) == {"moved", "waits"} and rows.replacing == set()
