"""The pending table of delayed labels: points predicted and published, waiting for their label.

One table per input partition, in SQLite (standard library; transactional;
on the local disk; indexed by id and by time): it holds millions of points in
bounded memory, and a checkpoint never rewrites it. Why SQLite and not a
dict: the table must survive a crash in step with the model, and must not
live only in memory (a million pending points of d = 10 are ~1 GB of Python
objects).

Three ideas, a module each, behind one face (:class:`PendingTable`,
:mod:`.table`):

- :mod:`.undo`: the rows on disk, restored together with the model: every
  change is made in the *epoch* of the next checkpoint and the first change
  of an older row is logged with the value it replaced, so restoring
  checkpoint N undoes every later epoch, whichever checkpoint the store falls
  back to;
- :mod:`.memory`: the open epoch's new rows, kept in memory until the
  checkpoint that closes it (a restore would drop them anyway): a label that
  comes within its point's epoch costs one small row and no undo entry;
- :mod:`.queries`: the reads that stay cheap as the table grows (a batch's
  ids a chunk at a time, the oldest rows by index range).

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

from perceptron_stream.state.pending.memory import MEMORY_ROWS
from perceptron_stream.state.pending.queries import EXPIRE_AT_ONCE, READ_AHEAD_CHUNK
from perceptron_stream.state.pending.table import PendingTable
from perceptron_stream.state.pending.undo import EARLY, KEEP_EPOCHS, STATES

__all__ = ["EARLY", "EXPIRE_AT_ONCE", "KEEP_EPOCHS", "MEMORY_ROWS", "READ_AHEAD_CHUNK", "STATES", "PendingTable"]
