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
  repeat identically (``source`` tells the copies apart);
- with a state store, the offsets committed to the group are the positions of
  the last checkpoint, never more: a partition the checkpoint does not know
  (no checkpoint yet, a new partition) then restarts where the model stands
  (``auto_offset_reset`` for a new model), not after events the model lost in
  a crash;
- one instance per model: a second one on the same state directory fails at
  the lock; with either store, a newcomer that finds other live members in
  its consumer group stops before it processes anything.
"""

from __future__ import annotations

import gc
import logging
import signal
import time
from collections.abc import Callable

import orjson
from kafka.errors import (
    IllegalSaslStateError,
    KafkaError,
    KafkaTimeoutError,
    SaslAuthenticationFailedError,
    UnsupportedSaslMechanismError,
)

from service import __version__
from service.config import KafkaSettings, ServeSettings, env_var, flag
from service.http import HttpEndpoints
from service.kafka import (
    AUTHENTICATION_ERRORS,
    BEGINNING,
    END,
    FATAL_ERRORS,
    GROUP_TIMINGS,
    CompactedTopic,
    DeliveryError,
    Refused,
    TopicSpec,
    cluster_identity,
    committed_offsets,
    ensure_topics,
    first_offsets,
    log_ranges,
    open_stream,
)
from service.learning import learner_from_state, make_learner
from service.metrics import Health, ServiceMetrics
from service.schema import Decoder, Event, Rejection, dead_letter
from service.state.checkpoint import GROUP_TASK, Checkpoint, CheckpointError, ForeignStateError, Owner
from service.state.kafka_store import CheckpointTooLargeError, KafkaStore
from service.state.local import LocalStore

log = logging.getLogger("perceptron_stream")

LAG_EVERY_S = 5.0
RETRY_MAX_S = 5.0
#: A crashed member leaves the group when its session times out, and the
#: broker needs a few seconds more to notice (DESIGN.md): how long a newcomer
#: waits for the others to leave before it calls them another live instance.
OTHERS_LEAVE_GRACE_S = 6.0
OTHERS_LEAVE_WAIT_S = GROUP_TIMINGS["session_timeout_ms"] / 1000 + OTHERS_LEAVE_GRACE_S
#: Broker round trips the loop makes on its own (the lag probe, commits) give
#: up after this long, so an outage shows on /readyz within seconds and the
#: loop keeps turning.
PROBE_TIMEOUT_S = 3.0
COMMIT_TIMEOUT_S = 5.0
#: Settings of the checkpoint topic when the service creates it: compacted,
#: with segments rolled hourly (compaction never touches the active segment,
#: and a start reads every record still there), and room for a large model
#: (the checkpoint producer sends up to 16 MiB).
CHECKPOINT_TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.ms": str(3600 * 1000), "max.message.bytes": str(16 * 1024 * 1024)}


#: An integer id is written back in the prediction: beyond 64 bits orjson
#: (and most consumers) cannot write it, and the event would stop the service.
ID_MIN, ID_MAX = -(1 << 63), (1 << 64) - 1
#: The longest error sentence a dead letter carries: the decoder may quote a
#: hostile feature name. With its raw head (cut to fit) and key, a dead letter
#: stays within --max-message-bytes (dead_letter_value).
DEAD_LETTER_ERROR_LIMIT = 1000


class StartupError(RuntimeError):
    """The service cannot start, or go on, as configured; the message says why (exit 1)."""


def fatal(exc: Exception, what: str, settings: KafkaSettings | None = None) -> StartupError:
    """The StartupError for a FATAL_ERRORS error met while trying to ``what``: waiting cannot cure it."""
    return StartupError(f"could not {what}: {exc.__class__.__name__}: {exc}; retrying cannot help: {_to_check(exc, settings)}")


def _to_check(exc: Exception, settings: KafkaSettings | None) -> str:
    """The settings a FATAL_ERRORS error points at, in all their spellings."""

    def named(*names: str) -> str:
        return " and ".join(f"{name} ({flag(name)}, {env_var(name)})" for name in names)

    mechanism = f"SASL mechanism {settings.sasl_mechanism}" if settings is not None and settings.sasl_mechanism else "the SASL mechanism"
    if isinstance(exc, (UnsupportedSaslMechanismError, IllegalSaslStateError)):
        return f"the brokers do not accept {mechanism}: check {named('sasl_mechanism')}"
    if isinstance(exc, SaslAuthenticationFailedError):
        return (f"the brokers refused the credentials for {mechanism}: check {named('sasl_username', 'sasl_password')}, "
                f"and {named('sasl_mechanism')}")
    return "check the Kafka settings (security, credentials, ACLs, replication factor)"


def publishable(event: Event | Rejection) -> Event | Rejection:
    """The decoded event, or a rejection when its prediction could not be written."""
    if type(event) is not Rejection and type(event.id) is int and not ID_MIN <= event.id <= ID_MAX:
        return Rejection("invalid_event", f"id must be a string or an integer of at most 64 bits, got an integer of {event.id.bit_length()} bits")
    return event


def dead_letter_value(rejection: Rejection, raw: bytes | None, topic: str, partition: int, offset: int, *,
                      max_bytes: int | None = None, key_bytes: int = 0, key_dropped: bool = False) -> bytes:
    """The dead-letter message the service publishes for a rejected input (JSON bytes).

    With ``max_bytes``, the letter and the ``key_bytes`` of its record's key
    fit in it, as an input must (Decoder.decode): JSON escaping makes a raw
    head of control characters six times longer, and the key adds its own
    length. The raw head is cut first (``raw_truncated``); when even no raw
    leaves room, a keyed letter is returned with no raw, too long (its caller,
    :func:`dead_letter_record`, drops the key), and a letter without key has
    its error sentence cut. From 1 KiB (the setting's least) every letter fits.
    """
    letter = dead_letter(rejection, raw, topic, partition, offset)
    if len(letter["error"]) > DEAD_LETTER_ERROR_LIMIT:
        letter["error"] = letter["error"][: DEAD_LETTER_ERROR_LIMIT - 3] + "..."
    if key_dropped:
        letter["key_dropped"] = True
    value = orjson.dumps(letter)
    if max_bytes is None or key_bytes + len(value) <= max_bytes:
        return value
    room = max_bytes - key_bytes
    head, whole = letter["raw"], not letter["raw_truncated"]
    letter["raw"] = ""
    letter["raw_truncated"] = bool(head)
    value = orjson.dumps(letter)
    if len(value) <= room:
        kept = _longest_head(head, letter["raw_encoding"], room - len(value))
        if whole and len(kept) == len(head):  # it fits only as "raw_truncated": true, one byte shorter than false
            kept = head[: len(head) - (4 if letter["raw_encoding"] == "base64" else 1)]
        letter["raw"] = kept
        return orjson.dumps(letter)
    if key_bytes:
        return value
    error = letter["error"]
    cut = _longest(len(error), lambda n: len(orjson.dumps({**letter, "error": error[:n] + "..."})) <= room)
    letter["error"] = error[:cut] + "..." if cut is not None else ""
    return orjson.dumps(letter)


def dead_letter_record(rejection: Rejection, raw: bytes | None, key: bytes | None, topic: str, partition: int, offset: int,
                       max_bytes: int) -> tuple[bytes | None, bytes]:
    """Key and value of the dead letter for a rejected input: together at most ``max_bytes``.

    The input's key is kept unless even a letter with no raw leaves it no room
    (a key near the limit): then it is left off and the letter says so
    (``key_dropped``), keeping the raw head that fits without it.
    """
    value = dead_letter_value(rejection, raw, topic, partition, offset, max_bytes=max_bytes, key_bytes=len(key or b""))
    if key is None or len(key) + len(value) <= max_bytes:
        return key, value
    return None, dead_letter_value(rejection, raw, topic, partition, offset, max_bytes=max_bytes, key_dropped=True)


def _longest_head(head: str, encoding: str, room: int) -> str:
    """The longest head of a letter's raw text whose JSON string takes at most ``room`` bytes more than ``""``."""
    if encoding == "base64":  # 4 characters for every 3 bytes, none escaped: whole groups decode to a head of the original
        return head[: min(len(head), room // 4 * 4)]
    n = _longest(len(head), lambda n: len(orjson.dumps(head[:n])) - 2 <= room)
    return head[:n]


def _longest(most: int, fits: Callable[[int], bool]) -> int | None:
    """The largest n in 0..most with fits(n), for fits true up to some n and false after (None: not even 0)."""
    if not fits(0):
        return None
    low, high = 0, most
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


class Application:
    """The perceptron service. ``run()`` blocks until SIGTERM/SIGINT or :meth:`stop`."""

    def __init__(self, settings: ServeSettings):
        self.settings = s = settings
        self.learner = make_learner(s.variant, s.margin, s.standardize, s.max_model_features or None, s.hash_features)
        self.decoder = Decoder(s.max_message_bytes, s.max_features, max_feature_value=s.max_feature_value)
        self.metrics = ServiceMetrics(window=s.mistake_rate_window, version=__version__, variant=s.variant)
        self.health = Health(s.healthz_timeout_seconds)
        self.http: HttpEndpoints | None = None
        self.io = None  # the stream of service.kafka.open_stream
        self.store = None
        self.owner: Owner | None = None  # whose checkpoints this service writes and reads (set at start-up)
        self._started_over = False  # --start-over set foreign state aside: a new model, committed offsets ignored
        self.positions: dict[tuple[str, int], int] = {}
        self.checkpoint_seq = 0
        self._events_since_checkpoint = 0
        self._last_checkpoint_at = time.monotonic()
        self._checkpoint_retry_at = 0.0
        self._batch_open = False  # a batch is being processed and its outputs are not all acknowledged
        self._to_commit: dict[tuple[str, int], int] | None = None  # positions acknowledged and not yet committed
        self._group_checked = False  # this instance passed the one-member check of its group
        self._assignment_to_check = False
        self._others_gone_by: float | None = None  # waiting for other members to leave until then (monotonic)
        self._next_group_check = 0.0
        self._stopping = False
        self._next_lag_at = 0.0
        self._polled_since_lag = False  # records came in since the last lag refresh

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
            topics.append(TopicSpec(s.checkpoint_topic, 1, s.topic_replication_factor, CHECKPOINT_TOPIC_CONFIG))
        self._until_it_works(lambda: ensure_topics(s, topics, s.create_topics), "reach the brokers and check the topics")
        if self._stopping:
            return
        if s.state_store != "none":
            ids = self._until_it_works(lambda: cluster_identity(s, s.input_topic), "read the cluster's and the input topic's ids")
            if self._stopping:
                return
            self.owner = Owner(s.group_id, s.input_topic, GROUP_TASK, *ids)
        if s.state_store == "local":
            self.store = LocalStore(s.state_dir, s.group_id)
        elif s.state_store == "kafka":
            self.store = self._until_it_works(lambda: KafkaStore(CompactedTopic(s, s.checkpoint_topic), s.group_id),
                                              "connect to the checkpoint topic")
        if self._stopping:
            return
        if self.store is None:
            self.health.restored = True  # nothing to restore: a storeless model starts from zero
        else:
            self.store.key = s.checkpoint_key.get_secret_value().encode() if s.checkpoint_key else None
            self.store.lock(GROUP_TASK)
            # fail fast on a bad checkpoint, or on lost state, before joining the group
            if not self._until_it_works(self._restore, "read the checkpoints") and not self._stopping:
                self._until_it_works(self._refuse_lost_state, "read the group's committed offsets")
        if self._stopping:
            return
        self.io = self._until_it_works(
            lambda: open_stream(s, s.kafka_client, group_id=s.group_id, input_topic=s.input_topic,
                                auto_offset_reset=s.auto_offset_reset, on_assigned=self._on_assigned,
                                on_revoked=self._on_revoked, max_poll_records=s.batch_size,
                                fetch_max_wait_ms=s.fetch_max_wait_ms),
            "connect the consumer and producer",
        )
        self.health.broker_ok = True
        # Start-up leaves ~100k long-lived objects (river, pydantic, the clients);
        # every full collection walked them all, about 5 µs an event at full
        # speed. Frozen, the collector only looks at what the loop allocates.
        gc.collect()
        gc.freeze()

    def _until_it_works(self, action: Callable, what: str):
        """Retry ``action`` with backoff until it works or the service is stopped: no crash loop."""
        delay = 0.2
        while True:
            try:
                return action()
            except FATAL_ERRORS as exc:
                raise fatal(exc, what, self.settings) from None
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
                    if self._batch_open:
                        # stopped (or failed) inside a batch: the model and positions in
                        # memory are ahead of the acknowledged outputs; saving them would
                        # lose those outputs, or learn an event twice after a restart
                        log.warning("stopped inside a batch whose outputs were not all acknowledged: no final checkpoint; "
                                    "the next start learns and publishes it again from checkpoint %d", self.checkpoint_seq)
                    else:
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
            except FATAL_ERRORS as exc:  # e.g. no read permission on the topic or the group
                raise fatal(exc, f"read {s.input_topic} in group {s.group_id}", s) from None
            except KafkaError as exc:
                log.warning("poll failed: %s", exc)
                self.health.broker_ok = False
                time.sleep(0.5)
                continue
            if self._assignment_to_check or (self._others_gone_by is not None and time.monotonic() >= self._next_group_check):
                self._check_group()  # before the first record of a new assignment is processed
            if records and not self._group_checked and self.store is not None:
                self._put_back(records)  # other members are still in the group: process nothing yet
                records = []
            if records:
                self._polled_since_lag = True
                try:
                    self._process(records)
                except DeliveryError:  # raised only once stopping: _close leaves the checkpoint as it was
                    return 0
            self._finish_batch(final=False)
            self._refresh_lag()
        return 0

    def _check_group(self) -> None:
        """A newcomer processes nothing while its group has other members: one model, one instance.

        From the poll loop (a rebalance callback may not block on the
        consumer), on this instance's first assignment and then every second
        while others are there. A member that crashed (SIGKILL, an OOM kill,
        a lost node) stays in the group until its session times out: a
        restart within that time is not a second instance, so the newcomer
        pauses its partitions and waits that long for the others to leave
        before it concludes that another instance runs and stops.
        """
        self._assignment_to_check = False
        if self._group_checked:
            return
        if self.store is None:  # no state to fork
            self._group_checked = True
            return
        s = self.settings
        # Retried until it answers (a service that cannot tell must not run beside another one)
        members = self._until_it_works(self.io.group_members, f"check that consumer group {s.group_id} has no other member")
        if members is None:  # stopped meanwhile
            return
        now = time.monotonic()
        if len(members) <= 1:
            if self._others_gone_by is not None:
                log.info("the other member(s) of consumer group %s left: going on", s.group_id)
                self.io.resume()
            self._group_checked, self._others_gone_by = True, None
            self.health.assigned = bool(self.io.assignment())
            return
        self.io.pause()  # after every assignment: a rebalance unpauses
        self.health.assigned = False
        if self._others_gone_by is None:
            self._others_gone_by = now + OTHERS_LEAVE_WAIT_S
            log.warning("consumer group %s has %d other member(s): processing nothing until they leave (a crashed "
                        "instance's session expires within %.0f s)", s.group_id, len(members) - 1, OTHERS_LEAVE_WAIT_S)
        elif now >= self._others_gone_by:
            raise StartupError(
                f"consumer group {s.group_id} still has {len(members) - 1} other active member(s) after "
                f"{OTHERS_LEAVE_WAIT_S:.0f} s: another instance runs this "
                f"model (its checkpoints are in the {s.state_store} store); one instance runs per model: "
                "stop the other one, or give this one another --group-id and state")
        self._next_group_check = now + 1.0

    def _put_back(self, records) -> None:
        """Seek each partition back to the first of ``records``: they are read again once processing may start."""
        for (topic, partition), offset in first_offsets((r.topic, r.partition, r.offset) for r in records).items():
            self.io.seek(topic, partition, offset)

    def _process(self, records) -> None:
        started = time.perf_counter()
        s, io, step, decode = self.settings, self.io, self.learner.step, self.decoder.decode
        learner, positions, dumps = self.learner, self.positions, orjson.dumps
        output_topic, dlq_topic, max_bytes = s.output_topic, s.dlq_topic, s.max_message_bytes
        labeled = unlabeled = 0
        flags: list[bool] = []
        updates_before, dropped_before = learner.updates, learner.dropped_features
        self._batch_open = True
        for r in records:
            event = decode(r.value, r.key)
            if type(event) is not Rejection and type(event.id) is int and not ID_MIN <= event.id <= ID_MAX:
                event = publishable(event)
            if type(event) is Rejection:
                io.send(dlq_topic, *dead_letter_record(event, r.value, r.key, r.topic, r.partition, r.offset, max_bytes))
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
        self._batch_open = False
        if self.store is None:
            self._to_commit = dict(positions)
        self._events_since_checkpoint += len(records)
        self.metrics.observe_batch(labeled=labeled, unlabeled=unlabeled, mistake_flags=flags,
                                   updates=learner.updates - updates_before, latency_s=time.perf_counter() - started,
                                   dropped_features=learner.dropped_features - dropped_before)
        self.metrics.set_model(learner.weight_norm, learner.radius)

    def _flush(self) -> None:
        """Wait for every acknowledgement, however long the brokers are away (or until stopped).

        An output the brokers refuse for good (larger than the topic allows,
        say) is replaced by a dead letter without key or raw value: waiting for
        it would stop the service for one event.
        """
        while True:
            try:
                refused = self.io.flush(timeout_s=10.0)
                self.health.broker_ok = True
                if refused:
                    self._replace_refused(refused)
                return
            except AUTHENTICATION_ERRORS as exc:
                raise fatal(exc, "send the outputs", self.settings) from None
            except FATAL_ERRORS as exc:
                raise StartupError(f"the brokers refuse the service's messages: {exc.__class__.__name__}: {exc}; "
                                   "check the topics' ACLs and the Kafka settings") from None
            except DeliveryError as exc:
                self.health.broker_ok = False
                self.health.beat()  # the loop is alive, waiting for the brokers
                if self._stopping:
                    raise
                log.warning("%s; waiting for the brokers", exc)

    def _replace_refused(self, refused: list[Refused]) -> None:
        s = self.settings
        for r in refused:
            source = orjson.loads(r.value)["source"]  # every output carries its input's position
            what = "dead letter" if r.topic == s.dlq_topic else "prediction"
            error = (f"the brokers refused this event's {what} ({len(r.value)} bytes, key {len(r.key or b'')} bytes) for good: "
                     f"{r.error.__class__.__name__}; the input is at source")
            log.error("%s at %s", error, source)
            self.io.send(s.dlq_topic, None, dead_letter_value(Rejection("output_refused", error), None, source["topic"],
                                                              source["partition"], source["offset"], max_bytes=s.max_message_bytes))
            self.metrics.rejected.labels("output_refused").inc()
        again = self.io.flush(timeout_s=10.0)
        if again:
            raise StartupError(f"the brokers refuse even a short dead letter on {s.dlq_topic}: {again[0].error!r}")

    def _finish_batch(self, final: bool) -> None:
        """Checkpoint when due (or final), then commit what the checkpoint holds (or, storeless, what was acknowledged)."""
        self._maybe_checkpoint(final)
        self._commit()

    def _maybe_checkpoint(self, final: bool) -> None:
        s = self.settings
        if not self._events_since_checkpoint:
            return
        now = time.monotonic()
        due = final or self._events_since_checkpoint >= s.checkpoint_interval_events or (
            now - self._last_checkpoint_at >= s.checkpoint_interval_seconds)
        if due and (final or now >= self._checkpoint_retry_at):
            self._checkpoint()

    def _commit(self) -> None:
        to_commit = self._to_commit
        if to_commit is None:
            return
        try:
            self.io.commit(to_commit, timeout_s=COMMIT_TIMEOUT_S)
        except FATAL_ERRORS as exc:
            raise fatal(exc, f"commit offsets of group {self.settings.group_id}", self.settings) from None
        except KafkaError as exc:
            # e.g. RebalanceInProgressError: keep polling; the next batch
            # commits, or the redelivered events are processed again
            if isinstance(exc, KafkaTimeoutError):
                self.health.broker_ok = False
            log.warning("commit failed (%s); will commit with the next batch", exc.__class__.__name__)
            return
        if self._to_commit is to_commit:  # a revocation during the commit (confluent) may have checkpointed newer positions
            self._to_commit = None
        self.health.broker_ok = True

    def _checkpoint(self) -> bool:
        """Save the model and its positions; a failure is logged and retried later, never fatal."""
        if self.store is None:
            self._events_since_checkpoint = 0
            return True
        cp = Checkpoint(seq=self.checkpoint_seq + 1, positions=dict(self.positions), model=self.learner.to_state(),
                        dimension=self.decoder.dimension, meta=self._model_meta(), created=time.time(), owner=self.owner)
        try:
            self.store.save(cp)
        except FATAL_ERRORS as exc:
            raise fatal(exc, f"write checkpoint {cp.seq}", self.settings) from None
        except (KafkaError, OSError, CheckpointTooLargeError) as exc:
            # the model goes on in memory; a crash before the next good
            # checkpoint replays more events, it does not learn any twice
            retry_in = min(self.settings.checkpoint_interval_seconds, RETRY_MAX_S)
            self._checkpoint_retry_at = time.monotonic() + retry_in
            if isinstance(exc, KafkaError):
                self.health.broker_ok = False
            log.error("checkpoint %d failed: %s; retrying in %.0f s", cp.seq, exc, retry_in)
            return False
        self.checkpoint_seq = cp.seq
        self._to_commit = dict(cp.positions)
        self._events_since_checkpoint = 0
        self._last_checkpoint_at = time.monotonic()
        self.metrics.last_checkpoint.set(cp.created)
        log.debug("checkpoint %d at %s", cp.seq, cp.positions)
        return True

    def _model_meta(self) -> dict:
        s = self.settings
        return {"variant": s.variant, "margin": s.margin, "standardize": s.standardize, "input_topic": s.input_topic,
                "max_model_features": s.max_model_features, "hash_features": s.hash_features}

    # state ---------------------------------------------------------------
    def _restore(self) -> bool:
        """Load the newest usable checkpoint of this model into the learner and decoder; False when there is none.

        Whose it is comes first (:class:`Owner`: group, input topic and its id,
        cluster), then whether this version can use it (settings, model), then
        whether its positions lie inside the partitions' logs. Another model's
        state is never used silently: the service stops, or with --start-over
        starts a new model.
        """
        expected = self._model_meta()
        models, other_settings = {}, []

        def accept(cp: Checkpoint) -> None:
            # Written before the cap and hashing existed: no hashing, and no cap (the model gets today's cap)
            meta = {"max_model_features": expected["max_model_features"], "hash_features": 0, **cp.meta}
            different = {k: (meta.get(k), v) for k, v in expected.items() if meta.get(k) != v}
            if different:  # the operator's settings changed, or this one is not the service's: an older one may fit
                what = ", ".join(f"{k} was {old!r}, now {new!r}" for k, (old, new) in different.items())
                other_settings.append(what)
                raise CheckpointError(f"it was taken with other model settings ({what})")
            try:
                models[cp.seq] = learner_from_state(cp.model)
            except ValueError as exc:
                raise CheckpointError(f"it holds a model this version cannot read: {exc}") from None

        try:
            cp = self.store.load(GROUP_TASK, self.owner, accept, legacy=True)
        except ForeignStateError as exc:
            return self._foreign_state(str(exc), exc.highest_seq)
        except CheckpointError:
            if other_settings:
                raise StartupError(f"the checkpoint was taken with other model settings ({other_settings[0]}); "
                                   "use the same settings, or another state store to start a new model") from None
            raise
        if cp is None:
            log.info("no checkpoint yet: a new model, starting from zero weights")
            self.health.restored = True
            return False
        if cp.owner is None and not self._vouch_for_legacy(cp):
            return False
        if not self._positions_in_logs(cp):
            return False
        self.learner = models[cp.seq]
        cap = self.settings.max_model_features or None
        if self.learner.max_features != cap:  # a checkpoint from before the cap existed: it applies from now on
            self.learner.max_features = cap
            log.info("the checkpoint predates --max-model-features: the model holds %d features, and at most %s from now on",
                     len(self.learner.weights), cap)
        self.decoder.dimension = cp.dimension
        self.checkpoint_seq = cp.seq
        self.positions = dict(cp.positions)
        self.health.restored = True
        self.metrics.set_model(self.learner.weight_norm, self.learner.radius)
        self.metrics.last_checkpoint.set(cp.created)
        log.info("restored checkpoint %d: %d events seen, %d updates, %d features dropped, positions %s",
                 cp.seq, self.learner.seen, self.learner.updates, self.learner.dropped_features, cp.positions)
        return True

    def _foreign_state(self, problem: str, highest_seq: int) -> bool:
        """Stop naming ``problem``, or with --start-over, start a new model whose checkpoints supersede the store's."""
        s = self.settings
        if not s.start_over:
            raise StartupError(
                f"{problem}. Nothing was restored and nothing learned. To keep that model, point --state-dir or "
                f"--checkpoint-topic at this model's own state, or connect to the cluster it belongs to; to start a new "
                f"model on {s.input_topic} from --auto-offset-reset {s.auto_offset_reset} deliberately, run with --start-over")
        log.warning("--start-over: %s; starting a new model from --auto-offset-reset %s", problem, s.auto_offset_reset)
        self.checkpoint_seq = max(self.checkpoint_seq, highest_seq)
        self._started_over = True
        self.health.restored = True
        return False

    def _vouch_for_legacy(self, cp: Checkpoint) -> bool:
        """A version 0.1 checkpoint records no owner: adopt it only when this group's committed offsets are its positions.

        That version committed nothing but checkpointed positions, so equal
        offsets say this group wrote it on this cluster; a fresh cluster or
        another group has other offsets (or none).
        """
        s = self.settings
        offsets = self._until_it_works(lambda: committed_offsets(s, s.group_id, s.input_topic), "read the group's committed offsets")
        mine = {p: o for (t, p), o in cp.positions.items() if t == s.input_topic}
        if offsets == mine:
            self.store.adopt_legacy(GROUP_TASK)
            return True
        return self._foreign_state(
            f"checkpoint {cp.seq} was written by version 0.1, which did not record its consumer group or cluster, and the "
            f"offsets consumer group {s.group_id} committed on {s.input_topic} ({offsets or 'none'}) are not its positions "
            f"({mine}): it belongs to another group or cluster", cp.seq)

    def _positions_in_logs(self, cp: Checkpoint) -> bool:
        """Every position of ``cp`` inside its partition's log (first offset ≤ position ≤ end), else refuse.

        Before the start: records the model never learned were deleted
        (retention). After the end: the topic was emptied or created again, or
        the checkpoint is not this cluster's. Either way, seeking there would
        skip or lose events silently.
        """
        s = self.settings
        ranges = self._until_it_works(lambda: log_ranges(s, s.input_topic), f"read the logs' ranges of {s.input_topic}")
        outside = []
        for (topic, partition), position in sorted(cp.positions.items()):
            if topic != s.input_topic:
                continue
            if partition not in ranges:
                outside.append(f"partition {partition} at offset {position}, but {topic} has no partition {partition}")
            elif not ranges[partition][0] <= position <= ranges[partition][1]:
                first, end = ranges[partition]
                outside.append(f"partition {partition} at offset {position}, outside its log ({first} to {end})")
        if not outside:
            return True
        return self._foreign_state(f"checkpoint {cp.seq} holds positions outside {s.input_topic}'s logs: "
                                   + "; ".join(outside), cp.seq)

    def _refuse_lost_state(self) -> None:
        """With no checkpoint, committed offsets mean the state that learned up to them is lost.

        This service commits only checkpointed positions, so offsets without a
        checkpoint come from a model whose store was emptied (a new volume, a
        deleted topic) or from a storeless run. Going on would learn from the
        middle of the stream with zero weights, silently.
        """
        s = self.settings
        if self._started_over:
            return
        offsets = committed_offsets(s, s.group_id, s.input_topic)
        if offsets:
            at = ", ".join(f"partition {p} at {o}" for p, o in sorted(offsets.items()))
            where = self.store.task_dir(GROUP_TASK) if s.state_store == "local" else f"topic {s.checkpoint_topic}"
            message = (f"consumer group {s.group_id} has committed offsets on {s.input_topic} ({at}) but the state store "
                       f"({s.state_store}, {where}) has no checkpoint: the model that learned those events is lost")
            if s.start_over:
                log.warning("--start-over: %s; starting a new model from --auto-offset-reset %s", message, s.auto_offset_reset)
                self._started_over = True
                return
            raise StartupError(
                f"{message}. Restore the checkpoints, or start a new model on the retained history with a new --group-id "
                "or --start-over, or reset the group's offsets (kafka-consumer-groups --reset-offsets)")

    # The rebalance callbacks run inside the stream's poll (kafka-python: on its
    # network thread; confluent-kafka: on the loop's thread, inside poll or
    # commit): they may not block on the consumer (a commit there raises), so
    # they only seek, checkpoint and leave the rest to the poll loop.
    def _on_assigned(self, partitions: list[tuple[str, int]]) -> None:
        # The learner in memory is the newest state (revocation checkpoints
        # first); seek every partition it has learned from to where it stands,
        # whatever the committed offsets say.
        for tp in partitions:
            if tp in self.positions:
                self.io.seek(tp[0], tp[1], self.positions[tp])
            elif self.store is not None:
                # The model has learned nothing from it; committed offsets are
                # only ever a checkpoint's, so any here belong to a checkpoint
                # that could not be used: start where a new model would.
                self.io.seek(tp[0], tp[1], BEGINNING if self.settings.auto_offset_reset == "earliest" else END)
        log.info("assigned %s", ", ".join(f"{t}[{p}]" for t, p in partitions) or "nothing")
        self.health.assigned = bool(partitions) and (self._group_checked or self.store is None)
        self.metrics.set_assigned(len(partitions))
        self._assignment_to_check = True
        self._next_lag_at = 0.0

    def _on_revoked(self, partitions: list[tuple[str, int]]) -> None:
        log.info("revoked %s", ", ".join(f"{t}[{p}]" for t, p in partitions) or "nothing")
        if self.io is not None and self._group_checked and not self._batch_open:
            self._maybe_checkpoint(final=True)  # committed by the loop once the group is stable again
        self.metrics.forget_partitions(partitions)
        self.health.assigned = False
        self.metrics.set_assigned(0)

    def _refresh_lag(self) -> None:
        """Lag per partition; when no records came, also the loop's probe of the brokers for /readyz.

        While records flow, the fetch responses' high watermarks give the lag
        with no request, and the flushes tell that the brokers answer.
        """
        now = time.monotonic()
        if now < self._next_lag_at:
            return
        self._next_lag_at = now + LAG_EVERY_S
        flowing, self._polled_since_lag = self._polled_since_lag, False
        try:
            self.metrics.set_lag(self.io.lag(timeout_s=PROBE_TIMEOUT_S, ask_broker=not flowing))
            if not flowing:
                self.health.broker_ok = True
        except FATAL_ERRORS as exc:
            raise fatal(exc, "read the end offsets for the lag", self.settings) from None
        except KafkaError as exc:
            self.health.broker_ok = False
            log.warning("could not read the end offsets for the lag: %s", exc.__class__.__name__)
