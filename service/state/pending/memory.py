"""The open epoch's rows in memory: what a pending table changed since its last checkpoint, not yet on disk.

The points added in the open epoch wait here (at most MEMORY_ROWS changes)
and are written at the checkpoint that closes it: a restore would drop them
anyway, so a crash loses nothing that counts. A label that comes within the
epoch of its point (its delay shorter than the checkpoint interval, as on a
live stream with labels seconds behind) then costs the table, with its point,
one small row (the labeled mark) and no undo entry, where the pair cost an
insert of the point, an update and two undo entries. No library keeps a
write-behind buffer in front of SQLite with this undo-by-epoch contract,
hence by hand (bench/README.md, "Delayed labels and two challengers, end to
end").
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from perceptron_stream.state.pending.undo import EARLY

#: How many changes of new rows a pending table keeps in memory before it writes them (at the latest, the
#: checkpoint writes them): at most about 70 MB of points of d = 10 a table, so a partition, and then only with
#: a checkpoint interval beyond 50,000 events (the default, 10,000, writes them sooner). A point is held as the
#: dict it was added as (tracemalloc: 1,200 bytes with its x, against 443 as JSON), its JSON made only when it
#: is written: most points are labeled within their epoch, and a JSON written and read back was 3 µs of a
#: decision's own work (bench/README.md, "Delayed labels at the speed of plain events").
MEMORY_ROWS = 50_000


class OpenEpochRows:
    """Rows of the open epoch: ``rows`` id → (state, at, point, arrival n), in the order they came (the point: a
    pending one as it was added, a dict, its JSON made only when it is written; an early label's JSON; None);
    ``by_time`` (at, n, id) of each, for expiry (stale entries skipped).

    An id added is looked up in the table once per batch (``unverified``):
    one the table has a row of already (rare) is in ``replacing``, and that row
    is logged for undo when the memory is written over it.
    """

    def __init__(self):
        self.arrivals = 0
        self.clear()

    def clear(self) -> None:
        self.rows: dict[str, tuple[str, float, dict | bytes | None, int]] = {}
        self.by_time: list[tuple[float, int, str]] = []
        self.unverified: list[str] = []
        self.replacing: set[str] = set()

    def remember(self, key: str, state: str, at: float, point: dict | bytes | None) -> bool:
        """``key``'s row now; True once more than MEMORY_ROWS changes wait (time to write them)."""
        self.arrivals += 1
        self.rows[key] = (state, at, point, self.arrivals)
        heapq.heappush(self.by_time, (at, self.arrivals, key))
        return len(self.by_time) > MEMORY_ROWS

    def take_all(self) -> tuple[dict, set[str]]:
        """The rows, to be written, and which of them replace a row of the table; the memory empty of them (ids
        still unverified stay: they are looked up before)."""
        rows, replacing = self.rows, self.replacing
        self.rows, self.by_time, self.replacing = {}, [], set()
        return rows, replacing

    def expire(self, cutoff: float) -> Iterator[tuple[str, str, bool]]:
        """Forget the rows older than ``cutoff`` (not the early labels: they end by the grace period), oldest first:
        (id, state, whether it replaced a row of the table: that row goes too)."""
        rows, by_time = self.rows, self.by_time
        while by_time and by_time[0][0] < cutoff:
            _, n, key = heapq.heappop(by_time)
            row = rows.get(key)
            if row is not None and row[3] == n and row[0] != EARLY:  # not stale (changed since); early: the grace's
                del rows[key]
                replaced = key in self.replacing
                self.replacing.discard(key)
                yield key, row[0], replaced
