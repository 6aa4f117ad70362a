"""The pending table's reads that must stay cheap however large the table grows: chunked by id, or by index range.

A query per id cost more than the write it saved (a take was five
statements); these read a batch's ids a chunk at a time, and the oldest rows
one range of the ``(state, at)`` index per state, merged.
"""

from __future__ import annotations

import heapq
import sqlite3
from itertools import islice

#: Ids per query of :func:`rows_of` (SQLite allows 999 parameters a statement before 3.32).
READ_AHEAD_CHUNK = 500
#: The most rows one :func:`oldest` returns (expiry runs every batch: the rest at the next).
EXPIRE_AT_ONCE = 10_000


def rows_of(db: sqlite3.Connection, keys: list[str], columns: str) -> list[tuple]:
    """(id, ``columns``...) of the table's rows of ``keys``, a query per READ_AHEAD_CHUNK ids."""
    found: list[tuple] = []
    for i in range(0, len(keys), READ_AHEAD_CHUNK):
        chunk = keys[i : i + READ_AHEAD_CHUNK]
        found += db.execute(f"SELECT id, {columns} FROM pending WHERE id IN ({','.join('?' * len(chunk))})", chunk)
    return found


def oldest(db: sqlite3.Connection, states: tuple[str, ...], cutoff: float) -> list[tuple[float, str, str]]:
    """(at, id, state) of the rows in ``states`` older than ``cutoff``, the oldest first, at most EXPIRE_AT_ONCE.

    One range of the (state, at) index per state, merged. A query on ``at``
    alone scans the whole table (30 ms at 300,000 points), and expiry runs
    every batch.
    """
    ranges = [
        db.execute(
            "SELECT at, id, state FROM pending WHERE state = ? AND at < ? ORDER BY at LIMIT ?",
            (state, cutoff, EXPIRE_AT_ONCE),
        )
        for state in states
    ]
    return list(islice(heapq.merge(*ranges), EXPIRE_AT_ONCE))


def oldest_pending(db: sqlite3.Connection, count: int) -> list[str]:
    """The ids of the ``count`` oldest pending points (ties in time: in the order they came)."""
    return [
        k for (k,) in db.execute("SELECT id FROM pending WHERE state = 'pending' ORDER BY at, rowid LIMIT ?", (count,))
    ]
