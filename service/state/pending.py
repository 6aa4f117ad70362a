"""The pending table of delayed labels: points predicted and published, waiting for their label.

One table per input partition, in SQLite (standard library; transactional;
on the local disk; indexed by id and by time): it holds millions of points in
bounded memory, and a checkpoint never rewrites it. Why SQLite and not a
dict: the table must survive a crash in step with the model, and must not
live only in memory (a million pending points of d = 10 are ~1 GB of Python
objects).

Restored together with the model: every change is made in the *epoch* of the
next checkpoint (``epoch = last checkpoint's seq + 1``), and a row carries the
epoch of its last change. The first change in an epoch to a row from an
earlier epoch is logged with the value it replaced (an undo log); a row made
in the open epoch needs no entry, since a restore of an earlier checkpoint
drops it whole. Restoring checkpoint N undoes the entries of every epoch
after N, in reverse order, then drops the rows still marked after N, so the
table is exactly what it was when checkpoint N was taken, whichever
checkpoint the store falls back to. Undo entries older than the oldest
checkpoint a store keeps are purged.

The points added in the open epoch wait in memory (at most MEMORY_ROWS
changes) and are written at the checkpoint that closes it: a restore would
drop them anyway, so a crash loses nothing that counts. A label that comes
within the epoch of its point (its delay shorter than the checkpoint
interval, as on a live stream with labels seconds behind) then costs the
table, with its point, one small row (the labeled mark) and no undo entry,
where the pair cost an insert of the point, an update and two undo entries.
A label that comes later finds its point's row in the table (bench/README.md,
"Delayed labels and two challengers, end to end").

States of an id: ``pending`` (waiting), ``labeled`` (its label came: kept
until the TTL so a second label is a ``duplicate``), ``early`` (its label came
before it: the label waits for its point, :meth:`PendingTable.hold`, until the
joiner's grace period ends, :meth:`PendingTable.pop_early`), gone (expired,
evicted, never seen: a label for it is ``unknown_id``, or waits as ``early``).
Early rows are in the same table, epochs and undo log as the points, so a
restore brings back the labels that waited at that checkpoint, exactly; their
ids are also kept in memory (a point added looks there for its label without
a query: they are few, and capped by the joiner).

>>> table = PendingTable(":memory:", ttl_seconds=60, max_pending=2)
>>> table.add("a", {"x": [1.0], "y_pred": 1, "score": 0.5, "version": 3, "offset": 7}, now=100.0)
>>> table.take("a", now=101.0)["score"], table.take("a", now=102.0), table.take("zz", now=102.0)
(0.5, 'duplicate', None)
>>> table.checkpoint(1)
>>> for i in range(3):
...     table.add(i, {"x": [float(i)]}, now=103.0 + i)
>>> table.pending_count(), table.evicted     # beyond max_pending = 2, the oldest was evicted
(2, 1)
>>> table.take(0, now=110.0), table.rollback_to(1), table.pending_count()
(None, None, 0)
>>> table.hold("b", {"y": -1}, at=111.0), table.take("b", now=112.0), table.early_count()   # a label before its point
(None, 'duplicate', 1)
>>> table.add("b", {"x": [2.0]}, now=113.0), table.early_count(), table.pending_count()    # the point finds it
({'y': -1}, 0, 0)
"""

from __future__ import annotations

import heapq
import sqlite3
from itertools import islice
from pathlib import Path

import orjson

#: How many checkpoints back a restore may go (the stores keep the last 3).
KEEP_EPOCHS = 3
#: The states of a row the TTL expires: a point waiting for its label, or the mark of a labeled one (a second label
#: is a duplicate). The third, ``early`` (a label waiting for its point), ends by the joiner's grace period instead.
STATES = ("pending", "labeled")
EARLY = "early"
#: The most rows one call of :meth:`PendingTable.expire` forgets (it runs every batch: the rest at the next).
EXPIRE_AT_ONCE = 10_000
#: How many changes of new rows a :class:`PendingTable` keeps in memory before it writes them (at the latest,
#: the checkpoint writes them): at most about 40 MB of points of d = 10 a table, so a partition.
MEMORY_ROWS = 50_000
#: Ids per query of :meth:`PendingTable.read_ahead` (SQLite allows 999 parameters a statement before 3.32).
READ_AHEAD_CHUNK = 500
_UNREAD = object()  # an id take() finds no read-ahead row for (None is a row known to be absent)

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
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    epoch INTEGER NOT NULL,
    id TEXT NOT NULL,
    old TEXT                       -- JSON [state, at, point, epoch] the change replaced; NULL: the id was absent
);
CREATE INDEX IF NOT EXISTS undo_by_epoch ON undo (epoch);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def _key(point_id: str | int) -> str:
    """Ids are strings or integers on the wire: ``7`` and ``"7"`` are different points."""
    return f"i:{point_id}" if type(point_id) is int else f"s:{point_id}"


def _undo_value(row: tuple | None) -> bytes | None:
    """The undo log's ``old`` of a row (state, at, point, epoch): JSON ``[state, at, point JSON or null, epoch]``;
    None: absent."""
    if row is None:
        return None
    state, at, point, epoch = row
    return orjson.dumps([state, at, point.decode() if point else None, epoch])


class PendingTable:
    """A partition's pending points (see the module docstring); ``path`` a file, or ``":memory:"``."""

    def __init__(self, path: str | Path, *, ttl_seconds: float, max_pending: int, track_changes: bool = False):
        # early labels: id -> (label time, label JSON), and (time, id) by time (stale entries skipped), as the table
        # holds them: in memory too, so a point finds its label without a query (a query a point cost a replay,
        # whose labels are read far ahead of their points, a third of its CPU); at most --max-early-labels a table
        self._early: dict[str, tuple[float, bytes]] = {}
        self._early_by_time: list[tuple[float, str]] = []
        self.path = str(path)
        self.ttl_seconds, self.max_pending = ttl_seconds, max_pending
        # isolation_level None: transactions are begun and committed here, explicitly
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL" if self.path != ":memory:" else "PRAGMA journal_mode=MEMORY")
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(_SCHEMA)
        if "epoch" not in {column for _, column, *_ in self.db.execute("PRAGMA table_info(pending)")}:
            self.db.execute("ALTER TABLE pending ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0")  # a table from before it
        row = self.db.execute("SELECT value FROM meta WHERE key = 'epoch'").fetchone()
        self.epoch = int(row[0]) if row else 1
        self._count = self.db.execute("SELECT count(*) FROM pending WHERE state = 'pending'").fetchone()[0]
        self._reload_early()
        self._in_tx = False
        # The open epoch's added points, in memory until a checkpoint (or MEMORY_ROWS changes): a point and its
        # label in one epoch then reach the table as one small row, the labeled mark, instead of an insert of the
        # point and an update. No library keeps a write-behind buffer in front of SQLite with this undo-by-epoch
        # contract, hence by hand. key -> (state, at, point JSON or None, arrival n), in the order
        # they came. A restore drops the epoch's changes anyway, so a crash loses nothing a restore would keep.
        # ``_by_time``: (at, n, key) of each, for expiry (stale ones skipped). An id added is looked up in the
        # table once per batch (``_unverified``, :meth:`_verify`): one that is there already (rare) is in
        # ``_replacing``, and its row is logged for undo when the memory is written over it.
        self._mem: dict[str, tuple[str, float, bytes | None, int]] = {}
        self._by_time: list[tuple[float, int, str]] = []
        self._arrivals = 0
        self._unverified: list[str] = []
        self._replacing: set[str] = set()
        # Labels taken from the table's rows since the batch began: their updates and undo entries, written
        # with one executemany each at the batch's commit.
        self._takes: list[tuple[float, int, str]] = []  # (labeled at, epoch, id)
        self._undo: list[tuple[int, str, bytes]] = []  # the takes' undo entries
        self._rows: dict[str, tuple | None] = {}  # the table's rows read ahead for a batch's labels (None: absent)
        # The ids changed in the open epoch, for the Kafka store's changelog (:meth:`changed`): in memory, as many
        # as the epoch's changes (the changelog sends them all at its checkpoint anyway), and only when asked for.
        self._changed: set[str] | None = set() if track_changes else None
        self.evicted = 0  # pending points evicted to stay within max_pending, since the caller last took the count

    # changes (each inside the open transaction, logged for undo) -----------
    def _begin(self) -> None:
        if not self._in_tx:
            self.db.execute("BEGIN")
            self._in_tx = True

    def _log(self, key: str) -> None:
        """Before a change of ``key``'s row: its value, if this epoch has not logged it yet (see the module docstring)."""
        old = self.db.execute("SELECT state, at, point, epoch FROM pending WHERE id = ?", (key,)).fetchone()
        if old is None or old[3] < self.epoch:
            self.db.execute("INSERT INTO undo (epoch, id, old) VALUES (?, ?, ?)", (self.epoch, key, _undo_value(old)))
        if self._changed is not None:
            self._changed.add(key)

    def _verify(self) -> None:
        """The ids added since the last look, looked up in the table (a query per READ_AHEAD_CHUNK): one found
        there is replaced by its point in memory, so its row no longer counts (a query per point cost more than
        the write it saves)."""
        keys = [k for k in dict.fromkeys(self._unverified) if k in self._mem and k not in self._replacing]
        self._unverified = []
        if keys and self._takes:  # the table as the labels taken left it
            self._flush_takes()
        for key, state in self._rows_of(keys, "state"):
            self._replacing.add(key)
            self._count -= state == "pending"

    def _rows_of(self, keys: list[str], columns: str) -> list[tuple]:
        """(id, ``columns``...) of the table's rows of ``keys``, a query per READ_AHEAD_CHUNK ids."""
        found = []
        for i in range(0, len(keys), READ_AHEAD_CHUNK):
            chunk = keys[i:i + READ_AHEAD_CHUNK]
            found += self.db.execute(f"SELECT id, {columns} FROM pending WHERE id IN ({','.join('?' * len(chunk))})", chunk)
        return found

    def add(self, point_id: str | int, point: dict, now: float) -> dict | None:
        """Keep ``point`` until its label comes (older points beyond max_pending are evicted: counted in ``evicted``);
        or, when its label came first and waits (:meth:`hold`), mark it labeled and return that label: the caller
        joins them.

        A second point with the same id replaces the first: the label that
        comes is for the decision published last.
        """
        key, mem = _key(point_id), self._mem
        if key in self._early:
            return self._join_early(key, now)
        blob = orjson.dumps(point)
        old = mem.pop(key, None)  # popped: a point added again arrives again
        if old is None:
            self._unverified.append(key)  # new, unless the table has it (counted as new until looked up)
        self._count += old is None or old[0] != "pending"
        self._remember(key, "pending", now, blob)

    def _join_early(self, key: str, now: float) -> dict:
        """The early label of ``key``, its row now the labeled mark (a row of the table is replaced, logged for undo)."""
        label = self._early.pop(key)[1]
        if self._mem.pop(key, None) is None:  # not held in this epoch: the table's row is replaced, logged for undo
            self._unverified.append(key)  # (looked up at the next write, with the other ids added)
        self._remember(key, "labeled", now, None)
        return orjson.loads(label)

    def hold(self, label_id: str | int, label: dict, at: float) -> None:
        """Keep ``label``, whose point has not come (:meth:`take` found no row), until :meth:`add` brings the point
        or :meth:`pop_early` lets it go. A second label for it is a duplicate (:meth:`take`)."""
        key, blob = _key(label_id), orjson.dumps(label)
        self._remember(key, EARLY, at, blob)
        self._early[key] = (at, blob)
        heapq.heappush(self._early_by_time, (at, key))

    def early_count(self) -> int:
        """Labels waiting for their point."""
        return len(self._early)

    def next_early(self) -> float | None:
        """The time of the oldest label waiting (None: none waits)."""
        by_time, early = self._early_by_time, self._early
        while by_time and early.get(by_time[0][1], (None,))[0] != by_time[0][0]:
            heapq.heappop(by_time)  # stale: joined, let go, or held again since
        return by_time[0][0] if by_time else None

    def pop_early(self, cutoff: float | None = None, most: int | None = None) -> list[dict]:
        """The labels that waited since ``cutoff`` or before (None: the oldest ``most``), oldest first, forgotten."""
        out: list[dict] = []
        while most is None or len(out) < most:
            at = self.next_early()
            if at is None or (cutoff is not None and at > cutoff):
                break
            _, key = heapq.heappop(self._early_by_time)
            blob = self._early.pop(key)[1]
            self._rows.pop(key, None)
            if self._mem.pop(key, None) is None:  # in the table: deleted, logged for undo
                self._settle_takes()
                self._begin()
                self._log(key)
                self.db.execute("DELETE FROM pending WHERE id = ?", (key,))
            out.append(orjson.loads(blob))
        return out

    def _reload_early(self) -> None:
        """The early labels' ids and times, from the table (at open and after a restore)."""
        self._early = {key: (at, bytes(point)) for key, at, point in
                       self.db.execute("SELECT id, at, point FROM pending WHERE state = ?", (EARLY,))}
        self._early_by_time = [(at, key) for key, (at, _) in self._early.items()]
        heapq.heapify(self._early_by_time)

    def _remember(self, key: str, state: str, at: float, point: bytes | None) -> None:
        """``key``'s row of the open epoch, in memory (written once MEMORY_ROWS changes are)."""
        self._arrivals += 1
        self._mem[key] = (state, at, point, self._arrivals)
        heapq.heappush(self._by_time, (at, self._arrivals, key))
        if len(self._by_time) > MEMORY_ROWS:
            self._write()

    def _write(self) -> None:
        """Everything to the table: the labels taken, then the new rows in memory (in the order they came)."""
        self._verify()
        self._settle_takes()
        mem = self._mem
        if mem:
            self._mem, self._by_time = {}, []
            self._begin()
            for key in self._replacing:
                self._log(key)
            self._replacing = set()
            epoch = self.epoch
            self.db.executemany("INSERT OR REPLACE INTO pending (id, state, at, point, epoch) VALUES (?, ?, ?, ?, ?)",
                                ((k, state, at, point, epoch) for k, (state, at, point, _) in mem.items()))
            if self._changed is not None:
                self._changed.update(mem)

    def _make_room(self) -> None:
        """The ids added looked up; beyond max_pending, the oldest pending points evicted: before anything reads."""
        if self._unverified:
            self._verify()
        if self._count > self.max_pending:
            self._write()
            self.evicted += self._evict()

    def flush(self) -> None:
        """Write every change to the table (evicting beyond max_pending first), and forget the rows read ahead."""
        self._make_room()
        self._write()

    def _settle_takes(self) -> None:
        """The labels taken written, and the rows read ahead for them forgotten (the table may change next)."""
        if self._takes:
            self._flush_takes()
        self._rows = {}

    def _flush_takes(self) -> None:
        """The labels taken from the table's rows: their undo entries, then the rows marked labeled."""
        takes, undo = self._takes, self._undo
        self._takes, self._undo = [], []
        self._begin()
        if undo:
            self.db.executemany("INSERT INTO undo (epoch, id, old) VALUES (?, ?, ?)", undo)
        self.db.executemany("UPDATE pending SET state = 'labeled', at = ?, point = NULL, epoch = ? WHERE id = ?", takes)
        if self._changed is not None:
            self._changed.update(key for _, _, key in takes)

    def read_ahead(self, point_ids) -> None:
        """Read the table's rows of ``point_ids`` (a batch's labels) in a few queries: their :meth:`take` then
        reads nothing. Ids of the open epoch's new rows are in memory already.

        A take cost five statements (read, read again for the undo entry,
        log, update); with the rows read ahead and the writes buffered, a
        batch of labels costs a query per READ_AHEAD_CHUNK ids and one or two
        ``executemany`` (bench/pending.py).
        """
        self._make_room()
        mem, rows = self._mem, self._rows
        keys = [k for k in dict.fromkeys(map(_key, point_ids)) if k not in mem and k not in rows]
        rows.update(dict.fromkeys(keys))  # absent unless found
        for key, *row in self._rows_of(keys, "state, at, point, epoch"):
            rows[key] = tuple(row)

    def take(self, point_id: str | int, now: float) -> dict | str | None:
        """The pending point of ``point_id`` (now marked labeled), ``"duplicate"`` when it was labeled
        already (or a label for it waits, early), None when unknown (never seen, expired, evicted: see :meth:`hold`)."""
        self._make_room()
        key = _key(point_id)
        row = self._mem.get(key)
        if row is not None:  # a point of the open epoch: its row becomes the labeled mark, in memory
            if row[0] != "pending":  # labeled, or its label waits already (early)
                return "duplicate"
            self._count -= 1
            self._remember(key, "labeled", now, None)
            return orjson.loads(row[2])
        row = self._rows.get(key, _UNREAD)
        if row is _UNREAD:
            row = self.db.execute("SELECT state, at, point, epoch FROM pending WHERE id = ?", (key,)).fetchone()
        if row is None:
            return None
        state, at, point, epoch = row
        if state != "pending":
            return "duplicate"
        self._rows[key] = ("labeled", now, None, self.epoch)  # a second label for it in this batch is a duplicate
        self._takes.append((now, self.epoch, key))
        if epoch < self.epoch:  # a point of an earlier epoch: a restore of it brings the point back
            self._undo.append((self.epoch, key, _undo_value(row)))
        self._count -= 1
        return orjson.loads(point)

    def expire(self, now: float) -> int:
        """Forget points (and labeled marks) older than the TTL; how many *pending* points expired."""
        self._make_room()
        self._settle_takes()
        cutoff = now - self.ttl_seconds
        expired = 0
        mem, by_time = self._mem, self._by_time
        while by_time and by_time[0][0] < cutoff:  # the open epoch's, in memory: gone without a trace
            _, n, key = heapq.heappop(by_time)
            row = mem.get(key)
            if row is not None and row[3] == n and row[0] != EARLY:  # not stale (changed since); early: the grace's
                del mem[key]
                expired += row[0] == "pending"
                if key in self._replacing:  # the row it replaces goes too
                    self._replacing.discard(key)
                    self._begin()
                    self._log(key)
                    self.db.execute("DELETE FROM pending WHERE id = ?", (key,))
        # The oldest first, at most EXPIRE_AT_ONCE: one range of the (state, at) index per state, merged. A
        # query on ``at`` alone scans the whole table (30 ms at 300,000 points), and it runs every batch.
        ranges = [self.db.execute("SELECT at, id, state FROM pending WHERE state = ? AND at < ? ORDER BY at LIMIT ?",
                                  (state, cutoff, EXPIRE_AT_ONCE)) for state in STATES]
        old = list(islice(heapq.merge(*ranges), EXPIRE_AT_ONCE))
        if old:
            self._begin()
            for _, key, state in old:
                if key in mem:  # replaced by a point in memory (its expiry is the point's)
                    continue
                self._log(key)
                self.db.execute("DELETE FROM pending WHERE id = ?", (key,))
                expired += state == "pending"
        self._count -= expired
        return expired

    def _evict(self) -> int:
        over = self._count - self.max_pending
        if over <= 0:
            return 0
        keys = [k for (k,) in self.db.execute("SELECT id FROM pending WHERE state = 'pending' ORDER BY at, rowid LIMIT ?", (over,))]
        for key in keys:
            self._log(key)
            self.db.execute("DELETE FROM pending WHERE id = ?", (key,))
        self._count -= len(keys)
        return len(keys)

    # checkpoints ----------------------------------------------------------
    def commit(self) -> None:
        """The end of a batch: the labels taken from the table's rows written and committed (the open epoch's new
        rows stay in memory: a restore would drop them anyway; the checkpoint's ``before_save`` writes them)."""
        self._make_room()
        self._settle_takes()
        self._commit_tx()

    def _commit_tx(self) -> None:
        if self._in_tx:
            self.db.execute("COMMIT")
            self._in_tx = False

    def checkpoint(self, seq: int) -> None:
        """Checkpoint ``seq`` was taken: later changes belong to epoch seq + 1; undo older than KEEP_EPOCHS goes."""
        self.flush()  # the epoch's rows in memory too: they are checkpoint seq's
        self._begin()
        self._open_epoch(seq + 1)
        self.db.execute("DELETE FROM undo WHERE epoch <= ?", (seq - KEEP_EPOCHS,))
        self._commit_tx()

    def _open_epoch(self, epoch: int) -> None:
        """Changes from now on belong to ``epoch`` (stored with the table; inside the open transaction)."""
        self.epoch = epoch
        self.db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('epoch', ?)", (str(epoch),))
        if self._changed is not None:
            self._changed = set()

    def rollback_to(self, seq: int) -> None:
        """Undo every change made after checkpoint ``seq`` (0: since the table was created)."""
        self._write()  # not evicting first: the undo may make room, and an eviction now would be counted
        self._commit_tx()
        self._begin()
        for key, old in self.db.execute("SELECT id, old FROM undo WHERE epoch > ? ORDER BY seq DESC", (seq,)).fetchall():
            if old is None:
                self.db.execute("DELETE FROM pending WHERE id = ?", (key,))
            else:
                state, at, point, *epoch = orjson.loads(old)  # no epoch: an entry from before the column
                self.db.execute("INSERT OR REPLACE INTO pending (id, state, at, point, epoch) VALUES (?, ?, ?, ?, ?)",
                                (key, state, at, None if point is None else point.encode(), epoch[0] if epoch else 0))
        self.db.execute("DELETE FROM undo WHERE epoch > ?", (seq,))
        # rows made after checkpoint seq (never logged): a scan, but a restore is rare and an index on epoch
        # would cost every add and take
        self.db.execute("DELETE FROM pending WHERE epoch > ?", (seq,))
        self._open_epoch(seq + 1)
        self._commit_tx()
        self._count = self.db.execute("SELECT count(*) FROM pending WHERE state = 'pending'").fetchone()[0]
        self._reload_early()

    def pending_count(self) -> int:
        self._make_room()
        return self._count

    # the changelog of the Kafka store ---------------------------------------
    def changed(self) -> list[tuple[str, list | None]]:
        """Each id changed in the open epoch with its row now (``[state, at, point]``, or None: gone), for a changelog
        (a table made with ``track_changes``)."""
        if self._changed is None:
            raise RuntimeError("changed() needs a PendingTable made with track_changes=True")
        self.flush()
        keys = sorted(self._changed)
        rows = {key: [state, at, point.decode() if point else None]
                for key, state, at, point in self._rows_of(keys, "state, at, point")}
        return [(key, rows.get(key)) for key in keys]

    def load(self, rows: dict[str, list], epoch: int) -> None:
        """Replace the whole table by ``rows`` (id → [state, at, point JSON or None]), as of checkpoint ``epoch - 1``."""
        self._mem, self._by_time, self._takes, self._undo, self._rows = {}, [], [], [], {}
        self._unverified, self._replacing = [], set()
        self._commit_tx()
        self._begin()
        self.db.execute("DELETE FROM pending")
        self.db.execute("DELETE FROM undo")
        self.db.executemany("INSERT INTO pending (id, state, at, point, epoch) VALUES (?, ?, ?, ?, ?)",
                            ((k, st, at, None if point is None else point.encode(), epoch - 1) for k, (st, at, point) in rows.items()))
        self._open_epoch(epoch)
        self._commit_tx()
        self._count = self.db.execute("SELECT count(*) FROM pending WHERE state = 'pending'").fetchone()[0]
        self._reload_early()

    def close(self) -> None:
        self.flush()
        self.commit()
        self.db.close()
