"""The join of points and labels, whichever comes first: pure code (a real pending table, a real learner),
the grace period on an injected stream-time clock (the points' timestamps the joiner is shown)."""

from __future__ import annotations

import json

import pytest
from perceptron_stream.kafka import DEFAULT_MAX_MESSAGE_BYTES, RecordLimits
from perceptron_stream.kafka.contract import Record
from perceptron_stream.learning import make_learner
from perceptron_stream.pipeline.task import Tally
from perceptron_stream.state.changelog import Changelog
from perceptron_stream.state.pending import PendingTable
from prometheus_client import generate_latest

from tests.support.labels import GRACE, MemoryLog, Sent, label, make_joiner, make_task, point


def test_a_label_before_its_point_waits_and_is_joined_right_after_the_points_prediction():
    joiner = make_joiner()
    task, sent, tally = make_task(joiner), Sent(), Tally()
    task.process([label(0, "a", 1, ms=1_000)], sent, tally)
    assert sent == [] and joiner.early() == 1 and tally.label_outcomes == ["early"]
    task.process([point(0, "a", ms=900), point(1, "b", ms=950)], sent, tally)
    assert [t for t, _, _ in sent] == ["predictions", "outcomes", "predictions"]  # the decision first, then its outcome
    prediction, outcome = sent[0][2], sent[1][2]
    assert (outcome["id"], outcome["y"], outcome["y_pred"], outcome["score"]) == (
        "a",
        1,
        prediction["y_pred"],
        prediction["score"],
    )
    assert outcome["label_source"] == {"topic": "labels", "partition": 0, "offset": 0} and sent[1][1] == b"a"
    assert outcome["source"] == {"topic": "points", "partition": 0, "offset": 0} and outcome[
        "delay_seconds"
    ] == pytest.approx(0.1)
    assert task.learner.labeled == 1 and task.learner.seen == 2 and joiner.early() == 0 and joiner.pending() == 1
    assert tally.label_outcomes == ["early", "joined"] and tally.joined == 1
    assert (tally.labeled, tally.unlabeled) == (0, 2)  # two points, each one event; the label is none


def test_a_point_and_its_delayed_label_are_one_event_and_one_decision_scored():
    """perceptron_events_total counts the point once (unlabeled, when it came); its label counts as a joined label
    (perceptron_labels_total) and its decision's mistake once (perceptron_mistakes_total, the rate)."""
    from perceptron_stream.metrics import ServiceMetrics

    metrics = ServiceMetrics(window=10, version="test", variant="plain")
    joiner = make_joiner()
    task, sent = make_task(joiner), Sent()
    for records in ([point(0, "a", ms=900)], [label(0, "a", 1, ms=1_000)]):
        tally = Tally()
        task.process(records, sent, tally)
        metrics.observe_tally(tally, 0.001)
    text = generate_latest(metrics.registry).decode()
    assert 'perceptron_events_total{kind="unlabeled"} 1.0' in text
    assert 'perceptron_events_total{kind="labeled"} 0.0' in text
    assert 'perceptron_labels_total{outcome="joined"} 1.0' in text
    assert "perceptron_mistakes_total 1.0" in text  # its score was 0: a mistake
    assert "perceptron_processing_latency_seconds_count 1.0" in text  # the event's; the label is none
    assert metrics.window.value == 1.0


def test_duplicates_stay_duplicates_whichever_side_came_first():
    joiner = make_joiner()
    task, sent, tally = make_task(joiner), Sent(), Tally()
    task.process([label(0, "a", 1, ms=1_000), label(1, "a", -1, ms=1_001)], sent, tally)  # two labels, no point yet
    task.process([point(0, "a", ms=900)], sent, tally)
    task.process([label(2, "a", 1, ms=1_002)], sent, tally)  # a third, after the join
    assert [d["reason"] for d in sent.on("dlq")] == ["duplicate", "duplicate"]
    assert [d["source"]["offset"] for d in sent.on("dlq")] == [1, 2]
    assert len(sent.on("outcomes")) == 1 and sent.on("outcomes")[0]["y"] == 1 and task.learner.labeled == 1


def test_a_label_whose_point_never_comes_is_dead_lettered_once_the_grace_has_passed_and_not_before():
    joiner = make_joiner()
    task, sent, tally = make_task(joiner), Sent(), Tally()
    label_ms = 1_000_000
    task.process([label(7, "lonely", -1, ms=label_ms)], sent, tally)
    joiner.saw_point(0, label_ms + int(GRACE * 1000) - 1)  # the points' stream time, just short of the grace
    assert not joiner.early_due()
    joiner.expire_early(sent, tally)
    assert sent == [] and joiner.early() == 1
    joiner.read_to(0, label_ms + int(GRACE * 1000))  # the input read to its end at that moment (no point came)
    assert joiner.early_due()
    joiner.expire_early(sent, tally)
    [letter] = sent.on("dlq")
    assert letter["reason"] == "unknown_id" and letter["source"] == {"topic": "labels", "partition": 0, "offset": 7}
    assert json.loads(letter["raw"]) == {"id": "lonely", "y": -1} and sent[0][1] == b"lonely"
    assert "--label-grace-seconds 300" in letter["error"]
    assert joiner.early() == 0 and tally.label_outcomes == ["early", "unknown_id"] and tally.rejected == ["unknown_id"]
    task.process([point(0, "lonely", ms=label_ms + 1)], sent, tally)  # too late: kept as a pending point, no join
    assert sent.on("outcomes") == [] and joiner.pending() == 1


def test_beyond_max_early_labels_the_oldest_is_dead_lettered_at_once():
    joiner = make_joiner(max_early=2)
    task, sent, tally = make_task(joiner), Sent(), Tally()
    task.process([label(i, f"p{i}", 1, ms=1_000 + i) for i in range(3)], sent, tally)
    [letter] = sent.on("dlq")
    assert (
        letter["reason"] == "unknown_id"
        and letter["source"]["offset"] == 0
        and "--max-early-labels 2" in letter["error"]
    )
    assert joiner.early() == 2
    task.process([point(0, "p1", ms=900), point(1, "p2", ms=901), point(2, "p0", ms=902)], sent, tally)
    assert [o["id"] for o in sent.on("outcomes")] == ["p1", "p2"] and joiner.pending() == 1


def test_an_early_label_is_in_the_checkpoint_and_back_after_a_restore():
    joiner = make_joiner()
    task, sent, tally = make_task(joiner), Sent(), Tally()
    task.process([label(0, "b", 1, ms=1_000)], sent, tally)
    cp = task.snapshot()
    task.before_save(cp)
    task.saved(cp)
    assert cp.task["labels"]["early"] == {"0": 1}
    task.process([point(0, "b", ms=900)], sent, tally)  # joined after the checkpoint: a restore undoes it
    assert joiner.early() == 0 and len(sent.on("outcomes")) == 1
    task.restore(cp, make_learner())
    assert joiner.early() == 1
    task.process([point(0, "b", ms=900)], sent, tally)  # read again: joined again, from the checkpoint's state
    assert len(sent.on("outcomes")) == 2 and task.learner.labeled == 1


@pytest.mark.parametrize("label_first", [False, True], ids=["label after", "label first"])
@pytest.mark.parametrize("batched", [True, False], ids=["batch", "one at a time"])
def test_a_score_of_zero_is_a_mistake_inline_and_delayed_alike(label_first, batched):
    """The seeds' rule, y·score ≤ 0, whichever way the label comes: a fresh model scores its first point 0 and
    publishes y_pred -1, which a label -1 matches, and still it was a mistake (sign(0) is no label)."""
    inline_task, inline_sent, inline_tally = make_task(None), Sent(), Tally()
    first = Record("points", 0, 0, b"a", json.dumps({"id": "a", "x": [1.0, -2.0], "y": -1}).encode(), 900)
    (inline_task.process if batched else inline_task.process_each)([first], inline_sent, inline_tally)
    [inline] = inline_sent.on("predictions")
    assert (inline["y"], inline["y_pred"], inline["score"], inline["mistake"]) == (-1, -1, 0.0, True)

    joiner = make_joiner()
    task, sent, tally = make_task(joiner), Sent(), Tally()
    process = task.process if batched else task.process_each
    records = [point(0, "a", ms=900), label(0, "a", -1, ms=1_000)]
    for record in reversed(records) if label_first else records:
        process([record], sent, tally)
    [prediction], [outcome] = sent.on("predictions"), sent.on("outcomes")
    assert (prediction["y_pred"], prediction["score"], prediction["mistake"]) == (-1, 0.0, None)
    assert (outcome["y"], outcome["y_pred"], outcome["score"], outcome["mistake"]) == (-1, -1, 0.0, True)
    assert tally.flags == inline_tally.flags == [True]  # what perceptron_mistakes_total and the rate count
    assert task.learner.mistakes == inline_task.learner.mistakes == 1 and outcome["model"]["mistakes"] == 1
    assert task.learner.to_state()["weights"] == inline_task.learner.to_state()["weights"]  # learned alike


def test_a_challengers_delayed_mistake_is_its_score_against_the_label():
    """A challenger is scored as the champion is: its score kept with the point, y·score ≤ 0 (a zero score is a
    mistake though its prediction -1 matches the label -1); a row from before scores were kept holds its
    prediction ±1, whose sign gives the same verdict."""
    from perceptron_stream.pipeline.labels.join import challenger_wrong, decided_wrong

    row = {"score": 0.0, "y_pred": -1, "challengers": {"averaged": 0.0, "pocket": -0.5, "old": -1}}
    assert decided_wrong(row, -1) and decided_wrong(row, 1)
    assert challenger_wrong(row, "averaged", -1) and challenger_wrong(row, "averaged", 1)
    assert not challenger_wrong(row, "pocket", -1) and challenger_wrong(row, "pocket", 1)
    assert not challenger_wrong(row, "old", -1) and challenger_wrong(row, "old", 1)
    assert challenger_wrong(row, "margin", -1)  # added since the point came: nothing kept, scored as a mistake
    assert not decided_wrong({"score": None}, 1)  # a non-finite score (JSON null) is NaN's: no y·score ≤ 0


#: The wall clock of the tests of timestamps (s; January 2027), its milliseconds, and the bound on timestamps.
WALL = 1_800_000_000.0
WALL_MS = int(WALL * 1000)
SKEW = 60.0
YEAR_2100_MS = 4_102_444_800_000


def _bounded_joiner(**options):
    return make_joiner(max_clock_skew=SKEW, wall=lambda: WALL, **options)


def test_one_point_stamped_far_ahead_moves_the_grace_clock_no_further_than_the_wall_clock_allows():
    """Labels before their points, and one point stamped in 2100 among the points: it moved the grace clock past
    every waiting label's grace, and they were all dead-lettered unknown_id though their points came next."""
    joiner = _bounded_joiner()
    task, sent, tally = make_task(joiner), Sent(), Tally()
    task.process([label(i, f"p{i}", 1, ms=WALL_MS) for i in range(3)], sent, tally)
    task.process([point(0, "ahead", ms=YEAR_2100_MS)], sent, tally)
    assert joiner.stream_time(0) == WALL_MS + SKEW * 1000  # clamped: the wall clock and the skew
    assert not joiner.early_due()
    joiner.expire_early(sent, tally)
    task.process([point(1 + i, f"p{i}", ms=WALL_MS + 1_000) for i in range(3)], sent, tally)
    assert [o["id"] for o in sent.on("outcomes")] == ["p0", "p1", "p2"] and sent.on("dlq") == []
    assert joiner.early() == 0 and joiner.pending() == 1  # the point from 2100 waits for its label


@pytest.mark.parametrize("points_before", [True, False], ids=["clock known", "no point read yet"])
def test_a_label_stamped_long_ago_waits_a_grace_from_the_clock_it_is_measured_on(points_before):
    """Labels stamped 1970 before their points were past their grace as they came: dead-lettered unknown_id as
    soon as any point moved the grace clock. Believed no earlier than the skew behind that clock (the wall
    clock's before any point was read), a label waits its grace less the skew at least, and no longer."""
    joiner = _bounded_joiner()
    task, sent, tally = make_task(joiner), Sent(), Tally()
    if points_before:
        task.process([point(0, "before", ms=WALL_MS)], sent, tally)
    task.process([label(0, "a", 1, ms=0), label(1, "never", -1, ms=0)], sent, tally)
    task.process([point(1, "b", ms=WALL_MS + 1_000)], sent, tally)
    joiner.expire_early(sent, tally)
    assert sent.on("dlq") == [] and joiner.early() == 2
    task.process([point(2, "a", ms=WALL_MS + 2_000)], sent, tally)
    assert [o["id"] for o in sent.on("outcomes")] == ["a"] and sent.on("outcomes")[0]["delay_seconds"] == 0
    joiner.read_to(0, WALL_MS + int((GRACE - SKEW) * 1000))  # its grace, from the skew behind the clock, is over
    joiner.expire_early(sent, tally)
    [letter] = sent.on("dlq")
    assert letter["reason"] == "unknown_id" and json.loads(letter["raw"])["id"] == "never"


def test_a_label_stamped_far_ahead_whose_point_never_comes_is_let_go_once_the_wall_clock_passes_its_grace():
    """A label stamped in 2100 waited (and held its room among the early labels) until 2100: for good."""
    joiner = _bounded_joiner()
    task, sent, tally = make_task(joiner), Sent(), Tally()
    task.process([label(0, "ahead", 1, ms=YEAR_2100_MS)], sent, tally)
    joiner.read_to(0, WALL_MS + int((SKEW + GRACE) * 1000) - 1)  # the input read to its end, the wall clock moving
    assert not joiner.early_due()
    joiner.read_to(0, WALL_MS + int((SKEW + GRACE) * 1000))
    assert joiner.early_due()
    joiner.expire_early(sent, tally)
    [letter] = sent.on("dlq")
    assert letter["reason"] == "unknown_id" and joiner.early() == 0


def test_the_ttl_is_stream_time_of_points_and_labels_alike():
    """A backfill's points, a month old, are kept as they were when live; a label a day later joins, and one
    eight days later finds its point expired, as on a live stream (the TTL is 7 days)."""
    day_ms = 86_400_000
    joiner = _bounded_joiner(ttl_seconds=7 * 86_400)
    task, sent, tally = make_task(joiner), Sent(), Tally()
    then = WALL_MS - 30 * day_ms
    task.process([point(0, "a", ms=then), point(1, "b", ms=then)], sent, tally)
    joiner.expire(tally)
    assert joiner.pending() == 2 and "expired" not in tally.label_outcomes
    task.process([label(0, "a", 1, ms=then + day_ms)], sent, tally)
    task.process([label(1, "b", 1, ms=then + 8 * day_ms)], sent, tally)  # b expired before this label came
    assert [o["id"] for o in sent.on("outcomes")] == ["a"]
    assert tally.label_outcomes == ["joined", "expired", "early"] and joiner.pending() == 0


@pytest.mark.parametrize("batched", [True, False])
def test_a_label_within_the_ttl_of_its_point_joins_though_a_later_label_of_its_batch_is_past_it(batched):
    """A backfill's batch of labels spans days: the TTL's clock moves after the batch, as after the points', so a
    later label in it does not expire the point of an earlier one (unknown_id) before that one is joined."""
    day_ms = 86_400_000
    joiner = _bounded_joiner(ttl_seconds=7 * 86_400)
    task, sent, tally = make_task(joiner), Sent(), Tally()
    then = WALL_MS - 30 * day_ms
    task.process([point(0, "a", ms=then), point(1, "b", ms=then + 7 * day_ms)], sent, tally)
    batch = [label(0, "a", 1, ms=then + day_ms), label(1, "b", 1, ms=then + 9 * day_ms)]
    (task.process if batched else task.process_each)(batch, sent, tally)
    assert [o["id"] for o in sent.on("outcomes")] == ["a", "b"] and sent.on("dlq") == []
    assert tally.label_outcomes == ["joined", "joined"] and joiner.pending() == 0


@pytest.mark.parametrize("batched", [True, False])
def test_a_point_too_large_for_the_pending_changelog_is_dead_lettered_and_not_kept(batched):
    """Its change could never be written, nor then any checkpoint of the task: the point is not kept, its event is
    dead-lettered output_refused (after its prediction) naming the topic and its setting; the others are kept."""
    log = MemoryLog()
    log.limits = RecordLimits({"pending": 4000}, DEFAULT_MAX_MESSAGE_BYTES)
    joiner = make_joiner(changelog=Changelog(log, "g"))
    task, sent, tally = make_task(joiner), Sent(), Tally()
    big = Record("points", 0, 1, b"big", json.dumps({"id": "big", "features": {"f" * 5000: 1.0}}).encode(), 1000)
    records = [point(0, "a", ms=900), big, point(2, "b", ms=1100)]
    (task.process if batched else task.process_each)(records, sent, tally)
    assert [t for t, _, _ in sent] == ["predictions", "predictions", "predictions", "dlq"]
    letter = sent[3][2]
    assert letter["reason"] == "output_refused" and letter["source"] == {"topic": "points", "partition": 0, "offset": 1}
    assert "max.message.bytes=4000 of topic pending" in letter["error"] and "will not be joined" in letter["error"]
    assert joiner.pending() == 2 and tally.rejected == ["output_refused"] and joiner.refused == []


@pytest.mark.parametrize("batched", [True, False])
def test_an_early_label_too_large_for_the_pending_changelog_is_dead_lettered_and_not_held(batched):
    """A label before its point is held as a row (its key in base64, its value escaped again): one whose change the
    pending topic would refuse made every checkpoint fail (RecordTooLarge), and the restart read it again. It is
    dead-lettered output_refused, as a point too large to keep is; the others wait, and the checkpoint is written."""
    log = MemoryLog()
    log.limits = RecordLimits({"pending": 4000}, DEFAULT_MAX_MESSAGE_BYTES)
    joiner = make_joiner(changelog=Changelog(log, "g"))
    joiner.open_table = lambda p: PendingTable(":memory:", ttl_seconds=1e9, max_pending=1000, track_changes=True)
    task, sent, tally = make_task(joiner), Sent(), Tally()
    big = Record("labels", 0, 1, b"k" * 3000, json.dumps({"id": "big", "y": 1}).encode(), 1000)
    records = [label(0, "a", 1, ms=900), big, label(2, "b", -1, ms=1100)]
    (task.process if batched else task.process_each)(records, sent, tally)
    [letter] = sent.on("dlq")
    assert letter["reason"] == "output_refused" and letter["source"] == {"topic": "labels", "partition": 0, "offset": 1}
    assert "max.message.bytes=4000 of topic pending" in letter["error"] and "early label" in letter["error"]
    assert joiner.early() == 2 and tally.rejected == ["output_refused"] and tally.label_outcomes == ["early"] * 2
    cp = task.snapshot()
    task.before_save(cp)  # refused the change of "big" (RecordTooLarge) before
    assert sorted(k.decode() for k, _ in log.records[0]) == ["g/0/s:a", "g/0/s:b"]
