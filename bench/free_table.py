"""FreeTable: the least a pending table can cost, to measure what any redesign of the service's could reach.

    python3 bench/free_table.py /tmp/free-tree     # a source tree whose service keeps its points in a FreeTable
    python3 bench/e2e.py --client service-labels --service-tree free=/tmp/free-tree ...   # end to end, beside it

A dict of points by id, a set of labeled ids and a dict of early labels,
kept nowhere else: no file, no checkpoint, no undo, no expiry, no bound. It
answers as the service's :class:`~perceptron_stream.state.pending.PendingTable`
does while nothing crashes, so the service around it does all its other work
(the join, the learning, the outcomes, the tallies): a decision measured with
it is a decision with every possible saving of the table taken. It keeps no
guarantee (a restart forgets every point), so it is a measuring stick, never
a table: :func:`main` writes it into a copy of the tree, as that tree's
``PendingTable``, and bench/own_work.py puts it in place of the table in its
process (``--only "+ both, labels joined, a dict"``).
"""

from __future__ import annotations

import argparse
import inspect
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class FreeTable:
    """A partition's points and early labels in dicts, as :class:`PendingTable` answers while nothing crashes."""

    def __init__(self, path=":memory:", *, ttl_seconds: float = 0.0, max_pending: int = 0, track_changes=False):
        self.path, self.evicted, self.epoch = str(path), 0, 1
        self.points: dict = {}
        self.labeled: set = set()
        self.early: dict = {}  # id → (at, label)

    def add(self, point_id, point: dict, now: float) -> dict | None:
        held = self.early.pop(point_id, None)
        if held is not None:
            self.labeled.add(point_id)
            return held[1]
        self.points[point_id] = point
        return None

    def take(self, point_id, now: float) -> dict | str | None:
        point = self.points.pop(point_id, None)
        if point is None:
            return "duplicate" if point_id in self.labeled or point_id in self.early else None
        self.labeled.add(point_id)
        return point

    def hold(self, label_id, label: dict, at: float) -> None:
        self.early[label_id] = (at, label)

    def waiting(self, point_id) -> dict | None:
        held = self.early.get(point_id)
        return None if held is None else held[1]

    def early_count(self) -> int:
        return len(self.early)

    def next_early(self) -> float | None:
        return min((at for at, _ in self.early.values()), default=None)

    def pop_early(self, cutoff: float | None = None, most: int | None = None) -> list[dict]:
        due = sorted((at, i) for i, (at, _) in self.early.items() if cutoff is None or at <= cutoff)
        return [self.early.pop(i)[1] for _, i in due[:most]]

    def pending_count(self) -> int:
        return len(self.points)

    def expire(self, now: float) -> int:
        return 0

    def read_ahead(self, point_ids) -> None:
        pass

    def commit(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def checkpoint(self, seq: int) -> None:
        self.epoch = seq + 1

    def changed(self) -> list:
        return []

    def load(self, rows: dict, epoch: int) -> None:
        self.points, self.labeled, self.early, self.epoch = {}, set(), {}, epoch

    def rollback_to(self, seq: int) -> None:
        self.load({}, seq + 1)

    def close(self) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree", type=Path, help="an empty directory: the tree at HEAD, its PendingTable a FreeTable")
    parser.add_argument("--commit", default="HEAD", help="the commit the tree is made of (default HEAD)")
    args = parser.parse_args()
    args.tree.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.commit], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(args.tree)], input=archive.stdout, check=True)
    table = args.tree / "service" / "state" / "pending" / "table.py"
    table.write_text(
        table.read_text()
        + "\n\n# bench/free_table.py: this tree measures the least a table can cost; it keeps no guarantee\n"
        + inspect.getsource(FreeTable)
        + "\n\nPendingTable = FreeTable  # type: ignore[misc]\n"
    )
    print(f"{args.tree}: the tree at {args.commit}, its pending tables FreeTables (bench/free_table.py)")


if __name__ == "__main__":
    main()
