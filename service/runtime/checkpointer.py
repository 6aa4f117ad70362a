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

A checkpoint due in the loop's turn is written off the loop (:class:`Write`): the loop
copies what it needs (each task's snapshot, plain lists and numbers) and goes on; a
thread of its own encodes, signs, writes and fsyncs it; a later turn finds it written
and commits its positions. The order holds as before: the snapshot holds positions
whose outputs were acknowledged, and they are committed only once the write is done.
One write at a time (the next is due only after it), and every checkpoint outside
the turn (a revocation, the final one) waits for it first. Not for a task with a
label topic (its pending table's epoch closes with the checkpoint, on the loop's
thread: SQLite), nor under exactly-once (the checkpoint is a record of the
transaction): those write in the turn, as before. Why: a checkpoint turn on
Apache Kafka took 12-60 ms against 2-14 ms for a batch (bench/README.md, "The
checkpoint off the loop").

Under ``--processing-guarantee exactly-once`` the checkpoints go in the loop's open
transaction, whose room is :mod:`perceptron_stream.runtime.transaction`: this module
decides when it commits (every ``--commit-interval-ms``, on revocation, at a clean stop)
and when it is aborted (a stop inside a batch, a state topic lost).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

from perceptron_stream.kafka import KafkaFatal, KafkaUnavailable, RecordLimits
from perceptron_stream.runtime.retry import Backoff, StartupError, fatal
from perceptron_stream.runtime.transaction import COMMIT_TIMEOUT_S, Transaction
from perceptron_stream.state.kafka_store import CheckpointTooLargeError

log = logging.getLogger("perceptron_stream")

#: What a checkpoint's write may fail with: stop the service (KafkaFatal), or retry after a backoff (the others).
WRITE_ERRORS = (KafkaFatal, KafkaUnavailable, OSError, CheckpointTooLargeError)


class Write:
    """Checkpoints being written on ``writer``'s thread, in order; :meth:`result` waits for them: the checkpoints
    written, and the error that stopped the rest (None: all written).

    >>> class Store:
    ...     def save(self, cp):
    ...         if cp == "bad":
    ...             raise OSError("disk full")
    >>> with ThreadPoolExecutor(max_workers=1) as writer:
    ...     written, error = Write(Store(), [("t1", "cp1", 3), ("t2", "bad", 2), ("t3", "cp3", 1)], writer).result()
    >>> [cp for _, cp, _ in written], error
    (['cp1'], OSError('disk full'))
    """

    def __init__(self, store, items: list, writer: ThreadPoolExecutor):
        self.items = items  # (task, checkpoint, events it covers), in order
        self._future = writer.submit(self._run, store)

    def _run(self, store) -> tuple[list, BaseException | None]:
        written: list = []
        for item in self.items:
            try:
                store.save(item[1])
            except BaseException as exc:  # handed to the loop's thread, which decides (retry later, or stop)
                return written, exc
            written.append(item)
        return written, None

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> tuple[list, BaseException | None]:
        return self._future.result()


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
        self._write: Write | None = None  # the turn's checkpoint being written off the loop
        # its thread: one, kept (a thread started for each write held the loop ~0.5 ms: start() waits for it to run)
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-write")
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
        if self._write is not None and (final or self._write.done()):
            self._written()
        if self._due(tasks, final):
            if final or not self._off_the_loop(tasks):
                self.checkpoint(tasks)
            else:
                items = [(task, task.snapshot(), task.unsaved) for task in tasks if task.unsaved]
                self._write = Write(self.store, items, self._writer)
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

    def _off_the_loop(self, tasks) -> bool:
        """Whether the turn's checkpoint may be written off the loop (see the module's docstring)."""
        return self.transaction is None and all(task.joiner is None for task in tasks)

    def _due(self, tasks, final: bool) -> bool:
        unsaved = sum(task.unsaved for task in tasks)
        if not unsaved or self.store is None or self._write is not None:
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
        if self._write is not None:  # the one written off the loop first: checkpoints in order (one that failed is
            self._written()  # written again here, as its tasks are still unsaved)
        for task in tasks:
            if not task.unsaved:
                continue
            cp, learned = task.snapshot(), task.unsaved
            try:
                task.before_save(cp)
                self.store.save(cp)
            except WRITE_ERRORS as exc:
                self._failed(task, cp, exc)
                return False
            self._saved(task, cp, learned)
        self._all_saved()
        return True

    def _written(self) -> bool:
        """The checkpoint written off the loop, taken in (waited for if still being written): its tasks saved, their
        positions to commit; False when a write failed (retried later, as one in the turn)."""
        assert self._write is not None
        written, error = self._write.result()
        items, self._write = self._write.items, None
        for task, cp, learned in written:
            self._saved(task, cp, learned)
        if error is not None:
            task, cp, _ = items[len(written)]
            if not isinstance(error, WRITE_ERRORS):
                raise error
            self._failed(task, cp, error)
            return False
        self._all_saved()
        return True

    def _all_saved(self) -> None:
        """Every due task saved: the backoff starts over, and the interval counts from now."""
        self._backoff.reset()
        self._last_at = time.monotonic()

    def _saved(self, task, cp, learned: int) -> None:
        """``cp`` of ``task`` is written: the ``learned`` events it covers are saved (those since its snapshot are
        not), its positions are committed next."""
        task.saved(cp, learned)
        self._to_commit = {**(self._to_commit or {}), **cp.positions}
        self.metrics.last_checkpoint.set(cp.created)
        log.debug("checkpoint %d at %s (%s)", cp.seq, cp.positions, task.name)

    def _failed(self, task, cp, exc: BaseException) -> None:
        """A checkpoint not written: the service stops (a fatal error), or it is tried again after a backoff."""
        if isinstance(exc, KafkaFatal):
            raise fatal(exc, f"write checkpoint {cp.seq} of {task.name}") from None
        retry_in = self._backoff.next()
        self._retry_at = time.monotonic() + retry_in
        if isinstance(exc, KafkaUnavailable):  # the brokers are away: one line per outage, naming the setting
            self.health.broker_failed(f"write checkpoint {cp.seq} of {task.name}", exc)
            log.debug("checkpoint %d of %s failed: %s; retrying in %.0f s", cp.seq, task.name, exc, retry_in)
        else:
            log.error("checkpoint %d of %s failed: %s; retrying in %.0f s", cp.seq, task.name, exc, retry_in)

    def close(self) -> None:
        """The writer's thread ended, once a checkpoint it may still write is written (a stop inside a batch
        leaves it unread: written, its positions not committed, as a crash right after a write would)."""
        self._writer.shutdown(wait=True)

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
