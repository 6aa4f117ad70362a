"""What the consumer group's rebalances do to tasks: assignment → restore and seek, revocation → save and drop.

Kafka is the distributed engine: its consumer group decides which instance
owns which partition; this module only follows. The callbacks run inside
the stream's poll (kafka-python: between batches; librdkafka: inside poll or
commit) and may not block on the consumer, so they record and seek; the loop
does the rest in :meth:`Assignments.settle` (restoring reads the store and the
logs' ranges, which may take a while, with the new partitions paused).

- ``--model-scope group``: the group's one model was restored at start-up;
  an assigned partition is sought to where the model stands. One instance
  runs per model (:class:`OneInstance`).
- ``--model-scope partition``: each assigned partition gets its task,
  restored from the shared store (paused until then); a revoked one is
  checkpointed and dropped, for its next owner to restore. Every instance
  of the group runs one model policy (:class:`OnePolicy`).
"""

from __future__ import annotations

import logging
import time

from perceptron_stream.config import invalid_setting
from perceptron_stream.kafka import BEGINNING, END, GROUP_TIMINGS, Stream, first_offsets
from perceptron_stream.runtime.factory import policy_client_id, policy_of
from perceptron_stream.runtime.retry import StartupError
from perceptron_stream.state.local import StateLockedError

log = logging.getLogger("perceptron_stream")

#: A crashed member leaves the group when its session times out, and the
#: broker needs a few seconds more to notice (measured on both brokers): how long a newcomer
#: waits for the others to leave before it calls them another live instance.
OTHERS_LEAVE_GRACE_S = 6.0
OTHERS_LEAVE_WAIT_S = GROUP_TIMINGS["session_timeout_ms"] / 1000 + OTHERS_LEAVE_GRACE_S


class OneInstance:
    """A newcomer processes nothing while its group has other members: one model, one instance (group scope).

    Checked from the poll loop (a rebalance callback may not block on the
    consumer), on this instance's first assignment and then every second
    while others are there. A member that crashed (SIGKILL, an OOM kill, a
    lost node) stays in the group until its session times out: a restart
    within that time is not a second instance, so the newcomer pauses its
    partitions and waits that long for the others to leave before it
    concludes that another instance runs, and stops.
    """

    def __init__(self, settings, retry, health):
        self.settings, self.retry, self.health = settings, retry, health
        self.passed = settings.state_store == "none"  # no state to fork
        self.to_check = False  # an assignment came: check before its first record is processed
        self._others_gone_by: float | None = None  # waiting for other members to leave until then (monotonic)
        self._next_check = 0.0

    def due(self) -> bool:
        return self.to_check or (self._others_gone_by is not None and time.monotonic() >= self._next_check)

    def check(self, stream) -> None:
        self.to_check = False
        if self.passed:
            return
        s = self.settings
        # Retried until it answers (a service that cannot tell must not run beside another one)
        members = self.retry.until_it_works(
            stream.group_members, f"check that consumer group {s.group_id} has no other member"
        )
        if members is None:  # stopped meanwhile
            return
        now = time.monotonic()
        others = self.others(members)
        if not others:
            if self._others_gone_by is not None:
                log.info("the other member(s) of consumer group %s left: going on", s.group_id)
                stream.resume()
            self.passed, self._others_gone_by = True, None
            return
        stream.pause()  # after every assignment: a rebalance unpauses
        if self._others_gone_by is None:
            self._others_gone_by = now + OTHERS_LEAVE_WAIT_S
            log.warning(
                "consumer group %s has %d other member(s)%s: processing nothing until they leave (a crashed "
                "instance's session expires within %.0f s)",
                s.group_id,
                len(others),
                self.whose,
                OTHERS_LEAVE_WAIT_S,
            )
        elif now >= self._others_gone_by:
            raise self.refusal(others)
        self._next_check = now + 1.0

    whose = ""  # what makes the others' presence a problem, said in the warning

    def others(self, members: dict[str, str]) -> list[str]:
        """The client ids of the members that keep this one from processing: in group scope, any other."""
        return list(members.values())[1:]

    def refusal(self, others: list[str]) -> Exception:
        s = self.settings
        return StartupError(
            f"consumer group {s.group_id} still has {len(others)} other active member(s) after "
            f"{OTHERS_LEAVE_WAIT_S:.0f} s: another instance runs this "
            f"model (its checkpoints are in the {s.state_store} store); one instance runs per model in "
            "--model-scope group: stop the other one, give this one another --group-id and state, or run every "
            "instance with --model-scope partition"
        )


class OnePolicy(OneInstance):
    """Partition scope: a newcomer processes nothing while a member of its group runs another model policy.

    Each instance says its policy in its client id (the settings its model
    depends on and whether it signs: :func:`~perceptron_stream.runtime.factory.policy_client_id`),
    which DescribeGroups shows every member. Two instances of one group that
    mix or hand partitions to each other must run one model: an instance whose
    settings differ from a live member's waits, as :class:`OneInstance` does,
    for a crashed one's session to end, then refuses to start naming the
    settings (exit 2) before it processed, and so wrote, anything. Of two started
    together with other settings the first whose wait ends refuses, and the
    other, alone then, goes on (both refuse if their waits end together).
    A member whose client id says no policy (another program, an older version)
    is not judged.
    """

    whose = " with other model settings"

    def __init__(self, settings, retry, health, policy: str):
        super().__init__(settings, retry, health)
        self.passed, self.policy = False, policy_of(policy) or {}

    def others(self, members: dict[str, str]) -> list[str]:
        return [c for c in members.values() if (p := policy_of(c)) is not None and p != self.policy]

    def refusal(self, others: list[str]) -> Exception:
        theirs = policy_of(others[0]) or {}
        differ = [k for k in sorted(set(theirs) | set(self.policy)) if theirs.get(k) != self.policy.get(k)]
        said = ", ".join(
            f"{'checkpoint_key' if k == 'key' else k} is {theirs.get(k)!r} there, {self.policy.get(k)!r} here"
            for k in differ
        )
        return invalid_setting(
            "checkpoint_key" if differ == ["key"] else differ[0],
            f"consumer group {self.settings.group_id} has {len(others)} member(s) running another model ({said}) "
            f"after {OTHERS_LEAVE_WAIT_S:.0f} s: every instance of a group runs one model: start this one with "
            "the group's settings, or give it another --group-id",
        )


class Assignments:
    """The rebalance callbacks, and the loop's follow-up (:meth:`settle`)."""

    def __init__(self, settings, tasks, make_task, restorer, checkpointer, store, health, metrics, lag, retry):
        self.settings, self.tasks, self.make_task = settings, tasks, make_task
        self.restorer, self.checkpointer, self.store = restorer, checkpointer, store
        self.health, self.metrics, self.lag = health, metrics, lag
        self.per_partition = settings.model_scope == "partition"
        self.guard = (
            OnePolicy(settings, retry, health, policy_client_id(settings))
            if self.per_partition
            else OneInstance(settings, retry, health)
        )
        self.stream: Stream | None = None  # set once it is open
        self.batch_open = False  # the loop is inside a batch whose outputs are not all acknowledged
        self.waiting: dict[int, list[tuple[str, int]]] = {}  # partition scope: assigned, paused, to restore
        self.assigned: set[tuple[str, int]] = set()  # the consumer's whole assignment, as _ready last read it
        self._locked_warned: set[int] = set()
        # what readiness was last read for (_ready): partitions moved since, or (waiting, may process) then
        self._moved, self._ready_for = True, (False, False)

    @property
    def _stream(self) -> Stream:
        """The open stream: the callbacks run inside its poll, and the loop calls the rest once start-up opened it."""
        if self.stream is None:
            raise RuntimeError("the stream is not open yet")
        return self.stream

    # callbacks ------------------------------------------------------------
    def on_assigned(self, partitions: list[tuple[str, int]]) -> None:
        log.info("assigned %s", _named(partitions))
        if self.per_partition:
            for tp in partitions:
                if self.tasks.for_partition(tp[1]) is None:
                    self.waiting.setdefault(tp[1], []).append(tp)
            self._stream.pause([tp for tps in self.waiting.values() for tp in tps])
            self.guard.to_check = not self.guard.passed
        else:
            task = self.tasks.group
            # The model in memory is the newest state (revocation checkpoints first);
            # seek every partition it has learned from to where it stands, whatever the
            # committed offsets say.
            for tp in partitions:
                self._seek(task, tp)
            self.guard.to_check = True
        self.lag.soon()
        self._ready()
        self._moved = True  # and again at the next settle: an incremental assignment is applied after this callback

    def on_revoked(self, partitions: list[tuple[str, int]]) -> None:
        log.info("revoked %s", _named(partitions))
        if self.per_partition:
            gone = sorted({p for _, p in partitions})
            for p in gone:
                self.waiting.pop(p, None)
            tasks = [t for t in (self.tasks.for_partition(p) for p in gone) if t is not None]
            if self.stream is not None and not self.batch_open:
                # committed by the loop; the next owner restores from it. Exactly-once: the open transaction is
                # committed here, with every task whose outputs it holds (KIP-848 revokes only some: a kept task's
                # outputs must not become visible without its positions)
                self.checkpointer.checkpoint(self.tasks.all() if self.checkpointer.transaction else tasks, self.stream)
            for task in tasks:
                self.tasks.drop(task.partition)
                if task.joiner is not None:
                    task.joiner.close()  # its pending tables go with the partition (its next owner opens them)
                if self.store is not None:
                    self.store.unlock(task.name)
                self.metrics.forget_replica(task.partition)
        elif self.stream is not None and self.guard.passed and not self.batch_open:
            self.checkpointer.checkpoint(self.tasks.all(), self.stream)  # committed by the loop once the group is
            # stable again (exactly-once: with the transaction, here)
        self.metrics.forget_partitions(partitions)
        self.health.assigned = False  # until the loop's next settle() looks at what is left (KIP-848 takes only some)
        self._moved = True

    def on_lost(self, partitions: list[tuple[str, int]]) -> None:
        """The group removed this instance and took its partitions away: under exactly-once, with uncommitted
        work, the open transaction is aborted and the instance stops (:meth:`Transaction.evicted
        <perceptron_stream.runtime.transaction.Transaction.evicted>` says why). With nothing uncommitted, and at
        least once: as a revocation (a commit of the old generation is refused; a replay repeats outputs). Once a
        transaction failed, nothing (kafka-python calls this as it closes a consumer whose generation is gone)."""
        transaction = self.checkpointer.transaction
        if transaction is not None and transaction.failed:
            return
        if transaction is None or not any(task.unsaved for task in self.tasks.all()):
            self.on_revoked(partitions)
            return
        log.info("lost %s", _named(partitions))
        raise transaction.evicted(self._stream, partitions)

    # the loop -------------------------------------------------------------
    def settle(self) -> None:
        """Before a record is processed: the one-instance (group scope) or one-policy (partition scope) check,
        restores (partition scope)."""
        if self.guard.due():
            self.guard.check(self.stream)
        if self.waiting:
            self._restore_waiting()
        if self._moved or self._ready_for != (bool(self.waiting), self.may_process()):
            self._ready()  # not every turn: confluent-kafka's assignment() is a round trip to librdkafka's main
            # thread, about 0.6 ms (the loop's wait, once a batch: 5% of a turn at 80,000 events/s)

    def may_process(self) -> bool:
        """False while the one-instance or one-policy check has not passed (its records are put back)."""
        return self.guard.passed

    def put_back(self, records) -> None:
        """Seek each partition back to the first of ``records``: they are read again once they may be processed."""
        for (topic, partition), offset in first_offsets((r.topic, r.partition, r.offset) for r in records).items():
            self._stream.seek(topic, partition, offset)

    def _restore_waiting(self) -> None:
        """The waiting partitions' tasks restored together (one read of the store for them all), then resumed; one
        whose state its previous owner still holds (the local store's lock) waits for the next turn."""
        tasks = []
        for partition in sorted(self.waiting):
            task = self.make_task(partition)
            if self.store is not None:
                try:
                    self.store.lock(task.name)
                except StateLockedError as exc:  # the previous owner is still saving it: try again at the next turn
                    if partition not in self._locked_warned:
                        log.warning("%s; waiting for it", exc)
                        self._locked_warned.add(partition)
                    continue
                self._locked_warned.discard(partition)
            tasks.append(task)
        if self.store is not None and tasks:
            self.restorer.restore_all(tasks)
        for task in tasks:
            tps = self.waiting.pop(task.partition)
            for tp in tps:
                self._seek(task, tp)
            self.tasks.add(task)
            self._stream.resume(tps)
            self.metrics.set_model(task.learner.weight_norm, task.learner.radius, task.partition)

    def _seek(self, task, tp: tuple[str, int]) -> None:
        if tp in task.positions:
            self._stream.seek(tp[0], tp[1], task.positions[tp])
        elif self.settings.state_store != "none":
            # The model has learned nothing from it; committed offsets are only ever a
            # checkpoint's, so any here belong to a checkpoint that could not be used:
            # start where a new model would.
            self._stream.seek(tp[0], tp[1], BEGINNING if self.settings.auto_offset_reset == "earliest" else END)

    def _ready(self) -> None:
        """Readiness and the assigned-partitions gauge from the consumer's whole assignment (the callbacks get
        only what moved)."""
        self._moved, self._ready_for = False, (bool(self.waiting), self.may_process())
        assignment = self.stream.assignment() if self.stream is not None else []
        self.assigned = set(assignment)
        self.metrics.set_assigned(len({p for _, p in assignment}))
        assigned = bool(assignment)
        self.health.assigned = assigned and not self.waiting and self.may_process()
        self.health.restored = not self.waiting


def _named(partitions: list[tuple[str, int]]) -> str:
    """``topic[partition]``, comma-separated, for the log.

    >>> _named([("points", 0), ("labels", 0)]), _named([])
    ('points[0], labels[0]', 'nothing')
    """
    return ", ".join(f"{t}[{p}]" for t, p in partitions) or "nothing"
