"""What does the poll loop do for delayed labels each turn? The gate of labels ahead of their points answers.

A label may reach the brokers before its point; it is held (an *early* row of
its task's pending table) until its point comes or the grace clock lets it go
(:class:`~perceptron_stream.pipeline.labels.joiner.Joiner`). What the poll loop
(:mod:`perceptron_stream.app`) must do for that across this instance's tasks
lives here, behind three moments of a turn:

- :meth:`LabelGate.before`, every turn, once the poll returned: the grace
  clock of an input partition read to its end moves on though no point comes
  (else a label whose point never comes would wait for good, as at the end of
  a stream); whether a label's grace has passed though no record came (a
  batch of no records then lets it go);
- :meth:`LabelGate.turn`, around a batch's processing: points past their TTL
  (of stream time) expired first, label batches ordered after point batches
  (a point of the same poll is kept first), and, after the last, the labels
  still alone after the grace period dead-lettered, acknowledged with the
  batch;
- :meth:`LabelGate.after`, every turn, once the batch's outputs were
  acknowledged: the tables' changes committed, the numbers of the pending and
  early gauges, and which label partitions to pause, their early labels
  filling, and which to read again.

No Kafka here: the input's lag is read through a callable.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

log = logging.getLogger("perceptron_stream")

#: How often the gate looks whether input partitions with labels waiting for their point are read to their end,
#: moving their grace clock on when no point comes (:meth:`LabelGate._clock`); at least twice a fetch's wait on the
#: brokers (fetch.max.wait.ms), so the zero lag read is from a fetch made after the last look.
ALL_READ_CHECK_S = 1.0
#: A label partition is paused once its early labels reach this share of --max-early-labels (or all of it but a
#: poll's --batch-size, when that is less: one poll may bring a batch of them before the next look), and read again
#: once they are down to half of that (their points came, or their grace passed). A label topic read far ahead of
#: its points (a backlog caught up: labels are short, a fetch brings several times as many as of points) would
#: otherwise fill the early labels and evict the oldest as unknown_id, though their points are on their way. Kafka
#: Streams lines up co-partitioned inputs by timestamp for the same reason (max.task.idle.ms); the early labels'
#: count is the limit here, so it is what paces.
PAUSE_AT = 0.5


class LabelGate:
    """The delayed-label path's part of each turn of the loop, over ``tasks`` (a TaskSet) with ``--label-topic``
    ``label_topic`` (None: no delayed labels, and every call does nothing)."""

    def __init__(
        self,
        tasks,
        label_topic: str | None,
        input_topic: str,
        fetch_max_wait_ms: int,
        max_early_labels: int,
        batch_size: int,
    ):
        self.tasks, self.label_topic, self.input_topic = tasks, label_topic, input_topic
        self.pause_at = max(1, min(int(max_early_labels * PAUSE_AT), max_early_labels - batch_size))
        self.resume_at = self.pause_at // 2
        self.paused: set[int] = set()  # label partitions this gate paused
        self.check_every = max(ALL_READ_CHECK_S, 2 * fetch_max_wait_ms / 1000)
        self.all_read_since: dict[int, int] = {}  # input partition with labels waiting → when (ms) its lag last read 0
        self.next_check = 0.0

    # the turn's three moments ---------------------------------------------
    def before(self, read_lag, batches: list) -> bool:
        """Every turn, once the poll returned ``batches``: the grace clock moved on (:meth:`_clock`); whether, no
        record having come, a label waited for its point past the grace period (a turn of no records lets it go)."""
        self._clock(read_lag)
        return not batches and self._due()

    def turn(self, batches: list, send, tally) -> Iterator[list] | list:
        """A turn's ``batches`` in the order to process them, with what the labels need around them: before the
        first, points past their TTL expired (:meth:`_admit`); label batches after point batches; after the last,
        before the flush, the labels past their grace dead letters (:meth:`_release`). Iterated once, by the loop
        that processes them."""
        if self.label_topic is None:
            return batches
        return self._turn(batches, send, tally)

    def _turn(self, batches: list, send, tally) -> Iterator[list]:
        yield from self._admit(batches, tally)
        self._release(send, tally)

    def after(self, tally=None) -> tuple[list[tuple[str, int]], list[tuple[str, int]], tuple[int, int] | None]:
        """Every turn, once the batch's outputs were acknowledged (``tally``: the batch's; None: no batch this turn):
        the tables' changes committed (:meth:`_acknowledged`); the label partitions to pause and to read again
        (:meth:`_pace`), and, after a batch, the numbers of points pending and of labels waiting for their point,
        for the gauges (None: no batch, or no delayed labels)."""
        waiting = None if tally is None else self._acknowledged(tally)
        pause, resume = self._pace()
        return pause, resume, waiting

    # its parts --------------------------------------------------------------
    def _clock(self, read_lag) -> None:
        """Move the grace clock of the input partitions read to their end, whose labels wait for points.

        The grace clock is the points' stream time (:meth:`Joiner.stream_time`):
        it stands still when no point comes, as at the end of a stream, and a
        label whose point never comes would wait for good. When a partition's
        input lag, read from the last fetch (``read_lag() -> (ok, {(topic,
        partition): lag})``), is 0 at two looks ALL_READ_CHECK_S apart, a
        fetch made after the first look found no more points: every point
        written before that look is read, so the clock may move there. A zero
        lag from one look proves nothing (the fetch may predate points written
        since).
        """
        now = time.monotonic()
        if self.label_topic is None or now < self.next_check:
            return
        self.next_check = now + self.check_every
        waiting = {p: task for task in self.tasks.all() for p in task.joiner.waiting()}
        for p in [p for p in self.all_read_since if p not in waiting]:
            del self.all_read_since[p]
        if not waiting:
            return
        ok, lags = read_lag()
        now_ms = int(time.time() * 1000)
        for p, task in waiting.items():
            if ok and (lags or {}).get((self.input_topic, p)) == 0:
                since = self.all_read_since.get(p)
                if since is not None:
                    task.joiner.read_to(p, since)
                self.all_read_since[p] = now_ms
            else:
                self.all_read_since.pop(p, None)

    def _due(self) -> bool:
        """Whether a label waited for its point past the grace period (asked when no record came: with the points'
        stream time moved on by :meth:`_clock`)."""
        if self.label_topic is None:
            return False
        return any(task.joiner.early_due() for task in self.tasks.all())

    def _admit(self, batches: list, tally) -> list:
        """Before a batch: points past their TTL go before its labels could join them; the batches in the order to
        process them, a label's after the points of its partition (a point of this poll is kept first)."""
        if self.label_topic is None:
            return batches
        for task in self.tasks.all():
            if task.joiner is not None:
                task.joiner.expire(tally)
        return sorted(batches, key=lambda records: records[0].topic == self.label_topic)

    def _release(self, send, tally) -> None:
        """After a batch, before its flush: the labels still alone after the grace period are dead letters,
        acknowledged with the batch; a change of the task's state, as an event is: a checkpoint will cover it."""
        if self.label_topic is None:
            return
        for task in self.tasks.all():
            task.unsaved += task.joiner.expire_early(send, tally)

    def _acknowledged(self, tally) -> tuple[int, int] | None:
        """The batch's outputs acknowledged: the tables' changes committed (evictions counted in ``tally``). The
        numbers of points pending and of labels waiting for their point, for the gauges (None: no delayed labels)."""
        if self.label_topic is None:
            return None
        tasks = self.tasks.all()
        for task in tasks:
            task.joiner.commit(tally)
        return sum(t.joiner.pending() for t in tasks), sum(t.joiner.early() for t in tasks)

    def _pace(self) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """The label partitions to pause, their early labels at ``pause_at`` or more (again each turn: a rebalance
        resumes every partition), and those this gate paused to read again, their early labels down to
        ``resume_at`` (or their partition gone).
        """
        if self.label_topic is None:
            return [], []
        early = {p: t.early_count() for task in self.tasks.all() for p, t in task.joiner.tables.items()}
        pause = sorted(p for p, n in early.items() if n >= self.pause_at)
        resume = sorted(p for p in self.paused if early.get(p, 0) <= self.resume_at)
        for p in pause:
            if p not in self.paused:  # a line when it starts and ends, not every turn
                log.info(
                    "%s[%d]: %d labels wait for their points (room for %d early ones): paused until %d or fewer wait",
                    self.label_topic,
                    p,
                    early[p],
                    self.pause_at,
                    self.resume_at,
                )
        for p in resume:
            log.info("%s[%d]: %d labels wait for their points: read again", self.label_topic, p, early.get(p, 0))
        self.paused = (self.paused - set(resume)) | set(pause)
        return [(self.label_topic, p) for p in pause], [(self.label_topic, p) for p in resume]
