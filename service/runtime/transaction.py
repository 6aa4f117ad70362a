"""How a transaction is committed (``--processing-guarantee exactly-once``): the one room for it.

After Quix Streams' ``Checkpoint`` and Kafka Streams' exactly_once_v2, one Kafka
transaction spans the outputs of every batch since the last commit, the state records
that go with them and the consumed positions. Its life, in order:

1. **begin** (:meth:`Transaction.begin`), before a batch's first output: a transaction is
   opened if none is (the loop calls it; the clients' ``begin`` keeps one open across
   batches until the commit);
2. **the span's outputs**: predictions, dead letters, outcomes and mix records are sent by
   the tasks through the stream as at-least-once sends them; the loop's flush waits for
   their acknowledgements, as it does for every batch;
3. **commit** (:meth:`Transaction.commit`), every ``--commit-interval-ms``, on revocation and
   at a clean stop (the checkpointer decides when): each task that changed gives its
   checkpoint record and, with delayed labels, its pending changelog's records (which reach
   the stream through :meth:`Transaction.send_to`); the stream commits them with those
   tasks' positions and the group's metadata (the clients' ``commit_transaction``: the
   group's generation is checked there, so a zombie is fenced). Outputs, state and positions
   become visible together, or not at all;
4. **abort** (:meth:`Transaction.abort`): a stop inside a batch whose outputs were not all
   acknowledged, a state topic lost, or an assignment lost (:meth:`Transaction.evicted`).
   A transactional call of the clients that fails aborts the transaction itself before it
   raises (their primitive: Kafka allows nothing else after such a failure).

A transaction that fails is not retried: the service stops (:meth:`Transaction.lost`),
and its restart restores the last committed checkpoint, which is where the committed
outputs and positions end. Nothing is committed after that (:attr:`Transaction.failed`):
neither the final checkpoint nor a revocation's commit as the consumer closes.

No Kafka client here: the stream supplies ``begin``, ``send``, ``send_to``,
``commit_transaction`` and ``abort`` (:class:`~perceptron_stream.kafka.Stream`).
"""

from __future__ import annotations

import logging
import time

from perceptron_stream.kafka import (
    Aborted,
    Fenced,
    KafkaFatal,
    KafkaUnavailable,
    RecordLimits,
    RecordTooLarge,
    Stream,
    refuse_too_large,
)
from perceptron_stream.runtime.retry import StartupError, fatal
from perceptron_stream.state.kafka_store import CheckpointTooLargeError

log = logging.getLogger("perceptron_stream")

#: A commit gives up after this long (it waits for the transaction and group coordinators).
COMMIT_TIMEOUT_S = 5.0


class Transaction:
    """The open transaction of the loop's stream, from its begin to its commit or abort.

    ``state_lost``: the check that tells whether a state topic was deleted or created again (the
    checkpointer's), asked when a transaction fails, since that fails the transaction writing to
    it before the next periodic check would see it.
    """

    def __init__(self, settings, store, metrics, health, limits: RecordLimits | None = None, state_lost=None):
        self.settings, self.store, self.metrics, self.health = settings, store, metrics, health
        self.limits = limits  # the topics' record limits: a checkpoint record beyond them fails the commit
        self.state_lost = state_lost or (lambda: None)
        self.failed = False  # a transaction failed, or the state it writes is lost: nothing more is committed
        self._stream: Stream | None = None  # the stream of the commit in progress (send_to)
        self._last_at = time.monotonic()

    def due(self) -> bool:
        """``--commit-interval-ms`` passed since the last commit."""
        return time.monotonic() - self._last_at >= self.settings.commit_interval_ms / 1000

    def begin(self, stream) -> None:
        """Before a batch's outputs: a transaction open on ``stream`` (a failure stops the service, as :meth:`lost`)."""
        try:
            stream.begin()
        except (KafkaFatal, KafkaUnavailable) as exc:
            raise self.lost(exc) from None

    def send_to(self, topic: str, partition: int, key: bytes | None, value: bytes) -> None:
        """A state record of the commit in progress (a pending changelog's change) into the transaction."""
        assert self._stream is not None, "send_to is called by a task's before_save, inside commit"
        self._stream.send_to(topic, partition, key, value)

    def commit(self, tasks, stream) -> bool:
        """The checkpoint record of each task with unsaved events sent into the open transaction, which is then
        committed with their positions; the tasks saved. False once a transaction failed; a failure stops the
        service."""
        if self.failed:  # stopping; kafka-python's close calls on_revoked
            return False
        changed = [task for task in tasks if task.unsaved]
        self._last_at = time.monotonic()
        if not changed or stream is None:
            return True
        started = time.perf_counter()
        checkpoints = [(task, task.snapshot()) for task in changed]
        self._stream = stream
        try:
            for task, cp in checkpoints:
                task.before_save(cp, self)  # the pending changelog's records of the span (send_to)
                topic, key, value = self.store.record(cp)
                refuse_too_large(self.limits, topic, key, value)  # it would fail the transaction at its commit
                stream.send(topic, key, value)
            refused = stream.commit_transaction(
                {tp: o for _, cp in checkpoints for tp, o in cp.positions.items()}, timeout_s=COMMIT_TIMEOUT_S
            )
        except CheckpointTooLargeError as exc:
            self.abort(stream)
            raise StartupError(str(exc)) from None
        except RecordTooLarge as exc:  # a checkpoint or changelog record its topic would refuse for good
            self.failed = True
            self.abort(stream)
            raise fatal(exc, "write the span's checkpoint") from None
        except (KafkaFatal, KafkaUnavailable) as exc:  # Fenced, Aborted, or another reason it ended unknown
            raise self.lost(exc) from None
        finally:
            self._stream = None
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

    def lost(self, exc: Exception) -> StartupError:
        """The StartupError that stops the service when a transaction failed (counted as aborted): nothing of it is
        visible, and the restart restores the last committed checkpoint, where the committed outputs end.

        A state topic deleted or created again fails the transaction that writes to it (its checkpoint record is
        not acknowledged) before the next check would see it: the state topics are checked now, and that is what
        the service stops with when one is lost."""
        self.failed = True
        self.metrics.transactions.labels("aborted").inc()
        lost = self.state_lost()
        if lost is not None:
            return lost
        if not isinstance(exc, (Fenced, Aborted, KafkaFatal)):
            log.error("a transaction's commit ended without an answer (%s): it is committed or aborted", exc)
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
        """The group removed this instance (its session expired while it was frozen or cut off, or it overran
        max.poll.interval.ms) and took ``partitions`` away while the transaction holds uncommitted work: another
        member may have restored them from the last commit and published past it.

        Nothing of the open transaction may become visible. Its offsets would be refused (an old member id:
        UNKNOWN_MEMBER_ID), or, were the member id its client reset sent, taken unchecked (Fenced.no_member), so
        no commit is tried: the transaction is aborted at once (not left to hold read_committed readers back
        until it times out) and the StartupError that stops the service is returned, as for a fenced instance
        (Kafka Streams likewise closes lost tasks without a commit)."""
        self.failed = True  # first: nothing is committed after this, whatever the abort meets
        self.abort(stream, count=False)  # counted once, by lost
        return self.lost(Fenced(f"the group removed this instance and took its {len(partitions)} partition(s) away"))

    def abort(self, stream, count: bool = True) -> None:
        """Abort the open transaction, if any (a stop inside a batch, a state topic lost): nothing of it visible."""
        try:
            stream.abort()
        except (KafkaFatal, KafkaUnavailable) as exc:  # the transaction coordinator aborts it after its timeout
            log.warning("could not abort the open transaction (%s)", exc)
        if count:
            self.metrics.transactions.labels("aborted").inc()
