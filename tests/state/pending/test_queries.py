"""The pending table's reads: a batch's ids a chunk at a time, the oldest rows by index range, merged."""

from __future__ import annotations

import sqlite3

from perceptron_stream.state.pending.queries import (
    EXPIRE_AT_ONCE,
    READ_AHEAD_CHUNK,
    oldest,
    oldest_pending,
    rows_of,
)
from perceptron_stream.state.pending.undo import STATES, UndoTable


def _table(rows) -> sqlite3.Connection:
    table = UndoTable(":memory:")
    table.db.executemany("INSERT INTO pending (id, state, at, point, epoch) VALUES (?, ?, ?, NULL, 1)", rows)
    return table.db


def test_rows_of_reads_a_chunk_of_ids_a_query():
    db = _table([(f"s:{i}", "pending", float(i)) for i in range(3 * READ_AHEAD_CHUNK)])
    queries: list[str] = []
    db.set_trace_callback(queries.append)
    keys = [f"s:{i}" for i in range(2 * READ_AHEAD_CHUNK + 1)] + ["s:absent"]
    found = rows_of(db, keys, "state")
    assert sorted(found) == sorted((f"s:{i}", "pending") for i in range(2 * READ_AHEAD_CHUNK + 1))
    assert len([q for q in queries if q.startswith("SELECT")]) == 3


def test_oldest_merges_the_states_oldest_first_within_the_limit():
    db = _table([("s:a", "pending", 3.0), ("s:b", "labeled", 1.0), ("s:c", "early", 0.5), ("s:d", "pending", 9.0)])
    assert oldest(db, STATES, cutoff=5.0) == [(1.0, "s:b", "labeled"), (3.0, "s:a", "pending")]  # early: the grace's
    many = _table([(f"s:{i}", "pending", float(i)) for i in range(EXPIRE_AT_ONCE + 5)])
    assert len(oldest(many, STATES, cutoff=1e9)) == EXPIRE_AT_ONCE


def test_oldest_pending_breaks_ties_in_time_by_arrival():
    db = _table([("s:z", "pending", 1.0), ("s:a", "pending", 1.0), ("s:m", "labeled", 0.0), ("s:b", "pending", 2.0)])
    assert oldest_pending(db, 2) == ["s:z", "s:a"]
