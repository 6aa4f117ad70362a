"""How are one task's points and labels kept, held and joined? Its pending tables, by input partition, and the join.

A point with an ``id`` and no ``y`` is kept (:meth:`Joiner.keep`) in its
partition's pending table (:mod:`perceptron_stream.state.pending`); a label takes its
point and is joined (:mod:`perceptron_stream.pipeline.labels.join`), or waits for it as
an *early* row until the partition's points' stream time (the grace clock,
:meth:`Joiner.stream_time`) passes it by the grace period, or is a dead
letter. The tables are checkpointed and restored with the task
(:meth:`Joiner.before_save`, :meth:`Joiner.restore`; with the Kafka store
through :mod:`perceptron_stream.state.changelog`).

**What time is believed.** Both clocks are stream time, made of the records'
timestamps (the producers' CreateTime): the grace clock is the points'
(:meth:`Joiner.stream_time`), the TTL's is the points' and the labels' alike
(:meth:`Joiner.ttl_time`; a batch of labels expires points against its
oldest label, so a batch spanning days does not expire a point before its
own label in it is joined: :meth:`Joiner.read`), so a backfill of old
history is joined as it was when live, its points expiring once the stream
has gone the TTL past them, not at once against today's date. A timestamp
is a claim of its producer, so each is bounded before a clock believes it (``max_clock_skew``,
``--max-clock-skew-seconds``; :meth:`Joiner.believed`):

- *ahead*: no record is believed later than the wall clock plus the skew
  when it is read. One point stamped in 2100 would move the grace clock past
  every waiting label's grace (all dead-lettered ``unknown_id`` though their
  points came a moment later), and a label stamped in 2100 would wait, and
  hold its partition's room, for good;
- *behind*, for a label: no earlier than the skew behind the clock it is
  measured on (the wall clock before any point was read). A label stamped
  in 1970 would otherwise be past its grace as it comes, and its labeled
  mark past the TTL, so a second copy would be ``unknown_id``, not a
  ``duplicate``. A point's time behind is believed: it is history, and it
  only lets its own row expire sooner.

Clamped, not dead-lettered: the record is a valid point or label, and only
the moment it claims is doubtful; the bound removes that claim's power over
the clocks, and the event still counts (a point is predicted, a label
joined).
"""

from __future__ import annotations

import base64
import logging
import math
import time
import uuid
from typing import Any

from perceptron_stream.pipeline.labels.join import Join
from perceptron_stream.pipeline.labels.span import SpanLabels
from perceptron_stream.state.checkpoint import CheckpointError
from perceptron_stream.state.pending import PendingTable
from perceptron_stream.wire.inputs import decode_labels
from perceptron_stream.wire.messages import Label, Rejection

log = logging.getLogger("perceptron_stream")


def _duplicate(label: Label) -> Rejection:
    return Rejection(
        "duplicate",
        f"the point with id {label.id!r} was labeled already (or a label for it waits for it): a label is learned once",
    )


class Joiner:
    """One task's pending points and early labels, by input partition, and the join of the two."""

    def __init__(
        self,
        open_table,
        *,
        ttl_seconds: float,
        max_pending: int,
        outcome_topic: str,
        dlq_topic: str,
        max_message_bytes: int,
        changelog=None,
        label_topic: str = "labels",
        grace_seconds: float = 300.0,
        max_early: int = 100_000,
        max_clock_skew: float = math.inf,
        wall=None,
    ):
        self.open_table, self.ttl_seconds, self.max_pending = open_table, ttl_seconds, max_pending
        self.label_topic = label_topic  # the label_source of a label joined when its point came
        self.grace_seconds, self.max_early = grace_seconds, max_early
        self.max_message_bytes = max_message_bytes
        self.join = Join(outcome_topic, dlq_topic, max_message_bytes)  # the outcomes and dead letters it publishes
        self.changelog = changelog  # the Kafka store's (Changelog); None: the tables are on a disk the store keeps
        self.tables: dict[int, PendingTable] = {}
        self.run = uuid.uuid4().hex[:16]  # this run's tag on the changes it writes
        self.lineage: list[list] = [[1, self.run]]  # [first epoch, run]: whose changes count, epoch by epoch
        self.max_clock_skew = max_clock_skew  # the bound on timestamps (s)
        self.wall = wall  # the wall clock it is from (s; None: time.time, looked up at each use)
        self.point_time: dict[int, int] = {}  # partition → the latest point timestamp processed (ms)
        self.label_time: dict[int, int] = {}  # partition → the latest label timestamp processed (ms), believed
        self.all_read_at: dict[int, int] = {}  # partition → a time (ms) by which every point written was read
        self.epoch = 1  # the next checkpoint's seq: the epoch of the changes made now
        self.refused: list = []  # (record, why) of points too large to keep, for the task to dead-letter

    def table(self, partition: int, restoring: bool = False) -> PendingTable:
        """The partition's table; one the task's checkpoint does not cover starts empty (whatever a file held)."""
        table = self.tables.get(partition)
        if table is None:
            table = self.tables[partition] = self.open_table(partition)
            if not restoring:
                table.load({}, self.epoch)
        return table

    def pending(self) -> int:
        return sum(t.pending_count() for t in self.tables.values())

    def early(self) -> int:
        """Labels waiting for their point."""
        return sum(t.early_count() for t in self.tables.values())

    def waiting(self) -> list[int]:
        """The partitions with labels waiting for their point."""
        return [p for p, t in self.tables.items() if t.early_count()]

    def span(self, send, tally, replica: dict | None, models=None) -> SpanLabels:
        """The hook a task's batch calls (:class:`~perceptron_stream.pipeline.labels.span.SpanLabels`): its points
        and labels, sent through ``send`` and counted in ``tally``."""
        return SpanLabels(self, send, tally, replica, models)

    # points and labels ----------------------------------------------------
    def keep(
        self,
        r,
        event_id,
        x,
        y_pred: int,
        score: float,
        version: int,
        challengers: dict | None = None,
        latest: float | None = None,
    ) -> tuple[dict, dict] | None:
        """A point predicted and published without its label: kept until the label comes (with the challengers'
        scores of it, which their own mistakes are scored by, as the published ``score`` is the champion's: y·score
        ≤ 0). Returns ``(point, label)`` when its label came first and waited (:meth:`join_early` joins them once
        the prediction is sent), else None. ``latest``: the latest time (ms) a point of its batch is believed to
        have, :meth:`label_bounds` of the wall clock as the batch was read, taken once a batch (None: read now);
        a point has no earlier bound (its time behind is believed: see the module)."""
        if latest is None:
            latest = self.label_bounds(self.wall_ms(), None)[0]
        point = {
            "x": x,
            "y_pred": y_pred,
            "score": score,
            "version": version,
            "source": {"topic": r.topic, "partition": r.partition, "offset": r.offset},
            "at": min(r.timestamp, latest) / 1000,  # believed(): min(t, latest), the earliest bound -inf
        }
        if challengers:
            point["challengers"] = challengers
        table = self.table(r.partition)
        # the stored point is about the input's size (a dense x's "1" becomes "1.0"); one its waiting label joins
        # at once is not stored
        why = None
        if self.changelog is not None:
            why = self.changelog.too_large(r.partition, event_id, point, len(r.value) * 4 + 1024, "pending point")
        if why is not None and table.waiting(event_id) is None:  # its change could never be written, nor then any
            self.refused.append((r, why))  # checkpoint of the task
            return None
        label = table.add(event_id, point, now=point["at"])
        return None if label is None else (point, label)

    def labels_waiting(self, partition: int, ids: list, ys: list) -> list[tuple[int, int]]:
        """(index, label's y) of the points among a batch's events (``ids``, labels ``ys``) whose label waits now:
        :meth:`keep` will join them (the first point of each id: a second one finds its label taken). The task's
        batch form learns their joins in the same pass as the points (``step_many(..., joins=)``)."""
        table = self.tables.get(partition)
        if table is None or not table.early_count():
            return []
        out, taken = [], set()
        for i, (point_id, y) in enumerate(zip(ids, ys)):
            if y is None and point_id not in taken:
                label = table.waiting(point_id)
                if label is not None:
                    out.append((i, label["y"]))
                    taken.add(point_id)
        return out

    def saw_point(self, partition: int, timestamp: int) -> None:
        """A batch of points of ``partition`` processed, its last stamped ``timestamp`` (ms): the clocks move there,
        no further than the wall clock allows (:meth:`believed`)."""
        timestamp = self.believed(timestamp)
        if timestamp > self.point_time.get(partition, -1):
            self.point_time[partition] = timestamp

    def wall_ms(self) -> float | None:
        """The wall clock now (ms), for a batch's records read together to be believed against one reading (a
        reading per record, four a decision, was a tenth of a decision's own work: bench/README.md, "Delayed labels
        at the speed of plain events"); None when no bound applies (no clock is read)."""
        if self.max_clock_skew == math.inf:
            return None
        return self._clock_ms()

    def _clock_ms(self) -> float:
        """The wall clock (ms): the test's, or the machine's."""
        return (time.time() if self.wall is None else self.wall()) * 1000

    def believed(self, timestamp: int, clock: int | None = None, now_ms: float | None = None) -> int:
        """The time (ms) a record stamped ``timestamp`` is taken to have: no later than the wall clock plus
        ``max_clock_skew``, and, given the ``clock`` (ms) it is measured on (negative: none yet, the wall clock's
        then), no earlier than that less the skew (see the module's docstring). ``now_ms``: the wall clock as the
        record's batch was read (:meth:`wall_ms`; None: read now)."""
        if self.max_clock_skew == math.inf:
            return timestamp
        latest, earliest = self.label_bounds(self._clock_ms() if now_ms is None else now_ms, clock)
        return int(max(min(timestamp, latest), earliest))

    def read_to(self, partition: int, moment_ms: int) -> None:
        """Every point of ``partition`` written before ``moment_ms`` has been read (the input's end was reached by
        a fetch made after it): the grace clock may move there though no point came
        (:meth:`~perceptron_stream.pipeline.labels.gate.LabelGate.before`)."""
        if moment_ms > self.all_read_at.get(partition, -1):
            self.all_read_at[partition] = moment_ms

    def stream_time(self, partition: int) -> int:
        """The points' stream time of ``partition`` (ms): the latest point read, or a moment by which all were. The
        grace clock: a point sent before a label is read once this passes the label's time by the grace period."""
        return max(self.point_time.get(partition, -1), self.all_read_at.get(partition, -1))

    def ttl_time(self, partition: int) -> int:
        """The TTL's clock of ``partition`` (ms; negative: no record read yet): the latest point or label read,
        each as believed. Stream time, as the grace clock is, so a backfill of old history keeps its points as a
        live stream did; not moved by the input read to its end (wall time: that would expire a backfill's
        points before their labels, read next, could join them)."""
        return max(self.point_time.get(partition, -1), self.label_time.get(partition, -1))

    def read(self, records, tally=None) -> list[Label | Rejection]:
        """A batch of label records (one partition's) decoded, the TTL's clock moved to the oldest of them and the
        points past it expired (counted in ``tally``), then the pending rows of their ids read at once
        (:meth:`PendingTable.read_ahead`): each :meth:`label` then reads nothing. The clock moves on to the newest
        of them only then: a backfill's batch can span days of stream time, and a label within the TTL of its
        point must not lose it to a later label of the same batch (the batch's later labels may, in turn, find a
        point they would have found expired alone: leniency bounded by the batch's span)."""
        partition, now_ms = records[0].partition, self.wall_ms()
        stamps = [r.timestamp for r in records]  # each believed no later than the wall clock allows (believed())
        oldest, newest = self.believed(min(stamps), now_ms=now_ms), self.believed(max(stamps), now_ms=now_ms)
        if oldest > self.label_time.get(partition, -1):
            self.label_time[partition] = oldest
        if tally is not None:
            self._expire(partition, self.table(partition), tally)
        if newest > self.label_time.get(partition, -1):
            self.label_time[partition] = newest
        labels = decode_labels([r.value for r in records], [r.key for r in records], self.max_message_bytes)
        self.table(partition).read_ahead([label.id for label in labels if not isinstance(label, Rejection)])
        return labels

    def _label_at(self, r, now_ms: float | None = None, clock: int | None = None) -> tuple[float, float]:
        """When label ``r`` is taken to have come (s): for its delay, as stamped but no later than the wall clock
        allows; for its labeled mark, also no earlier than the skew behind the TTL's clock (:meth:`believed`: a
        mark back-dated past the TTL would be gone at once, and a second copy of the label ``unknown_id``).
        ``now_ms``, ``clock``: the wall clock as its batch was read and the TTL's clock (None: read now)."""
        if now_ms is None:
            now_ms = self.wall_ms()
        latest, earliest = self.label_bounds(now_ms, self.ttl_time(r.partition) if clock is None else clock)
        at = min(r.timestamp, latest)
        return at / 1000, max(at, earliest) / 1000

    def label_bounds(self, now_ms: float | None, clock: int | None) -> tuple[float, float]:
        """(latest, earliest) time (ms) a record read at ``now_ms`` (:meth:`wall_ms`) is believed to have, measured on
        ``clock`` (the TTL's, for a label's mark; None: no earlier bound): one stamped ``t`` has ``max(min(t, latest),
        earliest)`` (±inf: no bound). The one home of the skew's rule (:meth:`believed`, :meth:`_label_at`); a
        label batch takes its bounds once, two comparisons a label where two :meth:`believed` calls were (their
        calls and clock reads were a tenth of a decision's book-keeping: bench/README.md, "Delayed labels at the
        speed of plain events")."""
        if now_ms is None or self.max_clock_skew == math.inf:  # no bound applies (wall_ms() is None then)
            return math.inf, -math.inf
        skew_ms = self.max_clock_skew * 1000
        earliest = -math.inf if clock is None else int((clock if clock >= 0 else now_ms) - skew_ms)
        return int(now_ms + skew_ms), earliest

    def label(self, r, label: Label | Rejection, learner, send, tally, replica: dict | None, models=None) -> None:
        """A label record: joined (learn, count the decision, publish the outcome), kept until its point comes
        (early), or a dead letter."""
        if isinstance(label, Rejection):
            return self.join.dead_letter(r.value, r.key, r.topic, r.partition, r.offset, label, send, tally)
        table = self.table(r.partition)
        at, mark = self._label_at(r)
        got = table.take(label.id, now=mark)
        if got is None:  # its point has not come (or is gone): the label waits for it, up to the grace period
            evicted, refusal = self._wait(table, r, label)
            if refusal is not None:
                return self.join.dead_letter(None, None, r.topic, r.partition, r.offset, refusal, send, tally)
            for old, why in evicted:
                self._let_go(old, why, send, tally, r.partition)
            tally.label_outcomes.append("early")
            return
        if isinstance(got, str):  # "duplicate"
            tally.label_outcomes.append("duplicate")
            return self.join.dead_letter(r.value, r.key, r.topic, r.partition, r.offset, _duplicate(label), send, tally)
        self.join.joined(
            label.id,
            label.y,
            got,
            r.key,
            r.topic,
            r.partition,
            r.offset,
            at,
            learner,
            send,
            tally,
            replica,
            models,
        )

    def label_many(self, records, labels: list, learner, send, tally, replica: dict | None, models=None) -> None:
        """:meth:`label` of each label of a batch, in order, with the joined ones learned together.

        Each label's step through the tables comes first (take, hold, or a dead letter: nothing there depends on
        the model), then the joins' learning by ``relabel_many`` (:meth:`Join.learn_many`: the same as one relabel
        after another), then what each label sends and counts, in the labels' order, as :meth:`label` does.
        """
        actions: list[tuple] = []
        joins: list[tuple] = []
        now_ms = self.wall_ms()  # the batch's records believed against one reading of the wall clock
        # partition → its table and bounds (label_bounds: the TTL's clock, which nothing a label does here moves)
        partitions: dict[int, tuple[PendingTable, float, float]] = {}
        for r, label in zip(records, labels):
            if type(label) is Rejection:
                actions.append(("letter", r, label))
                continue
            partition = r.partition
            known = partitions.get(partition)
            if known is None:
                table = self.tables.get(partition) or self.table(partition)
                known = partitions[partition] = (table, *self.label_bounds(now_ms, self.ttl_time(partition)))
            table, latest, earliest = known
            at_ms = min(r.timestamp, latest)  # as _label_at: (at, mark) in ms
            got = table.take(label.id, now=max(at_ms, earliest) / 1000)
            at = at_ms / 1000
            if got is None:
                evicted, refusal = self._wait(table, r, label, now_ms)
                if refusal is not None:
                    actions.append(("refused", r, refusal))
                    continue
                actions.extend(("let go", old, why, r.partition) for old, why in evicted)
                actions.append(("count", "early"))
            elif got == "duplicate":
                actions.append(("count", "duplicate"))
                actions.append(("letter", r, _duplicate(label)))
            else:
                actions.append(("join", r, label, got, at))
                joins.append((got, label.y))
        learned = iter(self.join.learn_many([p for p, _ in joins], [y for _, y in joins], learner, models))
        join = self.join
        for kind, *what in actions:
            if kind == "join":  # the most of them first
                r, label, point, at = what
                counters, theirs, mistake = next(learned)
                join.publish(
                    label.id,
                    label.y,
                    point,
                    r.key,
                    r.topic,
                    r.partition,
                    r.offset,
                    at,
                    counters,
                    theirs,
                    send,
                    tally,
                    replica,
                    mistake=mistake,
                )
            elif kind == "letter":
                r, rejection = what
                join.dead_letter(r.value, r.key, r.topic, r.partition, r.offset, rejection, send, tally)
            elif kind == "refused":
                r, rejection = what
                join.dead_letter(None, None, r.topic, r.partition, r.offset, rejection, send, tally)
            elif kind == "count":
                tally.label_outcomes.append(what[0])
            else:  # "let go"
                old, why, partition = what
                self._let_go(old, why, send, tally, partition)

    def _wait(
        self, table: PendingTable, r, label: Label, now_ms: float | None = None
    ) -> tuple[list[tuple[dict, str]], Rejection | None]:
        """Hold ``label`` (record ``r``) until its point comes; the oldest early labels it pushes beyond
        --max-early-labels, with why, to be let go (:meth:`_let_go`). Or, when its row would make a changelog
        record beyond the pending topic's ``max.message.bytes`` (a large key or id; its change could never be
        written, nor then any checkpoint of the task, and a restart would read the label again), it is not held:
        the ``output_refused`` rejection to dead-letter it with, as a point too large to keep is (:meth:`keep`;
        no key, no raw, as every ``output_refused`` letter: the label is at its source)."""
        row = {
            "id": label.id,
            "y": label.y,
            "offset": r.offset,
            "at": self.believed(r.timestamp, now_ms=now_ms) / 1000,  # its time, for its delay
            "key": None if r.key is None else base64.b64encode(r.key).decode(),
            "value": r.value.decode(),
        }
        # the row is about the record's size (its key in base64, its value escaped again)
        estimate = len(r.value) * 6 + len(r.key or b"") * 2 + len(str(label.id)) * 6 + 1024
        why = (
            None
            if self.changelog is None
            else self.changelog.too_large(r.partition, label.id, row, estimate, "early label")
        )
        if why is not None:
            error = f"this label came before its point and cannot wait for it: {why}; it will not be joined"
            log.error("%s (label at %s[%d] offset %d)", error, r.topic, r.partition, r.offset)
            return [], Rejection("output_refused", error)
        evicted = []
        if table.early_count() >= self.max_early:
            why = (
                f"more than --max-early-labels {self.max_early:,} labels waited for their point "
                "in this partition: the oldest goes"
            )
            evicted = [(old, why) for old in table.pop_early(most=table.early_count() - self.max_early + 1)]
        at = (
            self.believed(r.timestamp, self.stream_time(r.partition), now_ms) / 1000
        )  # its grace from the grace clock's
        table.hold(label.id, row, at=at)
        return evicted, None

    def join_early(self, r, point: dict, label: dict, learner, send, tally, replica: dict | None, models=None) -> None:
        """A point whose label came first (``keep`` returned them), its prediction sent: joined now."""
        self.join.joined(*self._early_join(r, point, label), learner, send, tally, replica, models)

    def publish_early(self, r, point: dict, label: dict, counters, theirs: dict, send, tally, replica) -> None:
        """:meth:`join_early` of a join learned already (the task's batch form learned it with its point's step):
        ``counters`` the model's (updates, seen, mistakes) after it, ``theirs`` the challengers' mistakes on it,
        both counted in ``tally.flags`` already."""
        self.join.publish(*self._early_join(r, point, label), counters, theirs, send, tally, replica, counted=True)

    def _early_join(self, r, point: dict, label: dict) -> tuple[Any, int, dict, bytes | None, str, int, int, float]:
        """What a join of point ``r`` with its early ``label`` is: (id, y, point, the label's key, topic,
        partition, offset, time), as :class:`Join` takes them."""
        key = None if label["key"] is None else base64.b64decode(label["key"])
        return label["id"], label["y"], point, key, self.label_topic, r.partition, label["offset"], label["at"]

    def expire_early(self, send, tally) -> int:
        """Labels still alone once their partition's points' stream time passed their time by the grace period:
        dead letters ``unknown_id`` (their point was never sent, or came long before: expired, evicted). How many."""
        count = 0
        for partition, table in self.tables.items():
            at = table.next_early()
            if at is None:
                continue
            cutoff = self.stream_time(partition) / 1000 - self.grace_seconds
            if at <= cutoff:
                for label in table.pop_early(cutoff):
                    self._let_go(
                        label,
                        f"no point came within --label-grace-seconds {self.grace_seconds:g} of stream time after it",
                        send,
                        tally,
                        partition,
                    )
                    count += 1
        return count

    def early_due(self) -> bool:
        """Whether :meth:`expire_early` has a label to let go."""
        return any(
            (at := t.next_early()) is not None and at <= self.stream_time(p) / 1000 - self.grace_seconds
            for p, t in self.tables.items()
        )

    def _let_go(self, label: dict, why: str, send, tally, partition: int) -> None:
        """An early label that will not be joined: dead-lettered ``unknown_id``, as a label whose point is unknown."""
        error = (
            f"no pending point has id {label['id']!r} in partition {partition} ({why}; or its point expired after "
            f"{self.ttl_seconds:g} s of stream time, or was evicted beyond {self.max_pending:,} pending): send the "
            "label with its point's key"
        )
        tally.label_outcomes.append("unknown_id")
        key = None if label["key"] is None else base64.b64decode(label["key"])
        self.join.dead_letter(
            label["value"].encode(),
            key,
            self.label_topic,
            partition,
            label["offset"],
            Rejection("unknown_id", error),
            send,
            tally,
        )

    def expire(self, tally) -> None:
        """Points (and labeled marks) the TTL's clock of their partition (:meth:`ttl_time`) passed by the TTL: gone,
        the pending ones counted ``expired``."""
        for partition, table in self.tables.items():
            self._expire(partition, table, tally)

    def _expire(self, partition: int, table: PendingTable, tally) -> None:
        clock = self.ttl_time(partition)
        if clock < 0:  # no record read since the start or the restore: no time to measure by
            return
        expired = table.expire(clock / 1000)
        if expired:
            tally.label_outcomes.extend(["expired"] * expired)

    def commit(self, tally) -> None:
        """The batch's changes durable (still undone by a restore of an older checkpoint); evictions counted."""
        for table in self.tables.values():
            table.commit()
            if table.evicted:
                tally.label_outcomes.extend(["evicted"] * table.evicted)
                table.evicted = 0

    # checkpoints ----------------------------------------------------------
    def before_save(self, seq: int, into=None) -> None:
        """Before checkpoint ``seq`` is saved: every table's changes written and committed (the points the open
        epoch keeps in memory too: a crash after the save must find them on disk); with the Kafka store, the
        epoch's changes to the changelog, acknowledged, or (``into``: exactly-once) sent into the open transaction
        that commits the checkpoint."""
        for table in self.tables.values():
            table.flush()
            table.commit()
        if self.changelog is not None:
            for partition, table in sorted(self.tables.items()):
                self.changelog.write(partition, table.changed(), seq, self.run, into=into)
            if into is None:
                self.changelog.flush()

    def fresh(self, seq: int) -> None:
        """No checkpoint restored (a new model, or started over from ``seq``): the changes made now are epoch seq + 1's."""
        self.epoch = seq + 1

    def to_state(self) -> dict:
        return {
            "lineage": self.lineage,
            "pending": {str(p): t.pending_count() for p, t in sorted(self.tables.items())},
            "early": {str(p): t.early_count() for p, t in sorted(self.tables.items())},
        }

    def saved(self, seq: int) -> None:
        self.epoch = seq + 1
        for table in self.tables.values():
            table.checkpoint(seq)

    def restore(self, seq: int, state: dict, partitions: list[int]) -> None:
        """The tables as they were at checkpoint ``seq`` (``state``: its ``to_state()``), for ``partitions``."""
        lineage = state.get("lineage", []) if isinstance(state, dict) else []
        if not (
            isinstance(lineage, list)
            and all(isinstance(e, list) and len(e) == 2 and type(e[0]) is int and type(e[1]) is str for e in lineage)
        ):
            raise CheckpointError("the checkpoint's pending-table lineage is malformed")
        self.lineage = [*lineage, [seq + 1, self.run]]
        self.epoch = seq + 1
        counts = state.get("pending", {}) if isinstance(state, dict) else {}
        for partition in partitions:
            # read again from the checkpoint's positions: what was read counts no more
            self.point_time.pop(partition, None)
            self.label_time.pop(partition, None)
            self.all_read_at.pop(partition, None)
            table = self.table(partition, restoring=True)
            if self.changelog is not None:
                self.changelog.restore(partition, table, seq, self.lineage)
            else:
                table.rollback_to(seq)
            want = counts.get(str(partition)) if isinstance(counts, dict) else None
            if want is not None and want != table.pending_count():
                raise CheckpointError(
                    f"the pending table of partition {partition} holds {table.pending_count()} points, "
                    f"checkpoint {seq} says {want}: it is not that checkpoint's (restore the state whole)"
                )
            early = state.get("early", {}) if isinstance(state, dict) else {}  # none in a checkpoint from before them
            want = early.get(str(partition)) if isinstance(early, dict) else None
            if want is not None and want != table.early_count():
                raise CheckpointError(
                    f"the pending table of partition {partition} holds {table.early_count()} early labels, "
                    f"checkpoint {seq} says {want}: it is not that checkpoint's (restore the state whole)"
                )

    def close(self) -> None:
        for table in self.tables.values():
            table.close()
