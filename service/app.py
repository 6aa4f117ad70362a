"""The service: wiring, and the poll loop.

Per turn: poll (one list of records per partition) → settle assignments
(:mod:`service.runtime.partitions`: restore what was assigned) → each
partition's records to its task (:mod:`service.pipeline.task`: decode →
predict, then learn → prediction or dead letter sent) → wait for the
brokers' acknowledgements → checkpoint when due, then commit
(:mod:`service.runtime.checkpointer`) → lag.

Guarantees, and the order above that gives them:

- at-least-once outputs: an offset is committed only after every output of
  the events before it was acknowledged;
- each event learned exactly once across crashes: a checkpoint holds a
  task's model and the positions it reflects and is written only after their
  outputs were acknowledged; on start (group scope) or assignment (partition
  scope) the task is restored and its partitions sought there, so events
  after it are learned again from the same state (``source`` tells copies apart);
- the offsets committed to the group are checkpoints' positions, never more;
- group scope: one instance per model (:class:`~service.runtime.partitions.OneInstance`);
  partition scope: any number, each partition's state moving with it.
"""

from __future__ import annotations

import gc
import logging
import tempfile
import time
from pathlib import Path

import orjson

from service import __version__
from service.config import ServeSettings
from service.http import HttpEndpoints
from service.kafka import (
    CompactedTopic,
    DeliveryError,
    KafkaFatal,
    PartitionedLog,
    Refused,
    TopicSpec,
    TopicTail,
    cluster_identity,
    ensure_topics,
    open_stream,
    partition_counts,
    require_codecs,
)
from service.learning import make_learner
from service.metrics import ServiceMetrics
from service.pipeline.labels import Joiner, LabelGate
from service.learning import model_file
from service.pipeline.mixer import MixBoard, Mixer
from service.pipeline.models import REPORT_PAGE, DriftWatch, Frozen, ModelReports, ModelSet
from service.pipeline.task import Tally, Task, TaskSet, partition_task
from service.runtime.checkpointer import Checkpointer
from service.runtime.health import Health, LagProbe
from service.runtime.partitions import Assignments
from service.runtime.restore import Restorer
from service.runtime.retry import Retry, StartupError, fatal
from service.runtime.shutdown import StopDeadline
from service.state.checkpoint import GROUP_TASK, Owner
from service.state.changelog import Changelog
from service.state.kafka_store import KafkaStore
from service.state.local import LocalStore
from service.state.pending import PendingTable
from service.wire.inputs import Decoder
from service.wire.messages import Rejection
from service.wire.outputs import dead_letter_value

log = logging.getLogger("perceptron_stream")

__all__ = ["Application", "StartupError", "CHECKPOINT_TOPIC_CONFIG"]

#: Settings of the checkpoint and mix topics when the service creates them:
#: compacted, with segments rolled hourly (compaction never touches the active
#: segment, and a start reads every record left), and room for a large model
#: (the checkpoint producer sends up to 16 MiB).
CHECKPOINT_TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.ms": str(3600 * 1000), "max.message.bytes": str(16 * 1024 * 1024)}
#: How often the loop reads the mix topic's new records.
MIX_READ_EVERY_S = 0.25
#: How long one flush waits before the loop logs an outage and waits again.
FLUSH_WAIT_S = 10.0
#: The pending changelog: compacted, and no record younger than a day compacted away, so a change a crashed
#: run wrote after its last checkpoint is still beside the valid one it replaced when the next run undoes it.
CHANGELOG_TOPIC_CONFIG = {**CHECKPOINT_TOPIC_CONFIG, "min.compaction.lag.ms": str(24 * 3600 * 1000)}


def model_meta(s: ServeSettings) -> dict:
    """The settings a model depends on: a checkpoint (or a mix record) taken with others is not this model's."""
    return {"variant": s.variant, "margin": s.margin, "standardize": s.standardize, "input_topic": s.input_topic,
            "max_model_features": s.max_model_features, "hash_features": s.hash_features}


class Application:
    """The perceptron service. ``run()`` blocks until SIGTERM/SIGINT or :meth:`stop`."""

    def __init__(self, settings: ServeSettings):
        self.settings = s = settings
        self.per_partition = s.model_scope == "partition"
        self.challenger_specs = ModelSet.parse(s.challengers)
        self.metrics = ServiceMetrics(window=s.mistake_rate_window, version=__version__, variant=s.variant, scope=s.model_scope,
                                      challengers=[name for name, _, _ in self.challenger_specs])
        self.health = Health(s.healthz_timeout_seconds)
        self.retry = Retry(self.health, lambda: self._stopping)
        self.meta = model_meta(s)
        self.owner = Owner(s.group_id, s.input_topic)  # the cluster's and topic's ids are added at start-up
        self.tasks = TaskSet(s.input_topic, self.per_partition)
        self.http: HttpEndpoints | None = None
        self.reports = ModelReports()  # GET /model, read by the HTTP thread only
        self.stream = None  # the poll loop's consumer and producer (service.kafka.open_stream)
        self.store = None
        self.board: MixBoard | None = None
        self.mix_tail: TopicTail | None = None
        self.changelog: PartitionedLog | None = None  # the Kafka store's pending changelog (--label-topic)
        self._cache_dir: tempfile.TemporaryDirectory | None = None  # pending tables rebuilt from the changelog
        self._next_mix_read = 0.0
        self.label_gate = LabelGate(self.tasks, s.label_topic, s.input_topic, s.fetch_max_wait_ms)  # labels ahead of points
        if not self.per_partition:
            self.tasks.add(self._new_task(None))  # made again at start-up, with the cluster's ids
        self.lag = LagProbe(self.health, self.metrics, self.retry)
        self.checkpointer = Checkpointer(s, None, self.metrics, self.health, self.retry)
        self.assignments = Assignments(s, self.tasks, self._new_task, None, self.checkpointer, None, self.health,
                                       self.metrics, self.lag, self.retry)
        self._stopping = False
        self._doing = "connecting to the brokers"  # what the loop is doing, for a stop that does not finish in time

    @property
    def learner(self):
        """The group's model (group scope)."""
        return self.tasks.group.learner

    @property
    def decoder(self) -> Decoder:
        return self.tasks.group.decoder

    def _new_task(self, partition: int | None) -> Task:
        s = self.settings
        name = GROUP_TASK if partition is None else partition_task(partition)
        owner = Owner(self.owner.group_id, self.owner.input_topic, name, self.owner.cluster_id, self.owner.topic_id)
        learner = self._make_learner(s.variant, s.margin)
        if s.learning == "off":
            learner = Frozen(learner)
        decoder = Decoder(s.max_message_bytes, s.max_features, max_feature_value=s.max_feature_value)
        mixer = None
        if partition is not None and s.mix_every and self.board is not None:
            mixer = Mixer(s.mix_every, self.board, s.mix_topic, self._signing_key())
        joiner = None
        if s.label_topic is not None:
            joiner = Joiner(lambda p: self._pending_table(name, p), ttl_seconds=s.label_ttl_seconds, max_pending=s.max_pending,
                            outcome_topic=s.outcome_topic, dlq_topic=s.dlq_topic, max_message_bytes=s.max_message_bytes,
                            changelog=None if self.changelog is None else Changelog(self.changelog, s.group_id),
                            label_topic=s.label_topic, grace_seconds=s.label_grace_seconds, max_early=s.max_early_labels)
        models = None
        if self.challenger_specs:
            models = ModelSet(self.challenger_specs, self._make_learner)
            if s.learning == "off":
                models.challengers = {n: Frozen(c) for n, c in models.challengers.items()}
        return Task(name, owner, learner, decoder, self.meta, partition=partition, mixer=mixer, joiner=joiner,
                    models=models, drift=DriftWatch(), frozen=s.learning == "off",
                    outputs={"output_topic": s.output_topic, "dlq_topic": s.dlq_topic, "max_message_bytes": s.max_message_bytes,
                             "label_topic": s.label_topic})

    def _make_learner(self, variant: str, margin: float):
        s = self.settings
        return make_learner(variant, margin, s.standardize, s.max_model_features or None, s.hash_features)

    def _initial(self, task: Task) -> None:
        """A new model (no checkpoint) starts from --initial-model; a restored one ignores it, saying so."""
        s = self.settings
        if s.initial_model is None:
            return
        if task.seq and not task.started_over:
            log.info("--initial-model %s ignored: %s was restored from its checkpoint", s.initial_model, task.name)
            return
        doc = orjson.loads(s.initial_model.read_bytes())  # checked against the ModelFile contract with the settings
        try:
            learner = model_file.to_learner(doc, variant=s.variant, margin=s.margin, standardize=s.standardize,
                                            hash_features=s.hash_features, max_features=s.max_model_features or None,
                                            max_event_features=s.max_features)
        except ValueError as exc:
            raise StartupError(f"invalid setting initial_model (--initial-model): {exc}") from None
        task.learner = Frozen(learner) if s.learning == "off" else learner
        log.info("%s starts from --initial-model %s (%s): %d features", task.name, s.initial_model, doc["source"],
                 len(doc["features"]))

    def model_report(self, offset: int = 0, limit: int = REPORT_PAGE) -> dict:
        """GET /model: a page of the champion's and the challengers' weights and their numbers, per model this instance
        serves; at most one copy of a model's weights per version (:class:`~service.pipeline.models.ModelReports`)."""
        return self.reports.report(self.tasks.all(), self.settings.model_scope, self.settings.learning, offset, limit)

    def _pending_table(self, task: str, partition: int) -> PendingTable:
        """A partition's pending table: beside the task's checkpoints (local store), else in a cache directory
        (the Kafka store rebuilds it from its changelog; without a store it lives as long as the process)."""
        s = self.settings
        if isinstance(self.store, LocalStore):
            directory = self.store.task_dir(task)
        else:
            if self._cache_dir is None:
                self._cache_dir = tempfile.TemporaryDirectory(prefix="perceptron-pending-")
            directory = Path(self._cache_dir.name) / task
        directory.mkdir(parents=True, exist_ok=True)
        return PendingTable(directory / f"pending-{partition}.sqlite", ttl_seconds=s.label_ttl_seconds, max_pending=s.max_pending,
                            track_changes=self.changelog is not None)

    def _signing_key(self) -> bytes | None:
        key = self.settings.checkpoint_key
        return key.get_secret_value().encode() if key else None

    # life cycle ----------------------------------------------------------
    def stop(self, *_args) -> None:
        """Ask the loop to finish the batch in hand, flush, checkpoint, commit and return."""
        if not self._stopping:
            log.info("stopping: finishing the batch in hand")
        self._stopping = True

    def _stop_signalled(self, name: str) -> None:
        if not self._stopping:
            log.info("stopping: finishing the batch in hand (%s; the process exits within %g s)",
                     name, self.settings.stop_timeout_seconds)
        self._stopping = True

    def undone(self) -> str:
        """What the loop is doing and what it would leave undone if the process ended now (the stop deadline's message).

        Read on another thread while the loop runs: plain reads of counters and flags.
        """
        tasks = self.tasks.all()
        unsaved = sum(task.unsaved for task in tasks)
        in_hand = self.assignments.batch_open  # its outputs not all acknowledged
        if self.store is not None and (unsaved or in_hand):
            events = f"{unsaved} event(s) processed since the last checkpoint" if unsaved else "the batch in hand"
            among = " (a batch whose outputs were not all acknowledged among them)" if unsaved and in_hand else ""
            left = (f"{events}{among} {'are' if unsaved else 'is'} not checkpointed: the next start learns and publishes "
                    f"{'them' if unsaved else 'it'} again from the last checkpoint")
        elif self.store is None and in_hand:
            left = "the batch in hand is not committed: the next start reads it again from the last committed offsets"
        elif self.checkpointer.pending_commit():
            left = ("the last positions were not committed to the consumer group (the next start "
                    + ("seeks to the last checkpoint anyway)" if self.store is not None else "reads again from the last committed offsets)"))
        elif self.stream is None:
            left = "nothing was read yet"
        else:
            left = ("nothing to checkpoint or commit; the clients were not closed: the group notices this member is "
                    "gone at its session timeout")
        return f"stuck {self._doing}; left undone: {left}"

    def run(self, install_signal_handlers: bool = True) -> int:
        s = self.settings
        if install_signal_handlers:
            StopDeadline(s.stop_timeout_seconds, self._stop_signalled, self.undone).install()
        self.http = HttpEndpoints(self.metrics, self.health, s.metrics_host, s.metrics_port, model_report=self.model_report).start()
        log.info("metrics on http://%s:%d/metrics", s.metrics_host, self.http.port)
        try:
            self._open()
            if self._stopping:
                return 0
            return self._loop()
        finally:
            self._close()

    def _open(self) -> None:
        s, until = self.settings, self.retry.until_it_works
        try:
            require_codecs()
        except KafkaFatal as exc:
            raise fatal(exc, "read compressed records") from None
        topics = [TopicSpec(name, s.topic_partitions, s.topic_replication_factor) for name in (s.input_topic, s.output_topic, s.dlq_topic)]
        if s.state_store == "kafka":
            topics.append(TopicSpec(s.checkpoint_topic, 1, s.topic_replication_factor, CHECKPOINT_TOPIC_CONFIG))
        if self.per_partition and s.mix_every:
            topics.append(TopicSpec(s.mix_topic, 1, s.topic_replication_factor, CHECKPOINT_TOPIC_CONFIG))
        until(lambda: ensure_topics(s, topics, s.create_topics), "reach the brokers and check the topics")
        if self._stopping:
            return
        if s.label_topic is not None and not self._open_labels():
            return
        if s.state_store != "none":
            ids = until(lambda: cluster_identity(s, s.input_topic), "read the cluster's and the input topic's ids")
            if ids is None:
                return
            self.owner = Owner(s.group_id, s.input_topic, GROUP_TASK, *ids)
        if s.state_store == "local":
            self.store = LocalStore(s.state_dir, s.group_id)
        elif s.state_store == "kafka":
            self.store = until(lambda: KafkaStore(CompactedTopic(s, s.checkpoint_topic), s.group_id), "connect to the checkpoint topic")
            if self.store is None:
                return
        if self.store is not None:
            self.store.key = self._signing_key()
        restorer = Restorer(s, self.store, self.retry, initial=self._initial)
        self.checkpointer.store = self.assignments.store = self.store
        self.assignments.restorer = restorer
        if self.per_partition:
            self._open_mixing()
        else:
            task = self._new_task(None)  # now with the cluster's ids in its owner
            self.tasks.add(task)
            if self.store is not None:
                self.store.lock(GROUP_TASK)
                restorer.restore(task, legacy=True)  # fail fast on a bad checkpoint, or on lost state, before joining
            else:
                self._initial(task)
            self.metrics.set_model(task.learner.weight_norm, task.learner.radius)
            self.health.restored = True
        if self._stopping:
            return
        self.stream = until(
            lambda: open_stream(s, s.kafka_client, group_id=s.group_id,
                                topics=[s.input_topic] + ([s.label_topic] if s.label_topic else []),
                                auto_offset_reset=s.auto_offset_reset, on_assigned=self.assignments.on_assigned,
                                on_revoked=self.assignments.on_revoked, max_poll_records=s.batch_size,
                                fetch_max_wait_ms=s.fetch_max_wait_ms, group_protocol=s.group_protocol),
            "connect the consumer and producer",
        )
        self.assignments.stream = self.stream
        self.health.broker_ok = True
        # Start-up leaves ~100k long-lived objects (river, pydantic, the clients);
        # every full collection walked them all, about 5 µs an event at full
        # speed. Frozen, the collector only looks at what the loop allocates.
        gc.collect()
        gc.freeze()

    def _open_labels(self) -> bool:
        """Delayed labels: the label topic partitioned like the input (a label and its point share a partition number,
        so one task holds both), the outcome topic, and with the Kafka store the pending changelog."""
        s, until = self.settings, self.retry.until_it_works
        counts = until(lambda: partition_counts(s, [s.input_topic, s.label_topic]), "count the input and label topics' partitions")
        if counts is None:
            return False
        n = counts[s.input_topic]
        topics = [TopicSpec(s.label_topic, n, s.topic_replication_factor), TopicSpec(s.outcome_topic, s.topic_partitions, s.topic_replication_factor)]
        if s.state_store == "kafka":
            topics.append(TopicSpec(s.pending_topic, n, s.topic_replication_factor, CHANGELOG_TOPIC_CONFIG))
        if until(lambda: ensure_topics(s, topics, s.create_topics), "check the label, outcome and changelog topics") is None and self._stopping:
            return False
        counts = until(lambda: partition_counts(s, [s.label_topic] + ([s.pending_topic] if s.state_store == "kafka" else [])),
                       "count the label topic's partitions")
        if counts is None:
            return False
        for topic, count in counts.items():
            if count != n:
                raise StartupError(f"topic {topic} has {count} partition(s) and input topic {s.input_topic} has {n}: a label "
                                   f"and its point must land in the same partition number (both keyed alike), so {topic} "
                                   f"needs {n} partitions too (recreate it, or add partitions)")
        if s.state_store == "kafka":
            self.changelog = until(lambda: PartitionedLog(s, s.pending_topic), "open the pending changelog")
        return True

    def _open_mixing(self) -> None:
        """Partition scope with --mix-every: the board of every partition's latest state, fed from the mix topic."""
        s = self.settings
        if not s.mix_every:
            return
        counts = self.retry.until_it_works(lambda: partition_counts(s, [s.input_topic]), f"count the partitions of {s.input_topic}")
        if counts is None:
            return
        self.board = MixBoard(self.owner, self.meta, counts[s.input_topic], self._signing_key(),
                              on_reject=lambda reason: self.metrics.mix_rejected.labels(reason).inc())
        self.mix_tail = self.retry.until_it_works(lambda: TopicTail(s, s.mix_topic), "read the mix topic")

    def _close(self) -> None:
        try:
            if self.stream is not None:
                try:
                    if self.assignments.batch_open:
                        # stopped (or failed) inside a batch: the models and positions in
                        # memory are ahead of the acknowledged outputs; saving them would
                        # lose those outputs, or learn an event twice after a restart
                        log.warning("stopped inside a batch whose outputs were not all acknowledged: no final checkpoint; "
                                    "the next start learns and publishes it again from the last checkpoint")
                    else:
                        self._doing = "writing the final checkpoint and committing"
                        self.checkpointer.maybe(self.tasks.all(), self.stream, final=True)
                finally:
                    self._doing = "closing the clients"
                    self.stream.close()
        finally:
            if self.mix_tail is not None:
                self.mix_tail.close()
            for task in self.tasks.all():
                if task.joiner is not None:
                    task.joiner.close()
            if self.changelog is not None:
                self.changelog.close()
            if self._cache_dir is not None:
                self._cache_dir.cleanup()
            if self.store is not None:
                self.store.close()
            if self.http is not None:
                self.http.stop()

    # the loop ------------------------------------------------------------
    def _loop(self) -> int:
        s, stream = self.settings, self.stream
        polling = f"in the {s.kafka_client} client's poll"
        while not self._stopping:
            self.health.beat()
            self._doing = polling
            ok, batches = self.retry.once(lambda: stream.poll(s.poll_timeout_ms, s.batch_size),
                                          f"read {s.input_topic} in group {s.group_id}", probe=True)
            if not ok:
                time.sleep(0.5)
                continue
            self.assignments.settle()
            self._follow_mixes()
            self.label_gate.clock(lambda: self.retry.once(lambda: stream.lag(ask_broker=False), "read the input's lag"))
            if batches and not self.assignments.may_process():  # other members are still in the group: nothing yet
                self.assignments.put_back([r for records in batches for r in records])
                batches = []
            self._doing = "processing a batch"
            if batches:
                self.lag.records_came()
            if batches or (self.label_gate.due() and self.assignments.may_process()):  # (labels past their grace period
                # go in a batch of no records)
                try:
                    self._process(batches)
                except DeliveryError:  # raised only once stopping: _close leaves the checkpoints as they were
                    return 0
            self._doing = "checkpointing or committing"
            self.checkpointer.maybe(self.tasks.all(), stream)
            self._doing = "reading the lag"
            self.lag.refresh(stream)
        return 0

    def _follow_mixes(self) -> None:
        """The mix topic's new records into the board, a few times a second: a poll of its consumer costs more
        than a turn of the loop on librdkafka, and replicas mix every --mix-every events, not every turn."""
        now = time.monotonic()
        if self.mix_tail is None or now < self._next_mix_read:
            return
        self._next_mix_read = now + MIX_READ_EVERY_S
        ok, records = self.retry.once(self.mix_tail.poll, "read the mix topic")
        for key, value in records or ():
            self.board.offer(key, value)

    def _process(self, batches) -> None:
        started = time.perf_counter()
        tally, send = Tally(), self.stream.send
        self.assignments.batch_open = True
        for records in self.label_gate.admit(batches, tally):
            task = self.tasks.for_partition(records[0].partition)
            if task is None:  # assigned, not restored yet: read again once it is
                self.assignments.put_back(records)
                continue
            task.process(records, send, tally)
        tasks = self.tasks.all()
        self.label_gate.release(send, tally)
        self._flush()
        self.assignments.batch_open = False
        waiting = self.label_gate.acknowledged(tally)  # (points pending, labels early), or None
        self.checkpointer.acknowledged(tasks)
        self.metrics.observe_tally(tally, time.perf_counter() - started)
        for task in tasks:
            self.metrics.set_model(task.learner.weight_norm, task.learner.radius, task.partition)
        if waiting is not None:
            self.metrics.pending.set(waiting[0])
            self.metrics.early.set(waiting[1])

    def _flush(self) -> None:
        """Wait for every acknowledgement, however long the brokers are away (or until stopped)."""
        self._doing = "waiting for the brokers to acknowledge the batch's outputs"
        while True:
            try:
                refused = self.stream.flush(timeout_s=FLUSH_WAIT_S)
                self.health.broker_ok = True
                if refused:
                    self._replace_refused(refused)
                return
            except KafkaFatal as exc:
                raise fatal(exc, "send the outputs") from None
            except DeliveryError as exc:
                self.health.broker_ok = False
                self.health.beat()  # the loop is alive, waiting for the brokers
                if self._stopping:
                    raise
                log.warning("%s; waiting for the brokers", exc)

    def _replace_refused(self, refused: list[Refused]) -> None:
        """An output the brokers refuse for good (larger than the topic allows, say) becomes a dead letter without
        key or raw value: waiting for it would stop the service for one event."""
        s = self.settings
        for r in refused:
            if r.topic == s.mix_topic:
                log.error("the brokers refused a mix record (%d bytes) for good: %s; the replica mixed without publishing it",
                          len(r.value), r.error.__class__.__name__)
                self.metrics.mix_rejected.labels("refused").inc()
                continue
            source = orjson.loads(r.value)["source"]  # every output carries its input's position
            what = "dead letter" if r.topic == s.dlq_topic else "prediction"
            error = (f"the brokers refused this event's {what} ({len(r.value)} bytes, key {len(r.key or b'')} bytes) for good: "
                     f"{r.error.__class__.__name__}; the input is at source")
            log.error("%s at %s", error, source)
            self.stream.send(s.dlq_topic, None, dead_letter_value(Rejection("output_refused", error), None, source["topic"],
                                                                  source["partition"], source["offset"], max_bytes=s.max_message_bytes))
            self.metrics.rejected.labels("output_refused").inc()
        again = self.stream.flush(timeout_s=FLUSH_WAIT_S)
        if again:
            raise StartupError(f"the brokers refuse even a short dead letter on {s.dlq_topic}: {again[0].error!r}")
