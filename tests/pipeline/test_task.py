"""A task's batch form equals its one-record-at-a-time form: the same messages in the same order, the same model.

Two tasks made alike by the task factory from the same settings take the same records in the same batches, one
through :meth:`Task.process` (decoded by msgspec over the batch, stepped by ``step_many``, its predictions built
in one pass), the other through :meth:`Task.process_each` (each record decoded, stepped and encoded on its own:
the reference). Every message sent (topic, key, value bytes, in order), the tallies the metrics count, and the
checkpoints they would write must be equal: over random streams (dense, named, of changing shapes; labeled or
not; with malformed messages among them), every variant, the scaler, hashing, challengers, learning off, delayed
labels and partition scope with mixing, and random batch cuts.
"""

from __future__ import annotations

import json
import math
import random
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perceptron_stream.kafka.contract import Record
from perceptron_stream.learning import many
from perceptron_stream.learning.labels import is_mistake
from perceptron_stream.pipeline import task as task_module
from perceptron_stream.pipeline.task import Tally

from tests.support.tasks import NAMES, Sent, cut, label_records, make_task, stream_records

CONFIGS = [
    [],
    ["--variant", "margin", "--margin", "0.5"],
    ["--variant", "averaged"],
    ["--variant", "pocket"],
    ["--challengers", "averaged,pocket,margin:0.25"],
    ["--standardize", "--challengers", "pocket"],
    ["--hash-features", "64", "--challengers", "averaged"],
    ["--max-model-features", "3"],
    ["--learning", "off", "--challengers", "averaged"],
    ["--learning", "off", "--standardize", "--label-topic", "labels"],
    ["--learning", "off", "--hash-features", "16"],
    ["--label-topic", "labels", "--challengers", "averaged", "--max-early-labels", "5", "--batch-size", "4"],
    ["--model-scope", "partition", "--mix-every", "7", "--challengers", "pocket"],
    ["--model-scope", "partition", "--mix-every", "0", "--label-topic", "labels", "--challengers", "pocket"],
    ["--label-topic", "labels", "--standardize", "--hash-features", "32", "--challengers", "margin:0.5"],
    ["--explain", "3", "--challengers", "averaged"],  # reasons of a batch at once (plain, margin): explain_many
    ["--variant", "margin", "--margin", "0.5", "--explain", "2"],
    ["--label-topic", "labels", "--explain", "3", "--model-scope", "partition", "--mix-every", "7"],
]


def _run(task, batches: list[list], batched: bool):
    sent, tallies = Sent(), []
    for records in batches:
        tally = Tally()
        (task.process if batched else task.process_each)(records, sent, tally)
        tallies.append({name: getattr(tally, name) for name in Tally.__slots__})
    return sent, tallies


def _state(task) -> dict:
    cp = task.snapshot()
    if "labels" in cp.task:
        cp.task["labels"]["lineage"] = [epoch for epoch, _run in cp.task["labels"]["lineage"]]  # (a tag per run)
    return {
        "positions": cp.positions,
        "model": cp.model,
        "dimension": cp.dimension,
        "task": cp.task,
        "radius": task.learner.radius,
        "pending": None if task.joiner is None else (task.joiner.pending(), task.joiner.early()),
    }


def _run_a_new_task(tmp_path, flags: list[str], tag: str, batches: list[list], batched: bool):
    """A task made from ``flags`` over ``batches`` (the clock fixed), then closed: what it sent, its tallies, its
    state."""
    with mock.patch("perceptron_stream.pipeline.task.time.time", return_value=1_700_000_000.0):
        factory, task = make_task(tmp_path, flags, tag)
        try:
            sent, tallies = _run(task, batches, batched)
            return sent, tallies, _state(task)
        finally:
            if task.joiner is not None:
                task.joiner.close()
            factory.close()


def _same_runs(tmp_path, flags, batches):
    """Both forms over ``batches``, which must send, count and end alike: what they sent, and the tallies."""
    (sent_each, tallies_each, state_each), (sent_many, tallies_many, state_many) = (
        _run_a_new_task(tmp_path, flags, tag, batches, batched) for tag, batched in (("each", False), ("many", True))
    )
    assert sent_many == sent_each
    assert tallies_many == tallies_each
    assert repr(state_many) == repr(state_each)  # repr: -0.0 is not 0.0 there
    return sent_each, tallies_each


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    config=st.sampled_from(CONFIGS),
    form=st.sampled_from(["dense", "named", "ragged", "mixed"]),
    d=st.integers(1, 5),
    n=st.integers(1, 120),
    seed=st.integers(0, 2**32),
    sizes=st.lists(st.integers(1, 40), max_size=12),
    windows=st.booleans(),
    short_spans=st.booleans(),
)
def test_the_batch_form_sends_and_learns_what_one_record_at_a_time_does(
    tmp_path_factory, config, form, d, n, seed, sizes, windows, short_spans
):
    tmp_path = tmp_path_factory.mktemp("task")
    points = stream_records(seed, n, form, d)
    if "--label-topic" in config:  # labels among the points' batches, before or after their points
        labels = label_records(seed, n)
        batches = []
        for i, batch in enumerate(cut(points, sizes)):
            batches.append(batch)
            if labels[i::3]:
                batches.append(labels[i::3])
    else:
        batches = cut(points, sizes)
    with (
        mock.patch.object(many, "NUMPY_RUN", 0 if windows else math.inf),  # either exact path of step_many
        mock.patch.object(task_module, "SPAN_EVENTS", 0 if short_spans else task_module.SPAN_EVENTS),
    ):
        sent, tallies = _same_runs(tmp_path, config, batches)
    # and each point gave one message: its prediction or its dead letter
    answered = [json.loads(v)["source"] for t, _, v in sent if t == "predictions" or t == "points.dlq"]
    assert sorted(a["offset"] for a in answered if a["topic"] == "points") == list(range(n))
    # and "mistake" has one meaning, inline and delayed: y·score ≤ 0 of the published score
    decided = [json.loads(v) for t, _, v in sent if t in ("predictions", "predictions.outcomes")]
    for message in decided:
        y, score = message["y"], message["score"]
        assert message["mistake"] == (None if y is None else is_mistake(y, math.nan if score is None else score))
    # and each point is one event (perceptron_events_total), its delayed label none: a joined label is a decision
    # scored (one mistake flag), not a second event
    predictions = [json.loads(v) for t, _, v in sent if t == "predictions"]
    outcomes = [json.loads(v) for t, _, v in sent if t == "predictions.outcomes"]
    assert sum(t["labeled"] + t["unlabeled"] for t in tallies) == len(predictions)
    assert sum(t["labeled"] for t in tallies) == sum(p["y"] is not None for p in predictions)
    assert sum(t["joined"] for t in tallies) == len(outcomes)
    assert sum(len(t["flags"]) for t in tallies) == sum(p["y"] is not None for p in predictions) + len(outcomes)
    assert sum(sum(t["flags"]) for t in tallies) == sum(m["mistake"] is True for m in predictions + outcomes)


@pytest.mark.parametrize("numpy_run", [0, math.inf, many.NUMPY_RUN], ids=["windows", "fused", "chosen"])
@pytest.mark.parametrize("config", CONFIGS[:7] + CONFIGS[11:], ids=lambda flags: " ".join(flags) or "plain")
def test_long_streams_in_service_sized_batches(tmp_path, config, numpy_run):
    """Thousands of events of the demo's kinds (a noisy stream, then a separable one: the model updates often,
    then seldom, so both paths of step_many are taken), in batches of up to 1,000; with delayed labels, half the
    points wait for theirs, a tenth of which came first (a span ends after each of those)."""
    from perceptron_stream.streams import separable

    events = [dict(e) for e, _ in zip(separable(dimensions=6, noise=0.2, seed=3), range(2500))]
    events += [{**e, "id": f"q{e['id']}"} for e, _ in zip(separable(dimensions=6, noise=0.0, seed=4), range(2500))]
    labels = []
    for i, e in enumerate(events):
        if "--label-topic" in config and i % 2:
            y = e.pop("y")
            if i % 10 == 1:
                labels.append(json.dumps({"id": e["id"], "y": y}).encode())
        if i % 3 == 0:
            e["features"] = dict(zip([*NAMES, "f"], e.pop("x")))  # named events too, from the 3rd batch on
    rng = random.Random(5)
    dense = [e for e in events if "x" in e]
    named = [e for e in events if "features" in e]
    records = [
        Record("points", 0, i, None, json.dumps(e).encode(), 1_700_000_000_000 + i) for i, e in enumerate(dense + named)
    ]
    early = [Record("labels", 0, i, None, value, 1_700_000_000_000) for i, value in enumerate(labels)]
    sizes = [rng.choice([1, 7, 300, 1000]) for _ in range(40)]
    with mock.patch.object(many, "NUMPY_RUN", numpy_run), mock.patch.object(task_module, "SPAN_EVENTS", 0):
        sent, _ = _same_runs(tmp_path, config, ([early] if early else []) + cut(records, sizes))
    assert sum(topic == "predictions" for topic, _, _ in sent) == len(records)
    outcomes = sum(topic == "predictions.outcomes" for topic, _, _ in sent)
    assert outcomes == (len(labels) if "--max-early-labels" not in config else 5)  # the others let go: dead letters


@pytest.mark.parametrize(
    "config",
    [[], ["--variant", "averaged"], ["--standardize"], ["--hash-features", "4"], ["--label-topic", "labels"]],
    ids=["plain", "averaged", "standardize", "hashed", "labels"],
)
@pytest.mark.parametrize("form", ["dense", "named", "ragged"])
def test_explain_adds_each_prediction_s_largest_reason_codes_and_changes_nothing_else(tmp_path, config, form):
    """--explain 2: the same messages, model and counts as without it, each prediction with its two largest parts."""
    points = stream_records(7, 300, form, 4)
    batches = cut(points, [50] * 6)
    if "--label-topic" in config:
        batches = [*batches, label_records(7, 300)]
    (sent, tallies, state), (explained, explained_tallies, explained_state) = (
        _run_a_new_task(tmp_path, flags, tag, batches, batched=True)
        for tag, flags in (("plain", config), ("explained", [*config, "--explain", "2"]))
    )
    assert explained_tallies == tallies and repr(explained_state) == repr(state)
    assert len(explained) == len(sent)
    reasons = 0
    for (topic, key, value), (e_topic, e_key, e_value) in zip(sent, explained, strict=True):
        assert (e_topic, e_key) == (topic, key)
        doc, e_doc = json.loads(value), json.loads(e_value)
        if "reasons" not in e_doc:
            assert e_value == value and ("y_pred" not in doc or "label_source" in doc)  # letters, outcomes as they were
            continue
        parts = e_doc.pop("reasons")
        bias = e_doc.pop("bias")
        assert e_doc == doc and e_value.startswith(value[:-1])  # the prediction's fields first, unchanged
        assert len(parts) <= 2 and isinstance(bias, float)
        assert [abs(p["contribution"]) for p in parts] == sorted((abs(p["contribution"]) for p in parts), reverse=True)
        assert all(p["contribution"] == p["weight"] * p["value"] for p in parts)
        reasons += len(parts)
    assert reasons > 100  # most predictions carry two
