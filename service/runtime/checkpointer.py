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
"""

from __future__ import annotations

import logging
import time

from service.kafka import KafkaFatal, KafkaUnavailable
from service.runtime.retry import Backoff, fatal
from service.state.kafka_store import CheckpointTooLargeError

log = logging.getLogger("perceptron_stream")

#: Commits give up after this long (a commit waits for the group coordinator).
COMMIT_TIMEOUT_S = 5.0


class Checkpointer:
    def __init__(self, settings, store, metrics, health, retry):
        self.settings, self.store, self.metrics, self.health, self.retry = settings, store, metrics, health, retry
        self._last_at = time.monotonic()
        self._retry_at = 0.0
        self._backoff = Backoff(first=1.0, most=min(settings.checkpoint_interval_seconds, 5.0))
        self._to_commit: dict[tuple[str, int], int] | None = None  # saved (or, storeless, acknowledged), not yet committed

    def acknowledged(self, tasks) -> None:
        """A batch's outputs were acknowledged: without a store, its positions may be committed now."""
        if self.store is None:
            self._to_commit = {tp: o for task in tasks for tp, o in task.positions.items()}
            for task in tasks:
                task.unsaved = 0

    def maybe(self, tasks, stream, final: bool = False) -> None:
        """Checkpoint when due (or ``final``), then commit what the checkpoints hold."""
        if self._due(tasks, final):
            self.checkpoint(tasks)
        self.commit(stream)

    def final(self, tasks, stream, batch_open: bool) -> None:
        """At shutdown: the final checkpoint and commit, unless stopped inside a batch whose outputs were not all
        acknowledged (``batch_open``)."""
        if batch_open:
            # stopped (or failed) inside a batch: the models and positions in
            # memory are ahead of the acknowledged outputs; saving them would
            # lose those outputs, or learn an event twice after a restart
            log.warning("stopped inside a batch whose outputs were not all acknowledged: no final checkpoint; "
                        "the next start learns and publishes it again from the last checkpoint")
        else:
            self.maybe(tasks, stream, final=True)

    def _due(self, tasks, final: bool) -> bool:
        unsaved = sum(task.unsaved for task in tasks)
        if not unsaved or self.store is None:
            return False
        now = time.monotonic()
        s = self.settings
        due = final or unsaved >= s.checkpoint_interval_events or now - self._last_at >= s.checkpoint_interval_seconds
        return due and (final or now >= self._retry_at)

    def checkpoint(self, tasks) -> bool:
        """Save every task with unsaved events; their positions are committed next. False when a save failed."""
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
                if isinstance(exc, KafkaUnavailable):
                    self.health.broker_ok = False
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
        if not to_commit or stream is None:
            return
        # e.g. RebalanceInProgress: keep polling; the next batch commits, or the redelivered events are processed again
        ok, _ = self.retry.once(lambda: stream.commit(to_commit, timeout_s=COMMIT_TIMEOUT_S),
                                f"commit offsets of group {self.settings.group_id}")
        if not ok:
            return
        if self._to_commit is to_commit:  # a revocation during the commit (confluent) may have checkpointed newer positions
            self._to_commit = None
        self.health.broker_ok = True
