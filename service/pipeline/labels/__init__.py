"""How is a label joined? The delayed-label path, whole: points kept until their label comes, joined by id.

The seeds' online protocol is "receive x, predict, observe y, pay for a
mistake, update" (seed 004); here the label may come long after the
decision was published. A point with an ``id`` and no ``y`` is predicted and
published at once and kept in its partition's pending table
(:mod:`perceptron_stream.state.pending`: SQLite, TTL, cap). When its label comes (on
``--label-topic``, partitioned like the input, keyed like its point), the
model learns (x, y) with its current weights (the update condition is the
current y·score ≤ 0: that keeps the (R/γ)² bound), the *published*
prediction's outcome is counted (the mistake rate is that of the decisions
made), and an outcome message is published (:mod:`.join`).

A label may also reach the brokers before its point: the point's producer
holds it in a batch (``linger.ms``), retries it, or takes a slower path. No
end offset can know of a record on no broker, so the join waits on both
sides, as Kafka Streams' stream-stream joins do: a label that finds no point
is kept in the same table (an *early* row) and, when its point comes, the
point is predicted and published first and then joined at once. A label
still alone once the partition's points' stream time has passed its own time
by the grace period (``--label-grace-seconds``: a producer's delivery
timeout, after which a point sent before the label is on the brokers or
never will be) is ``unknown_id``, as is one beyond ``--max-early-labels``; a
second label for a point, whether it came after the join or while the first
waited, is a ``duplicate``: dead letters, nothing learned twice.

The tables belong to the task and are restored with its checkpoint: the
local store keeps them beside the checkpoints and undoes what came after the
restored one; the Kafka store writes each checkpoint's changes to a
compacted changelog topic before the checkpoint, tagged with the checkpoint
they belong to and the run that wrote them, and rebuilds the tables from it
(:mod:`perceptron_stream.state.changelog`): changes a crashed run wrote after its last
checkpoint are recognised and undone, as Kafka Streams restores a store from
its changelog.

Where each part lives:

- :mod:`.joiner` (:class:`Joiner`): one task's half, by input partition: keep
  a point, take a label (join it, hold it early, or dead-letter it), the
  grace clock, the tables' checkpoints;
- :mod:`.span` (:class:`SpanLabels`): the one hook a task's batch calls
  (:class:`~perceptron_stream.pipeline.task.Task` obtains it from its joiner
  once per batch): its points kept or joined as they are published, one at a
  time or a span at once, and its label batches;
- :mod:`.join` (:class:`~.join.Join`): the join itself (learn, count,
  publish the outcome) and the label dead letters;
- :mod:`.gate` (:class:`LabelGate`): the instance's half, at three moments
  of each turn of the poll loop (:mod:`perceptron_stream.app`): before it
  (the grace clock moved on when the input is read to its end; labels due),
  around its batch (expiry before, early labels let go after), after its
  flush (the commit, the gauges' numbers, the label partitions paced).
"""

from perceptron_stream.pipeline.labels.gate import LabelGate
from perceptron_stream.pipeline.labels.joiner import Joiner
from perceptron_stream.pipeline.labels.span import SpanLabels

__all__ = ["Joiner", "LabelGate", "SpanLabels"]
