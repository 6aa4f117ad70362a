"""The one place that decides when to checkpoint, and does it in the one safe order.

Outputs acknowledged (the loop flushed the batch) → each task's model and
positions saved → those positions committed to the consumer group. So a
checkpoint never holds a position whose outputs the brokers did not take,
and the group's committed offsets are only ever a checkpoint's positions.
A checkpoint is due every ``--checkpoint-interval-events`` events or
``--checkpoint-interval-seconds`` while events flow, on revocation and at
shutdown; a failed one is logged and retried later (the model goes on in
memory: a crash before the next good one replays more events, it never
learns one twice). Without a store, what was acknowledged is committed.

The state topics are checked from here too, every few seconds at most
(:class:`~perceptron_stream.runtime.state_topics.StateTopics`): one deleted,
created again or no longer compacted stops the service before it writes
state again (no checkpoint, no commit, no final checkpoint after it).

Under ``--processing-guarantee exactly-once`` the checkpoints go in the loop's open
transaction, whose room is :mod:`perceptron_stream.runtime.transaction`: this module
decides when it commits (every ``--commit-interval-ms``, on revocation, at a clean stop)
and when it is aborted (a stop inside a batch, a state topic lost).
"""

from __future__ import annotations

import logging
import time

from perceptron_stream.kafka import KafkaFatal, KafkaUnavailable, RecordLimits
from perceptron_stream.runtime.retry import Backoff, StartupError, fatal
from perceptron_stream.runtime.transaction import COMMIT_TIMEOUT_S, Transaction
from perceptron_stream.state.kafka_store import CheckpointTooLargeError

log = logging.getLogger("perceptron_stream")


class Checkpointer:
    def __init__(self, settings, store, metrics, health, retry, state_topics=None, limits: RecordLimits | None = None):
        self.settings, self.store, self.metrics, self.health, self.retry = settings, store, metrics, health, retry
        self.state_topics = state_topics  # StateTopics: checked at each turn, asked every few seconds at most
        self.state_lost = False  # a state topic was deleted or replaced: nothing more is written or committed
        self._last_at = time.monotonic()
        self._retry_at = 0.0
        self._backoff = Backoff(first=1.0, most=min(settings.checkpoint_interval_seconds, 5.0))
        self._to_commit: dict[tuple[str, int], int] | None = (
            None  # saved (or, storeless, acknowledged), not yet committed
        )
        #: exactly-once: the loop's open transaction (None: at least once)
        self.transaction = (
            Transaction(settings, store, metrics, health, limits, self._state_topic_lost)
            if settings.processing_guarantee == "exactly-once"
            else None
        )

    @property
    def transaction_failed(self) -> bool:
        """Exactly-once: a transaction failed (or was lost with the state topics): nothing more is committed."""
        return self.transaction is not None and self.transaction.failed

    def acknowledged(self, tasks) -> None:
        """A batch's outputs were acknowledged: without a store, its positions may be committed now."""
        if self.store is None:
            self._to_commit = {tp: o for task in tasks for tp, o in task.positions.items()}
            for task in tasks:
                task.unsaved = 0

    def maybe(self, tasks, stream, final: bool = False) -> str:
        """Checkpoint when due (or ``final``), then commit what the checkpoints hold (exactly-once: commit the
        transaction when due, or ``final``). What it did, for the loop's turn times: ``"transaction"``,
        ``"checkpoint"`` (and its commit), ``"commit"``, or ``""``."""
        self._watch(stream)
        if self.transaction is not None:
            if final or self.transaction.due():
                self.transaction.commit(tasks, stream)
                return "transaction"
            return ""
        did = ""
        if self._due(tasks, final):
            self.checkpoint(tasks)
            did = "checkpoint"
        if self._to_commit and not did:
            did = "commit"
        self.commit(stream)
        return did

    def final(self, tasks, stream, batch_open: bool) -> None:
        """At shutdown: the final checkpoint and commit, unless stopped inside a batch whose outputs were not all
        acknowledged (``batch_open``); nothing after a failed transaction (exactly-once) or a lost state topic."""
        if self.transaction_failed or self.state_lost:
            return
        if batch_open:
            # stopped (or failed) inside a batch: the models and positions in
            # memory are ahead of the acknowledged outputs; saving them would
            # lose those outputs, or learn an event twice after a restart
            log.warning(
                "stopped inside a batch whose outputs were not all acknowledged: no final checkpoint; "
                "the next start learns and publishes it again from the last checkpoint"
            )
            if self.transaction is not None and stream is not None:
                self.transaction.abort(stream)
        else:
            self.maybe(tasks, stream, final=True)
            unsaved = [task.name for task in tasks if task.unsaved]
            if unsaved and self.store is not None and self.transaction is None:
                # the final checkpoint could not be written: the stop leaves work undone, which exit 0 would hide
                raise StartupError(
                    f"stopped without the final checkpoint of {', '.join(unsaved)} (see the error above): the "
                    "next start learns and publishes again what came after the last checkpoint"
                )

    def _due(self, tasks, final: bool) -> bool:
        unsaved = sum(task.unsaved for task in tasks)
        if not unsaved or self.store is None:
            return False
        now = time.monotonic()
        s = self.settings
        due = final or unsaved >= s.checkpoint_interval_events or now - self._last_at >= s.checkpoint_interval_seconds
        return due and (final or now >= self._retry_at)

    def checkpoint(self, tasks, stream=None) -> bool:
        """Save every task with unsaved events; their positions are committed next. False when a save failed.
        Exactly-once (on revocation): the transaction committed with them, in ``stream``."""
        if self.state_lost:
            return False
        if self.transaction is not None:
            return self.transaction.commit(tasks, stream)
        if self.store is None:
            return True
        for task in tasks:
            if not task.unsaved:
                continue
            cp = task.snapshot()
            try:
                task.before_save(cp)
                self.store.save(cp)
            except KafkaFatal as exc:
                raise fatal(exc, f"write checkpoint {cp.seq} of {task.name}") from None
            except (KafkaUnavailable, OSError, CheckpointTooLargeError) as exc:
                retry_in = self._backoff.next()
                self._retry_at = time.monotonic() + retry_in
                if isinstance(exc, KafkaUnavailable):  # the brokers are away: one line per outage, naming the setting
                    self.health.broker_failed(f"write checkpoint {cp.seq} of {task.name}", exc)
                    log.debug("checkpoint %d of %s failed: %s; retrying in %.0f s", cp.seq, task.name, exc, retry_in)
                else:
                    log.error("checkpoint %d of %s failed: %s; retrying in %.0f s", cp.seq, task.name, exc, retry_in)
                return False
            task.saved(cp)
            self._to_commit = {**(self._to_commit or {}), **cp.positions}
            self.metrics.last_checkpoint.set(cp.created)
            log.debug("checkpoint %d at %s (%s)", cp.seq, cp.positions, task.name)
        self._backoff.reset()
        self._last_at = time.monotonic()
        return True

    def pending_commit(self) -> bool:
        """Positions saved (or, storeless, acknowledged) and not committed yet."""
        return bool(self._to_commit)

    def commit(self, stream) -> None:
        to_commit = self._to_commit
        if not to_commit or stream is None or self.state_lost:
            return
        # a commit of partitions no longer owned (revoked in an outage) asks the brokers nothing: no sign they answer
        asked = not set(to_commit).isdisjoint(stream.assignment())
        # e.g. RebalanceInProgress: keep polling; the next batch commits, or the redelivered events are processed again
        ok, _ = self.retry.once(
            lambda: stream.commit(to_commit, timeout_s=COMMIT_TIMEOUT_S),
            f"commit offsets of group {self.settings.group_id}",
        )
        if not ok:
            return
        if (
            self._to_commit is to_commit
        ):  # a revocation during the commit (confluent) may have checkpointed newer positions
            self._to_commit = None
        if asked:
            self.health.broker_ok = True

    def _watch(self, stream) -> None:
        """The state topics checked when due; one lost stops the service (StateTopicError), with nothing written
        after it: under exactly-once the open transaction is aborted (nothing of it visible)."""
        if self.state_topics is None or self.state_lost:
            return
        try:
            self.state_topics.maybe()
        except StartupError:
            self.state_lost = True
            if self.transaction is not None:
                self.transaction.failed = True  # nothing is committed after it
                if stream is not None:
                    self.transaction.abort(stream)
            raise

    def _state_topic_lost(self) -> StartupError | None:
        """The StateTopicError of a state topic lost, checked now (None: each is still there and compacted, or the
        brokers did not answer)."""
        if self.state_topics is None or self.state_lost:
            return None
        try:
            self.state_topics.check()
        except StartupError as lost:
            self.state_lost = True
            return lost
        return None
