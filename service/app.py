"""The service: one :class:`Application` that runs the poll loop.

Per batch: poll → decode each record (:mod:`service.schema`) → predict, then
learn (the learner's fused ``step``) → send predictions and dead letters →
wait for the broker's acknowledgement → maybe checkpoint → commit offsets.

Guarantees, and the order above that gives them:

- at-least-once outputs: an offset is committed only after every output of
  the events before it was acknowledged;
- each event learned exactly once across crashes: a checkpoint holds the
  model and the positions it reflects and is written only after their outputs
  were acknowledged; on assignment the service restores it and seeks there,
  so events after it are learned again from the same state and their outputs
  repeat identically (``source`` tells the copies apart).
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable

import orjson
from kafka.errors import KafkaError

from service import __version__
from service.config import ServeSettings
from service.kafka import CompactedTopic, DeliveryError, KafkaIO, TopicSpec, ensure_topics
from service.learning import learner_from_state, make_learner
from service.metrics import Health, HttpEndpoints, ServiceMetrics
from service.schema import Decoder, Rejection, dead_letter
from service.state.checkpoint import Checkpoint, CheckpointError
from service.state.kafka_store import KafkaStore
from service.state.local import LocalStore

log = logging.getLogger("perceptron_stream")

LAG_EVERY_S = 5.0
RETRY_MAX_S = 5.0


class StartupError(RuntimeError):
    """The service cannot start as configured; the message says why."""


class Application:
    """The perceptron service. ``run()`` blocks until SIGTERM/SIGINT or :meth:`stop`."""

    def __init__(self, settings: ServeSettings):
        self.settings = s = settings
        self.learner = make_learner(s.variant, s.margin, s.standardize)
        self.decoder = Decoder(s.max_message_bytes, s.max_features)
        self.metrics = ServiceMetrics(window=s.mistake_rate_window, version=__version__, variant=s.variant)
        self.health = Health(s.healthz_timeout_seconds)
        self.http: HttpEndpoints | None = None
        self.io: KafkaIO | None = None
        self.store = None
        self.positions: dict[tuple[str, int], int] = {}
        self.checkpoint_seq = 0
        self._events_since_checkpoint = 0
        self._last_checkpoint_at = time.monotonic()
        self._uncommitted = False
        self._stopping = False
        self._next_lag_at = 0.0

    # life cycle ----------------------------------------------------------
    def stop(self, *_args) -> None:
        """Ask the loop to finish the batch in hand, flush, checkpoint, commit and return."""
        if not self._stopping:
            log.info("stopping: finishing the batch in hand")
        self._stopping = True

    def run(self, install_signal_handlers: bool = True) -> int:
        s = self.settings
        if install_signal_handlers:
            signal.signal(signal.SIGTERM, self.stop)
            signal.signal(signal.SIGINT, self.stop)
        self.http = HttpEndpoints(self.metrics, self.health, s.metrics_host, s.metrics_port).start()
        log.info("metrics on http://%s:%d/metrics", s.metrics_host, self.http.port)
        try:
            self._open()
            if self._stopping:
                return 0
            return self._loop()
        finally:
            self._close()

    def _open(self) -> None:
        s = self.settings
        topics = [TopicSpec(name, s.topic_partitions, s.topic_replication_factor) for name in (s.input_topic, s.output_topic, s.dlq_topic)]
        if s.state_store == "kafka":
            topics.append(TopicSpec(s.checkpoint_topic, 1, s.topic_replication_factor, {"cleanup.policy": "compact"}))
        self._until_it_works(lambda: ensure_topics(s, topics, s.create_topics), "reach the brokers and check the topics")
        if self._stopping:
            return
        if s.state_store == "local":
            self.store = LocalStore(s.state_dir)
        elif s.state_store == "kafka":
            self.store = KafkaStore(CompactedTopic(s, s.checkpoint_topic), s.group_id)
        if self.store is not None:
            self.store.lock()
            self._restore()  # fail fast on a bad checkpoint, before joining the group
        self.io = self._until_it_works(
            lambda: KafkaIO(s, group_id=s.group_id, input_topic=s.input_topic, auto_offset_reset=s.auto_offset_reset,
                            on_assigned=self._on_assigned, on_revoked=self._on_revoked, max_poll_records=s.batch_size),
            "connect the consumer and producer",
        )
        self.health.broker_ok = True

    def _until_it_works(self, action: Callable, what: str):
        """Retry ``action`` with backoff until it works or the service is stopped: no crash loop."""
        delay = 0.2
        while True:
            try:
                return action()
            except KafkaError as exc:
                self.health.broker_ok = False
                if self._stopping:
                    return None
                log.warning("could not %s: %s; retrying in %.1f s", what, exc, delay)
                deadline = time.monotonic() + delay
                while time.monotonic() < deadline and not self._stopping:
                    self.health.beat()
                    time.sleep(0.05)
                delay = min(delay * 2, RETRY_MAX_S)

    def _close(self) -> None:
        try:
            if self.io is not None:
                try:
                    self._finish_batch(final=True)
                finally:
                    self.io.close()
        finally:
            if self.store is not None:
                self.store.close()
            if self.http is not None:
                self.http.stop()

    # the loop ------------------------------------------------------------
    def _loop(self) -> int:
        s = self.settings
        while not self._stopping:
            self.health.beat()
            try:
                records = self.io.poll(s.poll_timeout_ms, s.batch_size)
            except KafkaError as exc:
                log.warning("poll failed: %s", exc)
                self.health.broker_ok = False
                time.sleep(0.5)
                continue
            if records:
                self._process(records)
            self._finish_batch(final=False)
            self._refresh_lag()
        return 0

    def _process(self, records) -> None:
        started = time.perf_counter()
        s, io, step, decode = self.settings, self.io, self.learner.step, self.decoder.decode
        learner, positions, dumps = self.learner, self.positions, orjson.dumps
        output_topic, dlq_topic = s.output_topic, s.dlq_topic
        labeled = unlabeled = 0
        flags: list[bool] = []
        updates_before = learner.updates
        for r in records:
            event = decode(r.value)
            if type(event) is Rejection:
                io.send(dlq_topic, r.key, dumps(dead_letter(event, r.value, r.topic, r.partition, r.offset)))
                self.metrics.rejected.labels(event.reason).inc()
            else:
                y_pred, score, mistake = step(event.x, event.y)
                if event.y is None:
                    unlabeled += 1
                else:
                    labeled += 1
                    flags.append(mistake)
                io.send(output_topic, r.key, dumps({
                    "id": event.id,
                    "source": {"topic": r.topic, "partition": r.partition, "offset": r.offset},
                    "y_pred": y_pred, "score": score, "y": event.y, "mistake": mistake,
                    "model": {"version": learner.updates, "seen": learner.seen, "mistakes": learner.mistakes},
                }))
            positions[(r.topic, r.partition)] = r.offset + 1
        self._flush()
        self._uncommitted = True
        self._events_since_checkpoint += len(records)
        self.metrics.observe_batch(labeled=labeled, unlabeled=unlabeled, mistake_flags=flags,
                                   updates=learner.updates - updates_before, latency_s=time.perf_counter() - started)
        self.metrics.set_model(learner.weight_norm, learner.radius)

    def _flush(self) -> None:
        """Wait for every acknowledgement, however long the brokers are away (or until stopped)."""
        while True:
            try:
                self.io.flush(timeout_s=10.0)
                self.health.broker_ok = True
                return
            except DeliveryError as exc:
                self.health.broker_ok = False
                self.health.beat()  # the loop is alive, waiting for the brokers
                if self._stopping:
                    raise
                log.warning("%s; waiting for the brokers", exc)

    def _finish_batch(self, final: bool) -> None:
        """Checkpoint when due (or final), then commit what was acknowledged."""
        s = self.settings
        due = self._events_since_checkpoint >= s.checkpoint_interval_events or (
            self._events_since_checkpoint and time.monotonic() - self._last_checkpoint_at >= s.checkpoint_interval_seconds)
        if final and self._events_since_checkpoint:
            due = True
        if due:
            self._checkpoint()
        if self._uncommitted:
            try:
                self.io.commit(dict(self.positions))
                self._uncommitted = False
            except KafkaError as exc:
                # e.g. RebalanceInProgressError: keep polling; the next batch
                # commits, or the redelivered events are processed again
                log.warning("commit failed (%s); will commit with the next batch", exc.__class__.__name__)

    def _checkpoint(self) -> None:
        if self.store is None:
            self._events_since_checkpoint = 0
            return
        self.checkpoint_seq += 1
        cp = Checkpoint(seq=self.checkpoint_seq, positions=dict(self.positions), model=self.learner.to_state(),
                        dimension=self.decoder.dimension, meta=self._model_meta(), created=time.time())
        self.store.save(cp)
        self._events_since_checkpoint = 0
        self._last_checkpoint_at = time.monotonic()
        self.metrics.last_checkpoint.set(cp.created)
        log.debug("checkpoint %d at %s", cp.seq, cp.positions)

    def _model_meta(self) -> dict:
        s = self.settings
        return {"variant": s.variant, "margin": s.margin, "standardize": s.standardize, "input_topic": s.input_topic}

    # state ---------------------------------------------------------------
    def _restore(self) -> None:
        """Load the newest good checkpoint into the learner and decoder."""
        cp = self.store.load()
        if cp is None:
            log.info("no checkpoint yet: starting from zero weights")
            self.health.restored = True
            return
        expected = self._model_meta()
        different = {k: (cp.meta.get(k), v) for k, v in expected.items() if cp.meta.get(k) != v}
        if different:
            what = ", ".join(f"{k} was {old!r}, now {new!r}" for k, (old, new) in different.items())
            raise StartupError(f"the checkpoint was taken with other model settings ({what}); "
                               "use the same settings, or another state store to start a new model")
        try:
            self.learner = learner_from_state(cp.model)
        except ValueError as exc:
            raise CheckpointError(f"checkpoint {cp.seq} holds a model this version cannot read: {exc}") from None
        self.decoder.dimension = cp.dimension
        self.checkpoint_seq = cp.seq
        self.positions = dict(cp.positions)
        self.health.restored = True
        self.metrics.set_model(self.learner.weight_norm, self.learner.radius)
        log.info("restored checkpoint %d: %d events seen, %d updates, positions %s",
                 cp.seq, self.learner.seen, self.learner.updates, cp.positions)

    def _on_assigned(self, partitions: list[tuple[str, int]]) -> None:
        # The learner in memory is the newest state (revocation checkpoints
        # first); seek every partition it has learned from to where it stands,
        # whatever the committed offsets say.
        for tp in partitions:
            if tp in self.positions:
                self.io.seek(tp[0], tp[1], self.positions[tp])
        log.info("assigned %s", ", ".join(f"{t}[{p}]" for t, p in partitions) or "nothing")
        self.health.assigned = bool(partitions)
        self._next_lag_at = 0.0

    def _on_revoked(self, partitions: list[tuple[str, int]]) -> None:
        log.info("revoked %s", ", ".join(f"{t}[{p}]" for t, p in partitions) or "nothing")
        if self.io is not None and (self._events_since_checkpoint or self._uncommitted):
            self._finish_batch(final=True)
        self.metrics.forget_partitions(partitions)
        self.health.assigned = False

    def _refresh_lag(self) -> None:
        now = time.monotonic()
        if now < self._next_lag_at:
            return
        self._next_lag_at = now + LAG_EVERY_S
        try:
            self.metrics.set_lag(self.io.lag())
            self.health.broker_ok = True
        except KafkaError as exc:
            self.health.broker_ok = False
            log.warning("could not read the end offsets for the lag: %s", exc.__class__.__name__)
