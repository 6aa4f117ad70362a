"""The pending table on disk: SQLite rows by id, each change undoable back to any checkpoint a store keeps.

Every change is made in the *epoch* of the next checkpoint (``epoch = last
checkpoint's seq + 1``), and a row carries the epoch of its last change. The
first change in an epoch to a row from an earlier epoch is logged with the
value it replaced (an undo log); a row made in the open epoch needs no entry,
since a restore of an earlier checkpoint drops it whole. Restoring checkpoint
N (:meth:`UndoTable.rollback_to`) undoes the entries of every epoch after N,
in reverse order, then drops the rows still marked after N, so the table is
exactly what it was when checkpoint N was taken, whichever checkpoint the
store falls back to. Undo entries older than the oldest checkpoint a store
keeps are purged. Changes are made inside one open transaction, committed at
the end of a batch (:meth:`UndoTable.commit`).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson
from perceptron_stream.state.pending.queries import oldest_pending

#: How many checkpoints back a restore may go (the stores keep the last 3).
KEEP_EPOCHS = 3
#: The states of a row the TTL expires: a point waiting for its label, or the mark of a labeled one (a second label
#: is a duplicate). The third, ``early`` (a label waiting for its point), ends by the joiner's grace period instead.
STATES = ("pending", "labeled")
EARLY = "early"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pending (
    id TEXT PRIMARY KEY,
    state TEXT NOT NULL,          -- 'pending' | 'labeled' | 'early'
    at REAL NOT NULL,             -- when it came (pending, early) or was labeled (labeled): the TTL (grace) runs from here
    point BLOB,                   -- JSON of what the join needs (features, published y_pred, score...; early: the label)
    epoch INTEGER NOT NULL DEFAULT 0  -- of its last change (0: from before the column, as old as any checkpoint)
);
CREATE INDEX IF NOT EXISTS pending_by_time ON pending (state, at);  -- ties: rowid, the order of arrival
CREATE TABLE IF NOT EXISTS undo (
    seq INTEGER PRIMARY KEY,
    epoch INTEGER NOT NULL,
    id TEXT NOT NULL,
    old TEXT                       -- JSON [state, at, point, epoch] the change replaced; NULL: the id was absent
);
CREATE INDEX IF NOT EXISTS undo_by_epoch ON undo (epoch);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def undo_value(row: tuple | None) -> bytes | None:
    """The undo log's ``old`` of a row (state, at, point, epoch): JSON ``[state, at, point JSON or null, epoch]``;
    None: absent."""
    if row is None:
        return None
    state, at, point, epoch = row
    return orjson.dumps([state, at, point.decode() if point else None, epoch])


class UndoTable:
    """A partition's rows on disk (``path`` a file, or ``":memory:"``), with their undo log by epoch.

    ``changed``: the ids changed in the open epoch, for the Kafka store's
    changelog (``track_changes``; None otherwise): in memory, as many as the
    epoch's changes (the changelog sends them all at its checkpoint anyway).
    """

    def __init__(self, path: str | Path, track_changes: bool = False):
        self.path = str(path)
        # isolation_level None: transactions are begun and committed here, explicitly
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL" if self.path != ":memory:" else "PRAGMA journal_mode=MEMORY")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)
        if "epoch" not in {column for _, column, *_ in self.db.execute("PRAGMA table_info(pending)")}:
            self.db.execute("ALTER TABLE pending ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0")  # a table from before it
        row = self.db.execute("SELECT value FROM meta WHERE key = 'epoch'").fetchone()
        self.epoch = int(row[0]) if row else 1
        self.in_tx = False
        self.changed: set[str] | None = set() if track_changes else None

    # transactions -----------------------------------------------------------
    def begin(self) -> None:
        if not self.in_tx:
            self.db.execute("BEGIN")
            self.in_tx = True

    def commit(self) -> None:
        if self.in_tx:
            self.db.execute("COMMIT")
            self.in_tx = False

    # reads -------------------------------------------------------------------
    def row(self, key: str) -> tuple | None:
        """(state, at, point, epoch) of ``key``'s row; None: absent."""
        return self.db.execute("SELECT state, at, point, epoch FROM pending WHERE id = ?", (key,)).fetchone()

    def count_pending(self) -> int:
        return self.db.execute("SELECT count(*) FROM pending WHERE state = 'pending'").fetchone()[0]

    def early_rows(self) -> list[tuple[str, float, bytes]]:
        """(id, at, label JSON) of the labels waiting for their point."""
        return self.db.execute("SELECT id, at, point FROM pending WHERE state = ?", (EARLY,)).fetchall()

    # changes (each inside the open transaction, logged for undo) ------------
    def log(self, key: str) -> None:
        """Before a change of ``key``'s row: its value, if this epoch has not logged it yet."""
        old = self.row(key)
        if old is None or old[3] < self.epoch:
            self.db.execute("INSERT INTO undo (epoch, id, old) VALUES (?, ?, ?)", (self.epoch, key, undo_value(old)))
        if self.changed is not None:
            self.changed.add(key)

    def delete(self, key: str) -> None:
        """``key``'s row gone, logged for undo."""
        self.begin()
        self.log(key)
        self.db.execute("DELETE FROM pending WHERE id = ?", (key,))

    def put(self, rows: dict, replacing: set[str]) -> None:
        """``rows`` (id → (state, at, point, _)) written in this epoch, in their order (a point held as a dict
        written as its JSON); ``replacing``: those of them the table has a row of already, logged for undo first."""
        self.begin()
        for key in replacing:
            self.log(key)
        epoch, dumps = self.epoch, orjson.dumps
        self.db.executemany(
            "INSERT OR REPLACE INTO pending (id, state, at, point, epoch) VALUES (?, ?, ?, ?, ?)",
            (
                (k, state, at, dumps(point) if type(point) is dict else point, epoch)
                for k, (state, at, point, _) in rows.items()
            ),
        )
        if self.changed is not None:
            self.changed.update(rows)

    def mark_labeled(self, takes: list[tuple[float, int, str]], undo: list[tuple[int, str, bytes | None]]) -> None:
        """Rows taken by their labels ((labeled at, epoch, id)) marked labeled, after their undo entries ``undo``
        (read when they were taken)."""
        self.begin()
        if undo:
            self.db.executemany("INSERT INTO undo (epoch, id, old) VALUES (?, ?, ?)", undo)
        self.db.executemany("UPDATE pending SET state = 'labeled', at = ?, point = NULL, epoch = ? WHERE id = ?", takes)
        if self.changed is not None:
            self.changed.update(key for _, _, key in takes)

    def evict(self, count: int) -> int:
        """The ``count`` oldest pending points deleted (logged for undo); how many."""
        keys = oldest_pending(self.db, count)
        for key in keys:  # in the transaction the write before an eviction opened, if it opened one
            self.log(key)
            self.db.execute("DELETE FROM pending WHERE id = ?", (key,))
        return len(keys)

    # epochs ------------------------------------------------------------------
    def _open_epoch(self, epoch: int) -> None:
        """Changes from now on belong to ``epoch`` (stored with the table; inside the open transaction)."""
        self.epoch = epoch
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('epoch', ?)", (str(epoch),))
        if self.changed is not None:
            self.changed = set()

    def checkpoint(self, seq: int) -> None:
        """Checkpoint ``seq`` was taken: later changes belong to epoch seq + 1; undo older than KEEP_EPOCHS goes."""
        self.begin()
        self._open_epoch(seq + 1)
        self.db.execute("DELETE FROM undo WHERE epoch <= ?", (seq - KEEP_EPOCHS,))
        self.commit()

    def rollback_to(self, seq: int) -> None:
        """Undo every change made after checkpoint ``seq`` (0: since the table was created)."""
        self.commit()
        self.begin()
        for key, old in self.db.execute(
            "SELECT id, old FROM undo WHERE epoch > ? ORDER BY seq DESC", (seq,)
        ).fetchall():
            if old is None:
                self.db.execute("DELETE FROM pending WHERE id = ?", (key,))
            else:
                state, at, point, *epoch = orjson.loads(old)  # no epoch: an entry from before the column
                self.db.execute(
                    "INSERT OR REPLACE INTO pending (id, state, at, point, epoch) VALUES (?, ?, ?, ?, ?)",
                    (key, state, at, None if point is None else point.encode(), epoch[0] if epoch else 0),
                )
        self.db.execute("DELETE FROM undo WHERE epoch > ?", (seq,))
        # rows made after checkpoint seq (never logged): a scan, but a restore is rare and an index on epoch
        # would cost every add and take
        self.db.execute("DELETE FROM pending WHERE epoch > ?", (seq,))
        self._open_epoch(seq + 1)
        self.commit()

    def load(self, rows: dict[str, list], epoch: int) -> None:
        """Replace the whole table by ``rows`` (id → [state, at, point JSON or None]), as of checkpoint ``epoch - 1``."""
        self.commit()
        self.begin()
        self.db.execute("DELETE FROM pending")
        self.db.execute("DELETE FROM undo")
        self.db.executemany(
            "INSERT INTO pending (id, state, at, point, epoch) VALUES (?, ?, ?, ?, ?)",
            ((k, st, at, None if point is None else point.encode(), epoch - 1) for k, (st, at, point) in rows.items()),
        )
        self._open_epoch(epoch)
        self.commit()
