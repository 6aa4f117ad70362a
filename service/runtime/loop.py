"""How a turn of the poll loop goes: the service's one loop, testable through :meth:`Loop.turn` and :meth:`Loop.handle_batch`.

Per turn (:meth:`Loop.turn`): poll (one list of records per partition) → settle
assignments (:mod:`perceptron_stream.runtime.partitions`: restore what was assigned) →
each partition's records to its task (:mod:`perceptron_stream.pipeline.task`: decode →
predict, then learn → prediction or dead letter sent) → wait for the brokers'
acknowledgements (:mod:`perceptron_stream.runtime.delivery`) → checkpoint when due, then
commit (:mod:`perceptron_stream.runtime.checkpointer`; exactly-once: the transaction,
:mod:`perceptron_stream.runtime.transaction`) → lag.

The order is what gives the guarantees (README, guarantees.md): an offset is committed only
after every output of the events before it was acknowledged; a checkpoint holds positions
whose outputs were all acknowledged; a stop inside a batch whose outputs were not all
acknowledged saves nothing (:attr:`Loop.batch_open`, read by the final checkpoint).

No Kafka client here: the loop drives a :class:`~perceptron_stream.kafka.Stream` (any
object with its methods: tests hand it one with no broker behind it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from perceptron_stream.config import ServeSettings
from perceptron_stream.kafka import Aborted, DeliveryError, Fenced, Stream
from perceptron_stream.metrics import ServiceMetrics
from perceptron_stream.pipeline.labels import LabelGate
from perceptron_stream.pipeline.task import Tally, TaskSet
from perceptron_stream.runtime.checkpointer import Checkpointer
from perceptron_stream.runtime.delivery import Delivery
from perceptron_stream.runtime.health import Health, LagProbe
from perceptron_stream.runtime.mixing import MixFeed
from perceptron_stream.runtime.partitions import Assignments
from perceptron_stream.runtime.retry import Retry, StartupError


def turn_did(saved: str, tally: Tally | None, probed: bool) -> str:
    """What a turn did, for its time (``perceptron_poll_loop_turn_seconds{did}``, one of
    :data:`~perceptron_stream.metrics.TURN_KINDS`): its costliest part by rule, so that a slow turn is put down to
    what made it slow: a transaction's commit, a checkpoint or a commit (a round trip, a write and an fsync) before
    a mix, before a label release, before a plain batch, before a probe of the lag. ``saved``: what the
    checkpointer did; ``tally``: the batch's (None: no batch); ``probed``: the lag asked of the brokers. An idle
    turn ("") is not counted.

    >>> turn_did("checkpoint", Tally(), False), turn_did("", None, True), turn_did("", None, False)
    ('checkpoint', 'probe', '')
    """
    if saved:
        return saved  # a transaction's commit, a checkpoint (with its commit), a commit
    if tally is not None:
        if tally.mixes:
            return "mix"
        if tally.joined or tally.label_outcomes:
            return "labels"
        if tally.labeled or tally.unlabeled or tally.rejected:
            return "batch"
    return "probe" if probed else ""


class Loop:
    """The poll loop over ``stream``, driving the parts the application wired (each named as the application
    names it); ``stopping`` says when to return."""

    def __init__(
        self,
        stream: Stream,
        *,
        settings: ServeSettings,
        tasks: TaskSet,
        assignments: Assignments,
        checkpointer: Checkpointer,
        delivery: Delivery,
        label_gate: LabelGate,
        mix_feed: MixFeed | None,
        lag: LagProbe,
        retry: Retry,
        health: Health,
        metrics: ServiceMetrics,
        stopping: Callable[[], bool],
    ):
        self.stream, self.settings, self.tasks, self.assignments = stream, settings, tasks, assignments
        self.checkpointer, self.delivery, self.label_gate, self.mix_feed = checkpointer, delivery, label_gate, mix_feed
        self.lag, self.retry, self.health, self.metrics, self.stopping = lag, retry, health, metrics, stopping
        self.doing = "connecting to the brokers"  # what the loop is doing, for a stop that does not finish in time

    def run(self) -> int:
        """Turn until the service is asked to stop; 0 (a failure that stops it raises StartupError)."""
        while not self.stopping():
            self.turn()
        return 0

    def turn(self) -> None:
        """One turn: poll, settle assignments, process what came (or the labels due), checkpoint or commit when due,
        read the lag."""
        stream, s, assignments, gate, retry = self.stream, self.settings, self.assignments, self.label_gate, self.retry
        self.health.beat()
        self.doing = f"in the {s.kafka_client} client's poll"
        ok, batches = retry.once(
            lambda: stream.poll(s.poll_timeout_ms, s.batch_size),
            f"read {s.input_topic} in group {s.group_id}",
            probe=True,
        )
        if not ok:
            time.sleep(0.5)
            return
        worked_from, tally = time.perf_counter(), None  # the turn's own work, after the poll's wait
        assignments.settle()
        if self.mix_feed is not None:
            self.mix_feed.follow()
        labels_due = gate.before(  # the grace clock moved on; labels past their grace though no record came
            lambda: retry.once(lambda: stream.lag(ask_broker=False), "read the input's lag"), batches
        )
        if batches and not assignments.may_process():  # other members are still in the group: nothing yet
            assignments.put_back([r for records in batches for r in records])
            batches = []
        self.doing = "processing a batch"
        if batches:
            self.lag.records_came()
        if batches or (labels_due and assignments.may_process()):  # (labels past their grace period go in a batch
            # of no records)
            tally = self.handle_batch(batches)
        else:  # no batch: nothing acknowledged, the label partitions paced only
            pause, resume, _ = gate.after()
            self._pace_labels(pause, resume)
        self.doing = "checkpointing or committing"
        saved = self.checkpointer.maybe(self.tasks.all(), stream)
        self.doing = "reading the lag"
        probed = self.lag.refresh(stream)
        did = turn_did(saved, tally, probed)
        if did:
            self.metrics.observe_turn(did, time.perf_counter() - worked_from)

    def handle_batch(self, batches) -> Tally:
        """One batch (a list of records per partition): each partition's records to its task, the outputs flushed,
        the checkpointer told what was acknowledged, the metrics observed; what it did (its tally). Exactly-once:
        inside the open transaction.

        A stop while the brokers never acknowledged the batch, or a transaction lost, raises StartupError."""
        try:
            return self._process(batches)
        except DeliveryError:  # raised only once stopping: no final checkpoint (Application's)
            # a stop with work left undone is no clean exit: the orchestrator is told
            raise StartupError(
                "stopped while the brokers had not acknowledged the batch's outputs: no final checkpoint; "
                "the next start reads the batch again from the last committed offsets"
            ) from None
        except (Aborted, Fenced) as exc:  # exactly-once: the open transaction is over, nothing of it visible
            transaction = self.checkpointer.transaction
            if transaction is None:
                raise
            raise transaction.lost(exc) from None

    def _process(self, batches) -> Tally:
        stream, assignments, gate, tasks_of = self.stream, self.assignments, self.label_gate, self.tasks
        started = time.perf_counter()
        tally, send = Tally(), self.delivery.sender(stream)
        transaction = self.checkpointer.transaction
        if transaction is not None:  # the batch's outputs go in the open transaction (committed when due)
            transaction.begin(stream)
        assignments.batch_open = True
        for records in gate.turn(batches, send, tally):  # (expiry first, labels last, then their release)
            task = tasks_of.for_partition(records[0].partition)
            if task is None:  # assigned, not restored yet: read again once it is
                assignments.put_back(records)
                continue
            task.process(records, send, tally)
        tasks = tasks_of.all()
        self.doing = "waiting for the brokers to acknowledge the batch's outputs"
        waited_from = time.perf_counter()
        self.delivery.flush(stream)
        self.metrics.observe_flush(time.perf_counter() - waited_from)
        assignments.batch_open = False
        pause, resume, waiting = gate.after(tally)  # waiting: (points pending, labels early), or None
        self.checkpointer.acknowledged(tasks)
        metrics = self.metrics
        metrics.observe_tally(tally, time.perf_counter() - started)
        for model in tasks:  # (every task's model, not only those the batch reached)
            metrics.set_model(model.learner.weight_norm, model.learner.radius, model.partition)
        if waiting is not None:
            metrics.pending.set(waiting[0])
            metrics.early.set(waiting[1])
        self._pace_labels(pause, resume)
        return tally

    def _pace_labels(self, pause: list, resume: list) -> None:
        """The label partitions the gate paces paused or read again: those still assigned (a revoked one's pause
        went with it), and none read again that waits for its restore (it stays paused until then)."""
        if pause or resume:
            assigned, waiting = self.assignments.assigned, self.assignments.waiting
            self.stream.pause([tp for tp in pause if tp in assigned])
            self.stream.resume([tp for tp in resume if tp in assigned and tp[1] not in waiting])
