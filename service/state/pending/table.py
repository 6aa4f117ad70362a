"""The pending table of one input partition: its rows on disk and the open epoch's in memory, behind one face.

:class:`PendingTable` keeps a partition's points until their label comes and
its labels until their point comes (see :mod:`perceptron_stream.state.pending`); it
decides what lives where: the open epoch's new rows in memory
(:mod:`.memory`), the rest on disk with their undo log (:mod:`.undo`), read a
batch at a time (:mod:`.queries`). A point of the open epoch is held as the
dict it was added as, and a label that comes within the epoch takes that
dict: its JSON is made only if it is written (a flush or a checkpoint finds it
pending), where every point's JSON was written and read back (3 µs of a
decision's own work, bench/README.md, "Delayed labels at the speed of plain
events"). Two verbs write: :meth:`PendingTable.commit`
at the end of a batch (the labels taken from the table's rows), and
:meth:`PendingTable.flush` (the memory too: before a checkpoint, or when it is
full).

Why a take of an earlier epoch's point is written at its batch's commit and
not held in memory to the checkpoint with the epoch's new rows: tried
(2026-11-29), its mark written at the checkpoint by the same ``INSERT OR
REPLACE`` as the new rows cost more than the ``UPDATE`` it saved (the write of
the checkpoint's rows went from 7 to 11-13 µs a decision, the ``UPDATE`` and
its undo entry were 3.8; a replaced row is a delete and an insert in each of
the table's three B-trees), and a table reopened after a crash shows the
batch's takes (tests/state/test_pending.py). SQLite's ``mmap_size``,
``cache_size`` 64 MiB, ``temp_store`` and ``wal_autocheckpoint`` were measured
no better either (bench/README.md, "Delayed labels at the speed of plain
events", 2026-11-29).
"""

from __future__ import annotations

import heapq
from pathlib import Path

import orjson
from perceptron_stream.state.pending.memory import OpenEpochRows
from perceptron_stream.state.pending.queries import oldest, rows_of
from perceptron_stream.state.pending.undo import EARLY, STATES, UndoTable, undo_value


def _stored(row: dict) -> bytes:
    """``row``'s JSON in a bytes object of its own size, to be held: orjson (3.13) returns its result in the
    4 KiB buffer it wrote it into, so 50,000 early labels held in memory cost 200 MB instead of 4
    (tracemalloc: 4,098 against 64 bytes a label; bench/README.md, "Memory").

    >>> _stored({"id": "a", "y": 1})
    b'{"id":"a","y":1}'
    """
    return bytes(memoryview(orjson.dumps(row)))


def row_key(point_id: str | int) -> str:
    """Ids are strings or integers on the wire: ``7`` and ``"7"`` are different points."""
    return f"i:{point_id}" if type(point_id) is int else f"s:{point_id}"


class PendingTable:
    """A partition's pending points and early labels (see :mod:`perceptron_stream.state.pending`); ``path`` a file, or
    ``":memory:"``."""

    def __init__(self, path: str | Path, *, ttl_seconds: float, max_pending: int, track_changes: bool = False):
        self.ttl_seconds, self.max_pending = ttl_seconds, max_pending
        self.disk = UndoTable(path, track_changes)
        self.path = self.disk.path  # where the table lives: beside the task's checkpoints, or in a cache directory
        self.memory = OpenEpochRows()
        self._count = self.disk.count_pending()
        # early labels: id -> (label time, label JSON), and (time, id) by time (stale entries skipped), as the table
        # holds them: in memory too, so a point finds its label without a query (a query a point cost a replay,
        # whose labels are read far ahead of their points, a third of its CPU); at most --max-early-labels a table
        self._early: dict[str, tuple[float, bytes]] = {}
        self._peeked: dict[str, dict] = {}  # early labels :meth:`waiting` read, for :meth:`add` to take as they are
        self._early_by_time: list[tuple[float, str]] = []
        self._reload_early()
        # Labels taken from the table's rows since the batch began: their updates and undo entries, written
        # with one executemany each at the batch's commit.
        self._takes: list[tuple[float, int, str]] = []  # (labeled at, epoch, id)
        self._undo: list[tuple[int, str, bytes | None]] = []  # the takes' undo entries
        self._rows: dict[str, tuple | None] = {}  # the table's rows read ahead for a batch's labels (None: absent)
        self.evicted = 0  # pending points evicted to stay within max_pending, since the caller last took the count

    @property
    def db(self):
        """The SQLite connection (for tests and benchmarks that look at the rows)."""
        return self.disk.db

    @property
    def epoch(self) -> int:
        """The open epoch: the next checkpoint's seq."""
        return self.disk.epoch

    # points and labels ------------------------------------------------------
    def add(self, point_id: str | int, point: dict, now: float) -> dict | None:
        """Keep ``point`` until its label comes (older points beyond max_pending are evicted: counted in ``evicted``);
        or, when its label came first and waits (:meth:`hold`), mark it labeled and return that label: the caller
        joins them.

        A second point with the same id replaces the first: the label that
        comes is for the decision published last.
        """
        key, memory = row_key(point_id), self.memory
        if key in self._early:
            return self._join_early(key, now)
        old = memory.rows.pop(key, None)  # popped: a point added again arrives again
        if old is None:
            memory.unverified.append(key)  # new, unless the table has it (counted as new until looked up)
        self._count += old is None or old[0] != "pending"
        self._remember(key, "pending", now, point)  # held as it is: its JSON is made only if it is written
        return None

    def _join_early(self, key: str, now: float) -> dict:
        """The early label of ``key``, its row now the labeled mark (a row of the table is replaced, logged for undo)."""
        label = self._early.pop(key)[1]
        peeked = self._peeked.pop(key, None)
        if (
            self.memory.rows.pop(key, None) is None
        ):  # not held in this epoch: the table's row is replaced, logged for undo
            self.memory.unverified.append(key)  # (looked up at the next write, with the other ids added)
        self._remember(key, "labeled", now, None)
        return orjson.loads(label) if peeked is None else peeked

    def hold(self, label_id: str | int, label: dict, at: float) -> None:
        """Keep ``label``, whose point has not come (:meth:`take` found no row), until :meth:`add` brings the point
        or :meth:`pop_early` lets it go. A second label for it is a duplicate (:meth:`take`)."""
        key, blob = row_key(label_id), _stored(label)
        self._peeked.pop(key, None)
        self._remember(key, EARLY, at, blob)
        self._early[key] = (at, blob)
        heapq.heappush(self._early_by_time, (at, key))

    def waiting(self, point_id: str | int | None) -> dict | None:
        """The label that waits for point ``point_id`` (:meth:`add` would join them), left waiting; None: none."""
        if point_id is None:
            return None
        key = row_key(point_id)
        label = self._peeked.get(key)
        if label is None:
            held = self._early.get(key)
            if held is None:
                return None
            label = self._peeked[key] = orjson.loads(held[1])  # read once: add returns this one
        return label

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
            self._peeked.pop(key, None)
            self._rows.pop(key, None)
            if self.memory.rows.pop(key, None) is None:  # in the table: deleted, logged for undo
                self._forget_read_ahead()
                self.disk.delete(key)
            out.append(orjson.loads(blob))
        return out

    def _reload_early(self) -> None:
        """The early labels' ids and times, from the table (at open and after a restore)."""
        self._early = {key: (at, bytes(point)) for key, at, point in self.disk.early_rows()}
        self._peeked = {}
        self._early_by_time = [(at, key) for key, (at, _) in self._early.items()]
        heapq.heapify(self._early_by_time)

    def read_ahead(self, point_ids) -> None:
        """Read the table's rows of ``point_ids`` (a batch's labels) in a few queries: their :meth:`take` then
        reads nothing. Ids of the open epoch's new rows are in memory already.

        A take cost five statements (read, read again for the undo entry,
        log, update); with the rows read ahead and the writes buffered, a
        batch of labels costs a query per READ_AHEAD_CHUNK ids and one or two
        ``executemany`` (bench/pending.py).
        """
        self._make_room()
        mem, rows = self.memory.rows, self._rows
        keys = [k for k in dict.fromkeys(map(row_key, point_ids)) if k not in mem and k not in rows]
        rows.update(dict.fromkeys(keys))  # absent unless found
        for key, *row in rows_of(self.disk.db, keys, "state, at, point, epoch"):
            rows[key] = tuple(row)

    def take(self, point_id: str | int, now: float) -> dict | str | None:
        """The pending point of ``point_id`` (now marked labeled), ``"duplicate"`` when it was labeled
        already (or a label for it waits, early), None when unknown (never seen, expired, evicted: see :meth:`hold`)."""
        self._make_room()
        key = row_key(point_id)
        row = self.memory.rows.get(key)
        if row is not None:  # a point of the open epoch: its row becomes the labeled mark, in memory
            if row[0] != "pending":  # labeled, or its label waits already (early)
                return "duplicate"
            self._count -= 1
            self._remember(key, "labeled", now, None)
            assert type(row[2]) is dict  # a pending row of the open epoch holds its point, as added
            return row[2]
        stored = self._rows[key] if key in self._rows else self.disk.row(key)
        if stored is None:
            return None
        state, _, blob, epoch = stored
        if state != "pending":
            return "duplicate"
        open_epoch = self.disk.epoch
        self._rows[key] = ("labeled", now, None, open_epoch)  # a second label for it in this batch is a duplicate
        self._takes.append((now, open_epoch, key))
        if epoch < open_epoch:  # a point of an earlier epoch: a restore of it brings the point back
            self._undo.append((open_epoch, key, undo_value(stored)))
        self._count -= 1
        assert blob is not None  # a pending row holds its point (its JSON, on disk)
        return orjson.loads(blob)

    def expire(self, now: float) -> int:
        """Forget points (and labeled marks) older than the TTL; how many *pending* points expired."""
        self._make_room()
        self._forget_read_ahead()
        cutoff = now - self.ttl_seconds
        expired = 0
        for key, state, replaced in self.memory.expire(cutoff):  # the open epoch's: gone without a trace
            expired += state == "pending"
            if replaced:  # the row it replaces goes too
                self.disk.delete(key)
        mem = self.memory.rows
        for _, key, state in oldest(self.disk.db, STATES, cutoff):
            if key in mem:  # replaced by a point in memory (its expiry is the point's)
                continue
            self.disk.delete(key)
            expired += state == "pending"
        self._count -= expired
        return expired

    def pending_count(self) -> int:
        self._make_room()
        return self._count

    # what is where ------------------------------------------------------------
    def _remember(self, key: str, state: str, at: float, point: dict | bytes | None) -> None:
        """``key``'s row of the open epoch, in memory (written once MEMORY_ROWS changes are)."""
        if self.memory.remember(key, state, at, point):
            self._write_memory()

    def _verify(self) -> None:
        """The ids added since the last look, looked up in the table (a query per READ_AHEAD_CHUNK): one found
        there is replaced by its point in memory, so its row no longer counts (a query per point cost more than
        the write it saves)."""
        memory = self.memory
        keys = [k for k in dict.fromkeys(memory.unverified) if k in memory.rows and k not in memory.replacing]
        memory.unverified = []
        if keys:  # the table as the labels taken left it
            self._write_takes()
        for key, state in rows_of(self.disk.db, keys, "state"):
            memory.replacing.add(key)
            self._count -= state == "pending"

    def _make_room(self) -> None:
        """The ids added looked up; beyond max_pending, the oldest pending points evicted: before anything reads."""
        if self.memory.unverified:
            self._verify()
        if self._count > self.max_pending:
            self._write_memory()
            over = self._count - self.max_pending
            if over > 0:
                evicted = self.disk.evict(over)
                self._count -= evicted
                self.evicted += evicted

    def _write_memory(self) -> None:
        """Everything to the table: the labels taken, then the new rows in memory (in the order they came)."""
        self._verify()
        self._forget_read_ahead()
        if self.memory.rows:
            self.disk.put(*self.memory.take_all())

    def _write_takes(self) -> None:
        """The labels taken from the table's rows written: their undo entries, then the rows marked labeled."""
        if self._takes:
            takes, undo = self._takes, self._undo
            self._takes, self._undo = [], []
            self.disk.mark_labeled(takes, undo)

    def _forget_read_ahead(self) -> None:
        """The labels taken written, and the rows read ahead for them forgotten (the table may change next)."""
        self._write_takes()
        self._rows = {}

    # writes and checkpoints ---------------------------------------------------
    def flush(self) -> None:
        """Write every change to the table (evicting beyond max_pending first), and forget the rows read ahead."""
        self._make_room()
        self._write_memory()

    def commit(self) -> None:
        """The end of a batch: the labels taken from the table's rows written and committed (the open epoch's new
        rows stay in memory: a restore would drop them anyway; the checkpoint's ``before_save`` writes them)."""
        self._make_room()
        self._forget_read_ahead()
        self.disk.commit()

    def checkpoint(self, seq: int) -> None:
        """Checkpoint ``seq`` was taken: later changes belong to epoch seq + 1; undo older than KEEP_EPOCHS goes."""
        self.flush()  # the epoch's rows in memory too: they are checkpoint seq's
        self.disk.checkpoint(seq)

    def rollback_to(self, seq: int) -> None:
        """Undo every change made after checkpoint ``seq`` (0: since the table was created)."""
        self._write_memory()  # not evicting first: the undo may make room, and an eviction now would be counted
        self.disk.rollback_to(seq)
        self._count = self.disk.count_pending()
        self._reload_early()

    # the changelog of the Kafka store -------------------------------------------
    def changed(self) -> list[tuple[str, list | None]]:
        """Each id changed in the open epoch with its row now (``[state, at, point]``, or None: gone), for a changelog
        (a table made with ``track_changes``)."""
        if self.disk.changed is None:
            raise RuntimeError("changed() needs a PendingTable made with track_changes=True")
        self.flush()
        keys = sorted(self.disk.changed)
        rows = {
            key: [state, at, point.decode() if point else None]
            for key, state, at, point in rows_of(self.disk.db, keys, "state, at, point")
        }
        return [(key, rows.get(key)) for key in keys]

    def load(self, rows: dict[str, list], epoch: int) -> None:
        """Replace the whole table by ``rows`` (id → [state, at, point JSON or None]), as of checkpoint ``epoch - 1``."""
        self.memory.clear()
        self._takes, self._undo, self._rows = [], [], {}
        self.disk.load(rows, epoch)
        self._count = self.disk.count_pending()
        self._reload_early()

    def close(self) -> None:
        self.flush()
        self.commit()
        self.disk.db.close()
