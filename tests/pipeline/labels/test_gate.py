"""The gate of labels ahead of their points, turn by turn, over real tasks and pending tables (no broker: the
input's lag is a callable)."""

from __future__ import annotations

import logging

from perceptron_stream.pipeline.labels import LabelGate
from perceptron_stream.pipeline.task import Tally, TaskSet

from tests.support.labels import GRACE, Sent, label, make_joiner, make_task, point


def _gate_with_a_task(label_topic: str | None = "labels", max_early_labels: int = 100, batch_size: int = 2):
    tasks = TaskSet("points", per_partition=False)
    task = make_task(make_joiner())
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

    gate.clock(read_lag)
    assert looks == [1] and not gate.due()  # one look proves nothing
    gate.clock(read_lag)
    assert looks == [1]  # not looked again before ALL_READ_CHECK_S passed
    gate.next_check = 0.0  # the check interval passed (a second of the test's time saved)
    gate.clock(read_lag)
    assert looks == [1, 1] and gate.due()
    gate.release(sent, tally)
    [letter] = sent.on("dlq")
    assert letter["reason"] == "unknown_id" and f"--label-grace-seconds {GRACE:g}" in letter["error"]
    assert task.unsaved == 2 and not gate.due()  # the label's batch, and its dead letter: a change to checkpoint


def test_a_lag_not_zero_or_unread_starts_the_looks_again():
    gate, task = _gate_with_a_task()
    task.process([label(0, "a", 1, ms=1_000)], Sent(), Tally())
    for lags in [(True, {("points", 0): 0}), (True, {("points", 0): 4}), (True, {("points", 0): 0}), (False, None)]:
        gate.next_check = 0.0
        gate.clock(lambda lags=lags: lags)
        assert not gate.due()


def test_label_batches_go_after_point_batches_and_the_gauges_count_what_waits():
    gate, task = _gate_with_a_task()
    sent, tally = Sent(), Tally()
    batches = [[label(0, "a", 1, ms=1_000)], [point(0, "a", ms=900), point(1, "b", ms=950)]]
    ordered = gate.admit(batches, tally)
    assert [records[0].topic for records in ordered] == ["points", "labels"]
    for records in ordered:
        task.process(records, sent, tally)
    gate.release(sent, tally)
    assert gate.acknowledged(tally) == (1, 0)  # "b" pending, no label early
    assert tally.label_outcomes == ["joined"] and [t for t, _, _ in sent] == ["predictions", "predictions", "outcomes"]


def test_without_a_label_topic_the_gate_does_nothing():
    tasks = TaskSet("points", per_partition=False)
    tasks.add(make_task(None))
    gate = LabelGate(tasks, None, "points", fetch_max_wait_ms=500, max_early_labels=100, batch_size=10)
    batches = [[point(0, "a", ms=900)]]

    def read_lag():
        raise AssertionError("the lag is not read without a label topic")

    gate.clock(read_lag)
    assert not gate.due() and gate.admit(batches, Tally()) is batches and gate.acknowledged(Tally()) is None


def test_a_label_partition_is_paused_at_half_its_room_for_early_labels_and_read_again_at_a_quarter(caplog):
    caplog.set_level(logging.INFO, logger="perceptron_stream")
    gate, task = _gate_with_a_task(max_early_labels=8)
    sent, tally = Sent(), Tally()
    task.process([label(i, f"e{i}", 1, ms=1_000 + i) for i in range(3)], sent, tally)
    assert gate.pace() == ([], [])  # 3 early labels of room for 8
    task.process([label(3, "e3", 1, ms=1_003)], sent, tally)
    assert gate.pace() == ([("labels", 0)], [])  # 4: half the room
    assert gate.pace() == ([("labels", 0)], [])  # again each turn (a rebalance resumes every partition)
    task.process([point(0, "e0", ms=1_010), point(1, "e1", ms=1_011)], sent, tally)  # two points come: 2 wait
    assert gate.pace() == ([], [("labels", 0)])  # a quarter of the room: read again
    assert gate.pace() == ([], [])  # once
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
