"""The service: wiring, start-up and the stop around the poll loop (:mod:`perceptron_stream.runtime.loop`).

Start-up (:mod:`perceptron_stream.runtime.startup`) opens the topics, the store and the
rest in dependency order; the wiring builds on what it opened (tasks from
:mod:`perceptron_stream.runtime.factory`, the restorer, the checkpointer, the rebalance
callbacks); the stream opens last. Each resource is registered with one
:class:`~contextlib.ExitStack` as it opens and closed in reverse order.

Per turn, the loop (:mod:`perceptron_stream.runtime.loop`): poll → settle assignments →
each partition's records to its task → the outputs acknowledged → checkpoint when due, then
commit (exactly-once: the transaction, :mod:`perceptron_stream.runtime.transaction`) → lag.

Guarantees, and the order above that gives them:

- at-least-once outputs: an offset is committed only after every output of
  the events before it was acknowledged;
- each event learned exactly once across crashes: a checkpoint holds a
  task's model and the positions it reflects and is written only after their
  outputs were acknowledged; on start (group scope) or assignment (partition
  scope) the task is restored and its partitions sought there, so events
  after it are learned again from the same state (``source`` tells copies apart);
  a stop inside a batch whose outputs were not all acknowledged writes no final checkpoint;
- the offsets committed to the group are checkpoints' positions, never more;
- group scope: one instance per model (:class:`~perceptron_stream.runtime.partitions.OneInstance`);
  partition scope: any number, each partition's state moving with it.
"""

from __future__ import annotations

import gc
import logging
from contextlib import ExitStack

from perceptron_stream import __version__
from perceptron_stream.config import ServeSettings
from perceptron_stream.http import HttpEndpoints
from perceptron_stream.kafka import Stream
from perceptron_stream.metrics import ServiceMetrics
from perceptron_stream.pipeline.labels import LabelGate
from perceptron_stream.pipeline.models import REPORT_PAGE, ModelReports, ModelSet
from perceptron_stream.pipeline.task import TaskSet
from perceptron_stream.runtime.checkpointer import Checkpointer
from perceptron_stream.runtime.delivery import Delivery
from perceptron_stream.runtime.factory import TaskFactory
from perceptron_stream.runtime.health import Health, LagProbe
from perceptron_stream.runtime.loop import Loop
from perceptron_stream.runtime.partitions import Assignments
from perceptron_stream.runtime.restore import Restorer
from perceptron_stream.runtime.retry import Retry, StartupError
from perceptron_stream.runtime.shutdown import StopDeadline, left_undone
from perceptron_stream.runtime.startup import (
    CHANGELOG_TOPIC_CONFIG,
    CHECKPOINT_TOPIC_CONFIG,
    Opened,
    Startup,
)
from perceptron_stream.state.checkpoint import Owner

log = logging.getLogger("perceptron_stream")

__all__ = ["CHANGELOG_TOPIC_CONFIG", "CHECKPOINT_TOPIC_CONFIG", "Application", "StartupError"]


class Application:
    """The perceptron service. ``run()`` blocks until SIGTERM/SIGINT or :meth:`stop`."""

    def __init__(self, settings: ServeSettings):
        self.settings = s = settings
        self.per_partition = s.model_scope == "partition"
        self.metrics = ServiceMetrics(
            window=s.mistake_rate_window,
            version=__version__,
            variant=s.variant,
            scope=s.model_scope,
            challengers=[name for name, _, _ in ModelSet.parse(s.challengers)],
        )
        self.health = Health(s.healthz_timeout_seconds, s.bootstrap_servers)
        self.retry = Retry(self.health, lambda: self._stopping)
        self.delivery = Delivery(s, self.health, self.metrics, lambda: self._stopping)
        self.lag = LagProbe(self.health, self.metrics, self.retry)
        self.tasks = TaskSet(s.input_topic, self.per_partition)
        self.reports = ModelReports()  # GET /model, read by the HTTP thread only
        self.http: HttpEndpoints | None = None
        self.stream: Stream | None = None  # the poll loop's consumer and producer, once start-up opened it
        self.loop: Loop | None = None  # the poll loop, once the stream is attached
        self.label_gate = LabelGate(  # labels ahead of points
            self.tasks, s.label_topic, s.input_topic, s.fetch_max_wait_ms, s.max_early_labels, s.batch_size
        )
        self._stopping = False
        self._doing: str | None = "connecting to the brokers"  # outside the loop (None: the loop says, see undone)
        self.wire(Opened(Owner(s.group_id, s.input_topic)))  # nothing opened yet; start-up wires again

    def wire(self, opened: Opened) -> None:
        """Everything that depends on what start-up opened, each built whole: the task factory, the restorer, the
        checkpointer and the rebalance callbacks, over the store (if any); the group's model made anew. Before
        start-up, with nothing opened (the group's model is then a placeholder, as /model reports it)."""
        s, self.store, self.mix_feed = self.settings, opened.store, opened.mix_feed
        self.factory = TaskFactory(
            s, opened.owner, store=opened.store, changelog=opened.changelog, board=opened.board, limits=opened.limits
        )
        self.restorer = Restorer(s, self.store, self.retry, initial=self.factory.initial)
        self.checkpointer = Checkpointer(
            s, self.store, self.metrics, self.health, self.retry, opened.state_topics, opened.limits
        )
        self.delivery.limits = opened.limits  # each output measured before it is sent
        self.assignments = Assignments(
            s,
            self.tasks,
            self.factory.new_task,
            self.restorer,
            self.checkpointer,
            self.store,
            self.health,
            self.metrics,
            self.lag,
            self.retry,
        )
        if not self.per_partition:
            self.tasks.add(self.factory.new_task(None))

    @property
    def learner(self):
        """The group's model (group scope)."""
        if self.tasks.group is None:
            raise AttributeError("learner: each partition has a model of its own (--model-scope partition)")
        return self.tasks.group.learner

    def model_report(self, offset: int = 0, limit: int = REPORT_PAGE) -> dict:
        """GET /model: a page of the champion's and the challengers' weights and their numbers, per model this instance
        serves; at most one copy of a model's weights per version (:class:`~perceptron_stream.pipeline.models.ModelReports`)."""
        return self.reports.report(self.tasks.all(), self.settings.model_scope, self.settings.learning, offset, limit)

    # life cycle ----------------------------------------------------------
    def stop(self, *_args) -> None:
        """Ask the loop to finish the batch in hand, flush, checkpoint, commit and return."""
        if not self._stopping:
            log.info("stopping: finishing the batch in hand")
        self._stopping = True

    def _stop_signalled(self, name: str) -> None:
        if not self._stopping:
            log.info(
                "stopping: finishing the batch in hand (%s; the process exits within %g s)",
                name,
                self.settings.stop_timeout_seconds,
            )
        self._stopping = True

    def undone(self) -> str:
        """What the loop is doing and what it would leave undone if the process ended now (the stop deadline's
        message). Read on another thread while the loop runs: plain reads of counters and flags."""
        return left_undone(
            self._doing or (self.loop.doing if self.loop is not None else ""),
            sum(task.unsaved for task in self.tasks.all()),
            self.assignments.batch_open,
            stored=self.store is not None,
            to_commit=self.checkpointer.pending_commit(),
            started=self.stream is not None,
        )

    def run(self, install_signal_handlers: bool = True) -> int:
        s = self.settings
        if install_signal_handlers:
            StopDeadline(s.stop_timeout_seconds, self._stop_signalled, self.undone).install()
        with ExitStack() as resources:  # whatever opened is closed, in reverse order, however the run ends
            self.http = HttpEndpoints(
                self.metrics, self.health, s.metrics_host, s.metrics_port, model_report=self.model_report
            ).start()
            resources.callback(self.http.stop)
            log.info("metrics on http://%s:%d/metrics", s.metrics_host, self.http.port)
            self.health.outage.hush()  # the clients' own log, until the brokers first answer: one line per outage
            resources.callback(self.health.outage.restore)
            if not self._start(resources):  # stopped meanwhile
                return 0
            assert self.loop is not None  # attached by _start
            return self.loop.run()

    def _start(self, resources: ExitStack) -> bool:
        """Start-up, the wiring on what it opened, the group's model restored, then the stream; False when stopped."""
        startup = Startup(self.settings, self.retry, self.metrics, lambda: self._stopping, resources)
        opened = startup.open()
        if opened is None:
            return False
        self.wire(opened)
        resources.callback(self.checkpointer.close)  # last: after the final checkpoint
        resources.callback(self.factory.close)  # the pending tables' cache directory, once their joiners closed
        resources.callback(self._close_joiners)
        if not self.per_partition:  # the group's model, before joining: fail fast on a bad checkpoint or lost state
            self.restorer.start_group_model(self.tasks.group)
            self.metrics.set_model(self.learner.weight_norm, self.learner.radius)
            self.health.restored = True
        if self._stopping:
            return False
        self.stream = startup.open_stream(
            self.assignments.on_assigned, self.assignments.on_revoked, self.assignments.on_lost
        )
        if self.stream is None:
            return False
        self.attach(self.stream)
        resources.callback(self._close_clients)
        resources.callback(self._final_checkpoint)  # first at exit: before the clients close
        self.health.broker_ok = True
        # Start-up leaves ~100k long-lived objects (river, pydantic, the clients);
        # every full collection walked them all, about 5 µs an event at full
        # speed. Frozen, the collector only looks at what the loop allocates.
        gc.collect()
        gc.freeze()
        return True

    def attach(self, stream: Stream) -> Loop:
        """The stream start-up opened (or a test's stand-in) given to the parts that use it, and the loop over it."""
        self.stream = self.assignments.stream = stream  # the stream calls the callbacks back: it opens after them
        self.loop = Loop(
            stream,
            settings=self.settings,
            tasks=self.tasks,
            assignments=self.assignments,
            checkpointer=self.checkpointer,
            delivery=self.delivery,
            label_gate=self.label_gate,
            mix_feed=self.mix_feed,
            lag=self.lag,
            retry=self.retry,
            health=self.health,
            metrics=self.metrics,
            stopping=lambda: self._stopping,
        )
        self._doing = None  # the loop says what it is doing
        return self.loop

    def _final_checkpoint(self) -> None:
        if not self.assignments.batch_open:
            self._doing = "writing the final checkpoint and committing"
        self.checkpointer.final(self.tasks.all(), self.stream, batch_open=self.assignments.batch_open)

    def _close_clients(self) -> None:
        self._doing = "closing the clients"
        if self.stream is not None:
            self.stream.close()

    def _close_joiners(self) -> None:
        for task in self.tasks.all():
            if task.joiner is not None:
                task.joiner.close()
