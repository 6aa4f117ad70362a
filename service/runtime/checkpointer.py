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

Under ``--processing-guarantee exactly-once`` the loop's stream holds an open
Kafka transaction with every output since the last commit; every
``--commit-interval-ms`` (and on revocation, and at a clean stop) the
checkpoint record of each task that changed (and, with delayed labels, its
pending changelog records) is sent into it and it is committed with those
tasks' positions (:meth:`Checkpointer.transact`): outputs, checkpoints,
changelog and positions become visible together, or not at all. A
transaction that fails is not retried: the service stops
(:meth:`Checkpointer.transaction_lost`), and its restart restores the last
committed checkpoint, which is where the committed outputs and positions end.

One fault injection, for tests only: with the environment variable
``ABORT_TRANSACTION_ENV`` set to N, the process's N-th transaction that commits
something is aborted where its commit would be, once every record of it
(outputs, changelog, checkpoint) is in the brokers' logs; the service then
stops as for any aborted transaction (tests/integration/test_exactly_once.py).
Neither a SIGKILL nor a paused broker can place an abort there: the changelog
and checkpoint records exist only in the few milliseconds of a commit. Never
set it in production.
"""

from __future__ import annotations

import logging
import os
import time

from perceptron_stream.kafka import (
    Aborted,
    Fenced,
    KafkaFatal,
    KafkaUnavailable,
    RecordLimits,
    RecordTooLarge,
    refuse_too_large,
)
from perceptron_stream.runtime.retry import Backoff, StartupError, fatal
from perceptron_stream.state.kafka_store import CheckpointTooLargeError

log = logging.getLogger("perceptron_stream")

#: Commits give up after this long (a commit waits for the group coordinator).
COMMIT_TIMEOUT_S = 5.0
#: Test-only (see the module's docstring): the number of the transaction to abort before its commit.
ABORT_TRANSACTION_ENV = "PERCEPTRON_TEST_ABORT_TRANSACTION"


class Checkpointer:
    def __init__(self, settings, store, metrics, health, retry, state_topics=None):
        self.settings, self.store, self.metrics, self.health, self.retry = settings, store, metrics, health, retry
        self.state_topics = state_topics  # StateTopics: checked at each turn, asked every few seconds at most
        self.state_lost = False  # a state topic was deleted or replaced: nothing more is written or committed
        self._last_at = time.monotonic()
        self._retry_at = 0.0
        self._backoff = Backoff(first=1.0, most=min(settings.checkpoint_interval_seconds, 5.0))
        self._to_commit: dict[tuple[str, int], int] | None = (
            None  # saved (or, storeless, acknowledged), not yet committed
        )
        self.exactly_once = settings.processing_guarantee == "exactly-once"
        self.transaction_failed = False  # exactly-once: a transaction failed, the service is stopping
        self.transactions = 0  # exactly-once: transactions that sent something, this run
        self._abort_at = int(os.environ.get(ABORT_TRANSACTION_ENV, 0))  # test-only fault injection (0: none)
        self.limits: RecordLimits | None = None  # the topics' record limits, once start-up read them

    def acknowledged(self, tasks) -> None:
        """A batch's outputs were acknowledged: without a store, its positions may be committed now."""
        if self.store is None:
            self._to_commit = {tp: o for task in tasks for tp, o in task.positions.items()}
            for task in tasks:
                task.unsaved = 0

    def maybe(self, tasks, stream, final: bool = False) -> None:
        """Checkpoint when due (or ``final``), then commit what the checkpoints hold (exactly-once: commit the
        transaction when due, or ``final``)."""
        self._watch(stream)
        if self.exactly_once:
            if final or time.monotonic() - self._last_at >= self.settings.commit_interval_ms / 1000:
                self.transact(tasks, stream)
            return
        if self._due(tasks, final):
            self.checkpoint(tasks)
        self.commit(stream)

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
            if self.exactly_once and stream is not None:
                self._abort(stream)
        else:
            self.maybe(tasks, stream, final=True)
            unsaved = [task.name for task in tasks if task.unsaved]
            if unsaved and self.store is not None and not self.exactly_once:
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
        if self.exactly_once:
            return self.transact(tasks, stream)
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
            if self.exactly_once and stream is not None:
                self._abort(stream)
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

    # exactly-once ----------------------------------------------------------
    def transact(self, tasks, stream) -> bool:
        """Exactly-once: the checkpoint record of each task with unsaved events sent into the open transaction,
        which is then committed with their positions; the tasks saved. A failure stops the service."""
        if self.transaction_failed or self.state_lost:  # stopping; kafka-python's close calls on_revoked
            return False
        changed = [task for task in tasks if task.unsaved]
        self._last_at = time.monotonic()
        if not changed or stream is None:
            return True
        started = time.perf_counter()
        checkpoints = [(task, task.snapshot()) for task in changed]
        try:
            for task, cp in checkpoints:
                task.before_save(cp, stream)  # the pending changelog's records of the span
                topic, key, value = self.store.record(cp)
                refuse_too_large(self.limits, topic, key, value)  # it would fail the transaction at its commit
                stream.send(topic, key, value)
            self.transactions += 1
            if self.transactions == self._abort_at:
                self._inject_abort(stream)
            refused = stream.commit_transaction(
                {tp: o for _, cp in checkpoints for tp, o in cp.positions.items()}, timeout_s=COMMIT_TIMEOUT_S
            )
        except CheckpointTooLargeError as exc:
            self._abort(stream)
            raise StartupError(str(exc)) from None
        except RecordTooLarge as exc:  # a checkpoint or changelog record its topic would refuse for good
            self.transaction_failed = True
            self._abort(stream)
            raise fatal(exc, "write the span's checkpoint") from None
        except (KafkaFatal, KafkaUnavailable) as exc:  # Fenced, Aborted, or another reason it ended unknown
            raise self.transaction_lost(exc) from None
        if refused:  # only the checkpoint records were sent since the batch's flush
            raise StartupError(
                f"the brokers refused a checkpoint record on {refused[0].topic} for good "
                f"({refused[0].error!r}) after its transaction committed: the next start finds no "
                "checkpoint at the committed positions; raise the topic's max.message.bytes"
            )
        self.metrics.transaction_commit.observe(time.perf_counter() - started)
        self.metrics.transactions.labels("committed").inc()
        for task, cp in checkpoints:
            task.saved(cp)
            log.debug("checkpoint %d at %s (%s) committed with its transaction", cp.seq, cp.positions, task.name)
        self.metrics.last_checkpoint.set(checkpoints[-1][1].created)
        self.health.broker_ok = True
        return True

    def transaction_lost(self, exc: Exception) -> StartupError:
        """The StartupError that stops the service when a transaction failed (counted as aborted): nothing of it is
        visible, and the restart restores the last committed checkpoint, where the committed outputs end.

        A state topic deleted or created again fails the transaction that writes to it (its checkpoint record is
        not acknowledged) before the next check would see it: the state topics are checked now, and that is what
        the service stops with when one is lost."""
        lost = self._state_topic_lost()
        if lost is not None:
            self.transaction_failed = True
            self.metrics.transactions.labels("aborted").inc()
            return lost
        if not isinstance(exc, (Fenced, Aborted, KafkaFatal)):
            log.error("a transaction's commit ended without an answer (%s): it is committed or aborted", exc)
        self.transaction_failed = True
        self.metrics.transactions.labels("aborted").inc()
        if isinstance(exc, Fenced):
            return StartupError(
                f"fenced: a newer owner has this instance's partitions ({exc}); nothing of the open "
                "transaction is visible; stopping, for the orchestrator to restart the instance"
            )
        if isinstance(exc, Aborted):
            return StartupError(
                f"{exc}: nothing of it is visible; stopping, so that the restart restores the last "
                "committed checkpoint and processes the span again"
            )
        if isinstance(exc, KafkaFatal):
            return fatal(exc, "commit a transaction")
        return StartupError(
            f"a transaction's commit did not finish ({exc}); stopping, so that the restart restores "
            "the last committed checkpoint"
        )

    def evicted(self, stream, partitions: list[tuple[str, int]]) -> StartupError:
        """Exactly-once, the group removed this instance: the open transaction aborted (not left to hold
        read_committed readers back until it times out), and the StartupError that stops the service."""
        self.transaction_failed = True  # first: nothing is committed after this, whatever the abort meets
        self._abort(stream, count=False)  # counted once, by transaction_lost
        return self.transaction_lost(
            Fenced(f"the group removed this instance and took its {len(partitions)} partition(s) away")
        )

    def _inject_abort(self, stream) -> None:
        """Test-only: abort the open transaction once all it holds is in the logs, as a failed commit would."""
        stream.flush(COMMIT_TIMEOUT_S)
        stream.abort()
        log.warning(
            "%s=%d: transaction %d aborted before its commit", ABORT_TRANSACTION_ENV, self._abort_at, self._abort_at
        )
        raise Aborted(f"transaction {self.transactions} aborted by the test's {ABORT_TRANSACTION_ENV}")

    def _abort(self, stream, count: bool = True) -> None:
        try:
            stream.abort()
        except (KafkaFatal, KafkaUnavailable) as exc:  # the transaction coordinator aborts it after its timeout
            log.warning("could not abort the open transaction (%s)", exc)
        if count:
            self.metrics.transactions.labels("aborted").inc()
