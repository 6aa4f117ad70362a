"""The gate of labels ahead of their points, turn by turn, over real tasks and pending tables (no broker: the
input's lag is a callable)."""

from __future__ import annotations

import logging
import time

from perceptron_stream.pipeline.labels import LabelGate
from perceptron_stream.pipeline.task import Tally, TaskSet

from tests.support.labels import GRACE, Sent, label, make_joiner, make_task, point


def _gate_with_a_task(
    label_topic: str | None = "labels", max_early_labels: int = 100, batch_size: int = 2, joiner=None
):
    tasks = TaskSet("points", per_partition=False)
    task = make_task(make_joiner() if joiner is None else joiner)
    tasks.add(task)
    gate = LabelGate(tasks, label_topic, "points", 500, max_early_labels=max_early_labels, batch_size=batch_size)
    return gate, task


def test_the_grace_clock_moves_on_only_after_two_looks_find_the_input_read_to_its_end():
    gate, task = _gate_with_a_task()
    sent, tally = Sent(), Tally()
    task.process([label(3, "lonely", 1, ms=1_000)], sent, tally)  # long ago: past the grace once the clock moves
    looks = []

    def read_lag():
        looks.append(1)
        return True, {("points", 0): 0}

    assert not gate.before(read_lag, []) and looks == [1]  # one look proves nothing
    assert not gate.before(read_lag, []) and looks == [1]  # not looked again before ALL_READ_CHECK_S passed
    gate.next_check = 0.0  # the check interval passed (a second of the test's time saved)
    assert gate.before(read_lag, []) and looks == [1, 1]
    assert list(gate.turn([], sent, tally)) == []  # a turn of no records lets the label go
    [letter] = sent.on("dlq")
    assert letter["reason"] == "unknown_id" and f"--label-grace-seconds {GRACE:g}" in letter["error"]
    assert task.unsaved == 2  # the label's batch, and its dead letter: a change to checkpoint
    gate.next_check = 0.0
    assert not gate.before(read_lag, [])


def test_a_lag_not_zero_or_unread_starts_the_looks_again():
    gate, task = _gate_with_a_task()
    task.process([label(0, "a", 1, ms=1_000)], Sent(), Tally())
    for lags in [(True, {("points", 0): 0}), (True, {("points", 0): 4}), (True, {("points", 0): 0}), (False, None)]:
        gate.next_check = 0.0
        assert not gate.before(lambda lags=lags: lags, [])


def test_label_batches_go_after_point_batches_and_the_gauges_count_what_waits():
    gate, task = _gate_with_a_task()
    sent, tally = Sent(), Tally()
    batches = [[label(0, "a", 1, ms=1_000)], [point(0, "a", ms=900), point(1, "b", ms=950)]]
    topics = []
    for records in gate.turn(batches, sent, tally):
        topics.append(records[0].topic)
        task.process(records, sent, tally)
    assert topics == ["points", "labels"]
    assert gate.after(tally) == ([], [], (1, 0))  # "b" pending, no label early
    assert tally.label_outcomes == ["joined"] and [t for t, _, _ in sent] == ["predictions", "predictions", "outcomes"]


def test_without_a_label_topic_the_gate_does_nothing():
    tasks = TaskSet("points", per_partition=False)
    tasks.add(make_task(None))
    gate = LabelGate(tasks, None, "points", fetch_max_wait_ms=500, max_early_labels=100, batch_size=10)
    batches = [[point(0, "a", ms=900)]]

    def read_lag():
        raise AssertionError("the lag is not read without a label topic")

    assert not gate.before(read_lag, [])
    assert gate.turn(batches, Sent(), Tally()) is batches and gate.after(Tally()) == ([], [], None)


def test_a_label_partition_is_paused_at_half_its_room_for_early_labels_and_read_again_at_a_quarter(caplog):
    caplog.set_level(logging.INFO, logger="perceptron_stream")
    gate, task = _gate_with_a_task(max_early_labels=8)
    sent, tally = Sent(), Tally()
    task.process([label(i, f"e{i}", 1, ms=1_000 + i) for i in range(3)], sent, tally)
    assert gate.after() == ([], [], None)  # 3 early labels of room for 8
    task.process([label(3, "e3", 1, ms=1_003)], sent, tally)
    assert gate.after() == ([("labels", 0)], [], None)  # 4: half the room
    assert gate.after() == ([("labels", 0)], [], None)  # again each turn (a rebalance resumes every partition)
    task.process([point(0, "e0", ms=1_010), point(1, "e1", ms=1_011)], sent, tally)  # two points come: 2 wait
    assert gate.after() == ([], [("labels", 0)], None)  # a quarter of the room: read again
    assert gate.after() == ([], [], None)  # once
    assert tally.label_outcomes.count("joined") == 2
    assert [r.getMessage() for r in caplog.records if r.name == "perceptron_stream"] == [
        "labels[0]: 4 labels wait for their points (room for 4 early ones): paused until 2 or fewer wait",
        "labels[0]: 2 labels wait for their points: read again",
    ]  # a line when it starts and one when it ends, not one a turn


def test_the_pause_leaves_room_for_a_whole_batch_of_early_labels():
    gate, _ = _gate_with_a_task(max_early_labels=1000, batch_size=800)
    assert (gate.pause_at, gate.resume_at) == (200, 100)  # 200 + a poll of 800 still fit in 1,000
    gate, _ = _gate_with_a_task(max_early_labels=100_000, batch_size=1000)
    assert (gate.pause_at, gate.resume_at) == (50_000, 25_000)  # the defaults: half the room


def test_labels_stamped_far_ahead_whose_points_never_come_do_not_pause_their_partition_for_good():
    """Room for 20 early labels, polls of 10: ten labels stamped an hour ahead (the most Apache Kafka takes by
    default) paused the label partition until that hour and their grace had passed, and the genuine labels behind
    them waited as long. Believed no later than the wall clock and the skew, they go once the wall clock passes
    that and their grace (the gate moves the grace clock to it when the input is read to its end)."""
    skew, now_ms = 60.0, int(time.time() * 1000)
    joiner = make_joiner(max_early=20, max_clock_skew=skew)
    gate, task = _gate_with_a_task(max_early_labels=20, batch_size=10, joiner=joiner)
    sent, tally = Sent(), Tally()
    task.process([label(i, f"never-{i}", 1, ms=now_ms + 55 * 60_000) for i in range(10)], sent, tally)
    assert gate.after() == ([("labels", 0)], [], None)
    joiner.read_to(0, now_ms + int((skew + GRACE) * 1000) + 1_000)  # how far the gate moves it, once that is now
    assert gate.before(lambda: (True, {}), [])
    assert list(gate.turn([], sent, tally)) == []
    assert [d["reason"] for d in sent.on("dlq")] == ["unknown_id"] * 10
    assert gate.after() == ([], [("labels", 0)], None)  # read again: the genuine labels behind them come


def test_a_backfill_of_month_old_history_joins_its_labels():
    """The TTL was measured on the wall clock against the records' time: a backfill of 30-day-old points expired
    on arrival (TTL 7 days) and every label was dead-lettered. In stream time, they join as they did live."""
    then_ms = int(time.time() * 1000) - 30 * 86_400_000
    joiner = make_joiner(ttl_seconds=7 * 86_400, max_clock_skew=60.0)
    gate, task = _gate_with_a_task(joiner=joiner)
    sent, tally = Sent(), Tally()
    points = [point(i, f"p{i}", ms=then_ms + i) for i in range(20)]
    labels = [label(i, f"p{i}", 1, ms=then_ms + 60_000 + i) for i in range(20)]
    for batches in ([points[:10]], [points[10:], labels[:10]], [labels[10:]]):
        for records in gate.turn(batches, sent, tally):
            task.process(records, sent, tally)
    assert len(sent.on("outcomes")) == 20 and sent.on("dlq") == []
    assert "expired" not in tally.label_outcomes and joiner.pending() == joiner.early() == 0


def test_a_second_copy_of_a_back_dated_label_is_a_duplicate():
    """A label stamped 8 days back (TTL 7 days) left a labeled mark that expired at once: its second copy was
    unknown_id. The mark is kept from no earlier than the skew behind the stream's time."""
    now_ms = int(time.time() * 1000)
    joiner = make_joiner(ttl_seconds=7 * 86_400, max_clock_skew=60.0)
    gate, task = _gate_with_a_task(joiner=joiner)
    sent, tally = Sent(), Tally()
    for batches in (
        [[point(0, "a", ms=now_ms)]],
        [[label(0, "a", 1, ms=now_ms - 8 * 86_400_000)]],
        [[point(1, "b", ms=now_ms + 1_000)]],
        [[label(1, "a", 1, ms=now_ms - 8 * 86_400_000)]],
    ):
        for records in gate.turn(batches, sent, tally):
            task.process(records, sent, tally)
    assert len(sent.on("outcomes")) == 1 and [d["reason"] for d in sent.on("dlq")] == ["duplicate"]
