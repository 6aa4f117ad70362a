"""A million pending points: memory stays bounded and a checkpoint's cost does not grow with the table.

    python3 bench/pending.py                      # the table of bench/README.md "Delayed labels"
    python3 bench/pending.py --points 200000      # quicker

The pending table of one partition (perceptron_stream.state.pending.PendingTable, SQLite
on disk, as the local store keeps it) takes points of d = 10 as the service
keeps them (features, the published y_pred and score, version, source), in
batches of 1,000 committed like the service's batches, with a checkpoint every
10,000 points; then labels take back a share of them. Reported at each size:
the time of a checkpoint (the table's part: commit and epoch), the time per
point added and per label joined, the process's resident memory, the file's size.
"""

from __future__ import annotations

import argparse
import random
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perceptron_stream.state.pending import PendingTable
from rich.console import Console
from rich.table import Table


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--checkpoint-every", type=int, default=10_000)
    args = parser.parse_args()
    rng = random.Random(1)
    marks = {args.points // 10, args.points // 2, args.points}
    table_view = Table(title=f"{args.points:,} pending points of d = 10, one partition")
    for column in ("pending", "checkpoint ms", "µs per point added", "µs per label joined", "RSS MiB", "file MiB"):
        table_view.add_column(column, justify="right")
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "pending-0.sqlite"
        table = PendingTable(path, ttl_seconds=1e12, max_pending=10 * args.points)
        seq, added_s, since = 0, 0.0, time.perf_counter()
        for i in range(args.points):
            point = {
                "x": [round(rng.uniform(-1, 1), 6) for _ in range(10)],
                "y_pred": 1,
                "score": 0.5,
                "version": i,
                "source": {"topic": "points", "partition": 0, "offset": i},
                "at": 1.7e9 + i,
            }
            table.add(f"app-{i}", point, now=1.7e9 + i)
            if (i + 1) % 1000 == 0:
                table.commit()
            if (i + 1) % args.checkpoint_every == 0:
                added_s += time.perf_counter() - since
                started = time.perf_counter()
                seq += 1
                table.checkpoint(seq)
                checkpoint_ms = (time.perf_counter() - started) * 1000
                if i + 1 in marks:
                    joins = [f"app-{rng.randrange(i + 1)}" for _ in range(2000)]
                    t0 = time.perf_counter()
                    for b in range(0, len(joins), 1000):  # as the service joins a batch's labels
                        if hasattr(table, "read_ahead"):  # (not in trees before it: --tree)
                            table.read_ahead(joins[b : b + 1000])
                        for point_id in joins[b : b + 1000]:
                            table.take(point_id, now=2e9)
                        table.commit()
                    join_us = (time.perf_counter() - t0) / len(joins) * 1e6
                    table_view.add_row(
                        f"{table.pending_count():,}",
                        f"{checkpoint_ms:.1f}",
                        f"{added_s / (i + 1) * 1e6:.1f}",
                        f"{join_us:.1f}",
                        f"{rss_mib():.0f}",
                        f"{path.stat().st_size / 2**20:.0f}",
                    )
                since = time.perf_counter()
        table.close()
    Console().print(table_view)


if __name__ == "__main__":
    main()
