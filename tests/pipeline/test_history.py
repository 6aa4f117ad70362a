"""The model history rebuilds the weights behind every prediction a task published, to the last bit.

A task made by the factory with ``--model-history-topic`` takes random streams (dense, named, ragged; labeled or
not; malformed messages among them; delayed labels before and after their points; partition scope with mixing),
in random batches through both forms. Every prediction it sent names its run and its ``seen``; the history records
it sent beside them rebuild a model (:func:`~perceptron_stream.pipeline.history.rebuild`) whose score of the
event is the one published, bit for bit, for every variant, the scaler, hashing, a cap on the features and
learning off.
"""

from __future__ import annotations

import base64
import json
import random

import pytest
from perceptron_stream.kafka.contract import Record, RecordLimits
from perceptron_stream.learning import Perceptron, learner_from_state
from perceptron_stream.pipeline.history import (
    SIGNATURE_BYTES,
    SNAPSHOT,
    History,
    HistoryError,
    Recorded,
    decode_record,
    rebuild,
    runs_at,
)
from perceptron_stream.pipeline.task import Tally
from perceptron_stream.wire.inputs import Decoder

from tests.support.tasks import Sent, cut, label_records, make_task, stream_records

HISTORY = ["--model-history-topic", "history", "--history-snapshot-every", "37"]
CONFIGS = {
    "plain": [],
    "margin": ["--variant", "margin", "--margin", "0.5"],
    "averaged": ["--variant", "averaged"],
    "pocket": ["--variant", "pocket", "--challengers", "averaged"],
    "standardize-averaged": ["--standardize", "--variant", "averaged"],
    "hashed": ["--hash-features", "8"],
    "capped": ["--max-model-features", "3"],
    "off": ["--learning", "off"],
    "labels": ["--label-topic", "labels", "--max-early-labels", "5", "--batch-size", "4"],
    "labels-standardize-hashed": ["--label-topic", "labels", "--standardize", "--hash-features", "32"],
    "partition-mixing": ["--model-scope", "partition", "--mix-every", "7"],
    "partition-labels": ["--model-scope", "partition", "--mix-every", "5", "--label-topic", "labels"],
    "explained": ["--explain", "2"],  # a batch's reasons at once, its changes recorded as a step_many's
    "margin-explained-labels": ["--variant", "margin", "--margin", "0.5", "--explain", "3", "--label-topic", "labels"],
}


def _run(
    tmp_path, flags: list[str], batches: list[list], batched: bool, tag: str = "t", limits: RecordLimits | None = None
) -> Sent:
    factory, task = make_task(tmp_path, flags, tag, limits)
    sent = Sent()
    try:
        for records in batches:
            (task.process if batched else task.process_each)(records, sent, Tally())
    finally:
        if task.joiner is not None:
            task.joiner.close()
        factory.close()
    return sent


def _batches(form: str, seed: int, flags: list[str]) -> list[list]:
    points = stream_records(seed, 240, form, 4)
    rng = random.Random(seed)
    batches = cut(points, [rng.randint(1, 60) for _ in range(12)])
    if "--label-topic" in flags:
        labels = label_records(seed, 240)
        batches = [*batches[:3], labels[:80], *batches[3:], labels[80:]]
    return batches


def _events(batches: list[list]) -> dict[int, object]:
    """Input offset → the event's x as the decoder gives it (the valid points only)."""
    decoder, out = Decoder(max_message_bytes=1 << 20, max_features=1000), {}
    for r in (r for batch in batches for r in batch if r.topic == "points"):
        _, xs, _, _, _ = decoder.decode_many([r.value], [r.key], True)
        if xs:
            out[r.offset] = xs[0]
    return out


@pytest.mark.parametrize("batched", [True, False], ids=["batch", "each"])
@pytest.mark.parametrize("form", ["dense", "named", "ragged"])
@pytest.mark.parametrize("config", list(CONFIGS.values()), ids=list(CONFIGS))
def test_every_prediction_is_rebuilt_with_the_weights_that_made_it(tmp_path, config, form, batched):
    batches = _batches(form, 11, config)
    sent = _run(tmp_path, [*config, *HISTORY], batches, batched)
    records = [decode_record(v) for t, _, v in sent if t == "history"]
    predictions = [json.loads(v) for t, _, v in sent if t == "predictions"]
    events = _events(batches)
    assert predictions and records
    task = "partition-0" if "--model-scope" in config else "model"
    assert {key for t, key, _ in sent if t == "history"} == {f"perceptron-stream/{task}".encode()}
    checked = 0
    for p in predictions:
        run, seen = p["model"]["run"], p["model"]["seen"]
        rebuilt = rebuild(records, run, seen)
        x = events[p["source"]["offset"]]
        (y_pred, score, _), _, _ = rebuilt.explain_step(x, None)  # as it scored x (a scaler saw x first)
        assert (repr(score), y_pred) == (repr(p["score"]), p["y_pred"]), (p, x)
        checked += 1
    assert checked == len(predictions) > 100


def test_without_a_history_nothing_changes_and_with_it_only_the_run_is_added(tmp_path):
    """The same messages with the history on, the run added to each model's fields, the history's records
    between the batches' outputs."""
    flags = ["--variant", "averaged", "--label-topic", "labels"]
    batches = _batches("named", 5, flags)
    plain = _run(tmp_path, flags, batches, True, "off")
    recorded = _run(tmp_path, [*flags, *HISTORY], batches, True, "on")
    outputs = [(t, k, json.loads(v)) for t, k, v in recorded if t != "history"]
    for _, _, doc in outputs:
        if "model" in doc:
            assert isinstance(doc["model"].pop("run"), str)
    assert outputs == [(t, k, json.loads(v)) for t, k, v in plain]


def test_plain_records_its_updates_and_averaged_every_labeled_step(tmp_path):
    """The history's size follows what changes the model: a plain perceptron's mistakes (and the events that
    brought new features), an averaged one's every labeled event (its average moves on each)."""
    batches = _batches("dense", 3, [])
    counts = {}
    for variant in ("plain", "averaged"):
        sent = _run(tmp_path, ["--variant", variant, *HISTORY], batches, True, variant)
        records = [decode_record(v) for t, _, v in sent if t == "history"]
        steps = sum(1 for r in records if r["kind"] == "changes" for c in r["changes"] if c[0] == "s")
        predictions = [json.loads(v) for t, _, v in sent if t == "predictions"]
        counts[variant] = (steps, predictions[-1]["model"]["version"], sum(p["y"] is not None for p in predictions))
    (plain_steps, plain_updates, labeled), (averaged_steps, _, averaged_labeled) = counts["plain"], counts["averaged"]
    assert plain_updates <= plain_steps <= plain_updates + 4  # the updates, and the first events of its 4 features
    assert averaged_steps == averaged_labeled == labeled


def test_a_restored_task_starts_a_new_run_from_its_checkpoint(tmp_path):
    batches = _batches("dense", 8, [])
    factory, task = make_task(tmp_path, HISTORY, "restore")
    sent = Sent()
    try:
        for records in batches[:4]:
            task.process(records, sent, Tally())
        cp = task.snapshot()
        first = task.history.run
        task.restore(cp, task.learner.learner)
        for records in batches[4:]:
            task.process(records, sent, Tally())
    finally:
        factory.close()
    records = [decode_record(v) for t, _, v in sent if t == "history"]
    starts = [r for r in records if r["kind"] == "state" and r["cause"] == "start"]
    assert [r["run"] for r in starts] == [first, task.history.run] and first != task.history.run
    assert starts[1]["seen"] == learner_from_state(cp.model).seen > 0 and starts[1]["model"] == cp.model
    runs = [json.loads(v)["model"]["run"] for t, _, v in sent if t == "predictions"]
    assert runs[0] == first and runs[-1] == task.history.run


def test_a_history_altered_or_cut_rebuilds_another_model_or_none(tmp_path):
    """What explain relies on: a change altered gives another score for the events after it; a run whose states
    are gone rebuilds nothing (HistoryError), never a model of another run."""
    batches = _batches("dense", 9, [])
    sent = _run(tmp_path, HISTORY, batches, True)
    records = [decode_record(v) for t, _, v in sent if t == "history"]
    predictions = [json.loads(v) for t, _, v in sent if t == "predictions"]
    events = _events(batches)
    changes = next(r for r in records if r["kind"] == "changes" and r["changes"])
    kind, seen, version, x, y = changes["changes"][0]
    changes["changes"][0] = [kind, seen, version, [v * 2.0 + 1.0 for v in x], y]
    later = [p for p in predictions if seen < p["model"]["seen"] and p["model"]["seen"] < seen + 30]
    differ = [
        p
        for p in later
        if rebuild(records, p["model"]["run"], p["model"]["seen"]).score_one(events[p["source"]["offset"]])
        != p["score"]
    ]
    assert later and differ
    with pytest.raises(HistoryError, match="no state of run"):
        rebuild([r for r in records if r["kind"] == "changes"], predictions[-1]["model"]["run"], 50)
    with pytest.raises(HistoryError, match="no state of run"):
        rebuild(records, "another-run", 50)


@pytest.mark.parametrize("config", [[], ["--variant", "margin", "--margin", "0.5"], ["--hash-features", "8"]])
def test_a_version_is_rebuilt_as_the_model_that_reached_it(tmp_path, config):
    """``model at VERSION``: the weights once the change that made the version was learned. The plain, margin and
    hashed perceptrons change only by their updates, so every event scored at that version (its step made no
    update) was scored by exactly those weights."""
    batches = _batches("named", 4, config)
    sent = _run(tmp_path, [*config, *HISTORY], batches, True)
    records = [decode_record(v) for t, _, v in sent if t == "history"]
    events = _events(batches)
    scored = [json.loads(v) for t, _, v in sent if t == "predictions"]
    kept = [p for p in scored if p["mistake"] is False or p["y"] is None]
    assert len(kept) > 50
    for p in kept:
        version, run = p["model"]["version"], p["model"]["run"]
        assert runs_at(records, version) == [run]
        model = rebuild(records, run, version=version)
        assert model.updates == version
        assert repr(model.score_one(events[p["source"]["offset"]])) == repr(p["score"])
    last = scored[-1]["model"]["version"]
    with pytest.raises(HistoryError, match=f"does not reach version {last + 1}"):
        rebuild(records, scored[-1]["model"]["run"], version=last + 1)


def _point(offset: int, features: dict, y: int) -> Record:
    value = json.dumps({"features": features, "y": y}).encode()
    return Record("points", 0, offset, None, value, 1_700_000_000_000 + offset)


def test_a_state_too_large_for_one_record_goes_in_parts_and_a_part_lost_or_altered_is_refused(tmp_path):
    """A model of 50,000 named features is ~1.5 MB of JSON, past the brokers' 1 MB default: its state goes in
    parts after its record, each record within what the history topic takes (here a topic of max.message.bytes
    1,200), and a changes record past it is cut in halves; both rebuild as well. A part missing or altered leaves
    that state unread, said as such, never a model of other weights."""
    limits = RecordLimits({"history": 1_200}, default=1 << 20)
    rng = random.Random(6)
    points = [
        _point(offset, {f"f{offset}-{j}": rng.uniform(-2, 2) for j in range(12)}, rng.choice([1, -1]))
        for offset in range(120)
    ]  # a model of 1,440 features: its state in many parts
    batches = cut(points, [rng.randint(1, 40) for _ in range(6)])
    flags = ["--variant", "averaged", "--max-message-bytes", "8192", *HISTORY]
    sent = _run(tmp_path, flags, batches, True, limits=limits)
    history = [(k, v) for t, k, v in sent if t == "history"]
    assert all(limits.too_large("history", k, v) is None for k, v in history)
    assert max(len(k) + len(v) for k, v in history) > limits.of("history") - 200  # parts fill the room
    records = [decode_record(v) for _, v in history]
    assert sum(r["kind"] == "part" for r in records) > 10
    assert any(r["kind"] == "state" and r["model"] is None and r["parts"] > 1 for r in records)
    events = _events(batches)
    predictions = [json.loads(v) for t, _, v in sent if t == "predictions"]
    for p in predictions:
        model = rebuild(records, p["model"]["run"], seen=p["model"]["seen"])
        (_, score, _), _, _ = model.explain_step(events[p["source"]["offset"]], None)
        assert repr(score) == repr(p["score"])
    part = next(r for r in records if r["kind"] == "part")  # a part of the first state written in parts
    run, after = part["run"], part["seen"] + 1  # the event after that state: rebuilt from it
    with pytest.raises(HistoryError, match="parts are missing"):
        rebuild([r for r in records if r is not part], run, seen=after)
    altered = {**part, "data": base64.b64encode(b"x" * len(base64.b64decode(part["data"]))).decode()}
    with pytest.raises(HistoryError, match="altered"):
        rebuild([altered if r is part else r for r in records], run, seen=after)
    with pytest.raises(HistoryError, match="altered"):
        rebuild([*records, altered], run, seen=after)  # two different copies of one part


def test_a_change_larger_than_the_history_topic_takes_is_a_gap_said_and_the_next_state_closes_it(tmp_path, caplog):
    """An event larger than a record of the history's topic may be (its max.message.bytes below the input's)
    cannot be kept as a change: a ``gap`` record says which, and it is not sent to be refused (a poison pill under
    exactly-once). The predictions it made unrebuildable, up to the batch's end, are refused naming the version;
    the state the batch's end writes rebuilds the ones after it."""
    limits = RecordLimits({"history": 2_000}, default=1 << 20)

    wide = {f"feature-{i}": 1.0 for i in range(300)}  # ~5 KB: a mistake of the zero model, so a change
    batches = [
        [_point(0, {"a": 1.0}, -1), _point(1, wide, 1), _point(2, {"a": 2.0, "feature-7": 1.0}, 1)],
        [_point(3, {"a": 1.0, "feature-9": 3.0}, 1)],
    ]
    sent = _run(tmp_path, ["--max-message-bytes", "8192", *HISTORY], batches, True, limits=limits)
    history = [(k, v) for t, k, v in sent if t == "history"]
    assert all(limits.too_large("history", k, v) is None for k, v in history)
    records = [decode_record(v) for _, v in history]
    gaps = [r for r in records if r["kind"] == "gap"]
    assert len(gaps) == 1 and "longer than a record of topic history" in gaps[0]["why"]
    assert "left out its change" in caplog.text
    predictions = {p["source"]["offset"]: p for p in (json.loads(v) for t, _, v in sent if t == "predictions")}
    events = _events(batches)
    for offset in (0, 1, 3):  # before the gap's change, at it (the model before it), after the next state
        p = predictions[offset]
        model = rebuild(records, p["model"]["run"], seen=p["model"]["seen"])
        assert repr(model.score_one(events[offset])) == repr(p["score"])
    after = predictions[2]["model"]
    with pytest.raises(HistoryError, match=f"version {gaps[0]['version']} .* was left out"):
        rebuild(records, after["run"], seen=after["seen"])
    with pytest.raises(HistoryError, match="left out"):
        rebuild(records, after["run"], version=gaps[0]["version"])
    assert runs_at(records, gaps[0]["version"]) == [after["run"]]


CHALLENGED = {  # the task's flags with --history-challengers, and each challenger run as a champion
    "challengers": (["--challengers", "averaged,margin:0.5"], {"averaged": ["--variant", "averaged"],
                    "margin:0.5": ["--variant", "margin", "--margin", "0.5"]}),
    "labels-pocket": (["--label-topic", "labels", "--challengers", "pocket"],
                      {"pocket": ["--label-topic", "labels", "--variant", "pocket"]}),
    "standardize-hashed": (["--standardize", "--hash-features", "16", "--challengers", "averaged"],
                           {"averaged": ["--standardize", "--hash-features", "16", "--variant", "averaged"]}),
}  # fmt: skip


def _challengers_only(flags: list[str]) -> list[str]:
    i = flags.index("--challengers")
    return flags[:i] + flags[i + 2 :]


@pytest.mark.parametrize("batched", [True, False], ids=["batch", "each"])
@pytest.mark.parametrize("case", list(CHALLENGED))
def test_a_challenger_s_history_rebuilds_what_it_scored_each_event(tmp_path, case, batched):
    """--history-challengers: each challenger's records (keyed beside the champion's) rebuild, at a prediction's
    run and seen, the challenger that scored that event. What it scored is what the same model scores as a
    champion over the same stream, which publishes it: equal to the last bit, delayed labels, a scaler and
    hashing too."""
    flags, champions = CHALLENGED[case]
    batches = _batches("named", 13, flags)
    sent = _run(tmp_path, [*flags, *HISTORY, "--history-challengers"], batches, batched)
    events = _events(batches)
    predictions = [json.loads(v) for t, _, v in sent if t == "predictions"]
    by_key: dict[bytes, list[dict]] = {}
    for t, k, v in sent:
        if t == "history":
            by_key.setdefault(k, []).append(decode_record(v))
    for name, champion in champions.items():
        records = by_key[b"perceptron-stream/model/" + name.encode()]
        alone = _run(tmp_path, [*champion, *HISTORY], batches, batched, tag=name)
        scored = {json.loads(v)["source"]["offset"]: json.loads(v)["score"] for t, _, v in alone if t == "predictions"}
        assert len(scored) == len(predictions) > 100
        for p in predictions:
            model = rebuild(records, p["model"]["run"], seen=p["model"]["seen"])
            (_, score, _), _, _ = model.explain_step(events[p["source"]["offset"]], p["y"])
            assert repr(score) == repr(scored[p["source"]["offset"]]), (name, p)


def test_a_challenger_fresher_than_its_champion_counts_the_champion_s_events(tmp_path):
    """A challenger a checkpoint lacked starts from zero beside a champion that saw N events: its history counts
    the champion's events (a prediction's seen), so the predictions after it find its model."""
    batches = _batches("named", 17, [])
    factory, task = make_task(tmp_path, ["--challengers", "averaged", *HISTORY, "--history-challengers"], "t")
    sent = Sent()
    try:
        for records in batches[:4]:
            task.process(records, sent, Tally())
        assert task.models is not None
        task.models.challengers["averaged"] = factory.make_learner("averaged", 0.0)  # as a restore without it
        task.learner = task.learner.unwrapped()  # (a restore: a new run)
        first = len(sent)
        for records in batches[4:]:
            task.process(records, sent, Tally())
    finally:
        factory.close()
    later = sent[first:]
    alone = _run(tmp_path, ["--variant", "averaged", *HISTORY], batches[4:], True, tag="alone")
    scored = {json.loads(v)["source"]["offset"]: json.loads(v)["score"] for t, _, v in alone if t == "predictions"}
    records = [decode_record(v) for t, k, v in later if t == "history" and k.endswith(b"/averaged")]
    events = _events(batches)
    predictions = [json.loads(v) for t, _, v in later if t == "predictions"]
    assert predictions and min(p["model"]["seen"] for p in predictions) > 50
    for p in predictions:
        model = rebuild(records, p["model"]["run"], seen=p["model"]["seen"])
        (_, score, _), _, _ = model.explain_step(events[p["source"]["offset"]], p["y"])
        assert repr(score) == repr(scored[p["source"]["offset"]])


SECRET = "history-signing-key-0123"


def test_a_signed_history_rebuilds_as_an_unsigned_one_and_refuses_what_is_not_its_own(tmp_path):
    """With --checkpoint-key every record is signed as its key's (state, parts, changes; the champion's and a
    challenger's), within what the topic takes; read with the key each verifies and rebuilds every prediction as
    the unsigned history does. A byte changed, an unsigned record, a champion's record under the challenger's key
    (they share a run) or another key: refused, saying which."""
    limits = RecordLimits({"history": 1_500}, default=1 << 20)
    flags = ["--variant", "pocket", "--challengers", "averaged", "--history-challengers", *HISTORY]
    batches = _batches("named", 7, flags)
    signed = _run(tmp_path, [*flags, "--checkpoint-key", SECRET], batches, True, "signed", limits)
    unsigned = _run(tmp_path, flags, batches, True, "unsigned", limits)
    history = [(k, v) for t, k, v in signed if t == "history"]
    assert all(limits.too_large("history", k, v) is None for k, v in history)
    assert {k for k, _ in history} == {b"perceptron-stream/model", b"perceptron-stream/model/averaged"}
    key = SECRET.encode()
    records = [decode_record(v, k, key) for k, v in history]
    assert all(isinstance(r.pop("hmac"), str) for r in records)
    assert {r["kind"] for r in records} == {"state", "changes"}
    plain = [decode_record(v) for t, _, v in unsigned if t == "history"]
    assert [(r["kind"], r["op"]) for r in records] == [(r["kind"], r["op"]) for r in plain]
    events = _events(batches)
    champion = [r for (k, _), r in zip(history, records) if k == b"perceptron-stream/model"]
    for p in (json.loads(v) for t, _, v in signed if t == "predictions"):
        (_, score, _), _, _ = rebuild(champion, p["model"]["run"], p["model"]["seen"]).explain_step(
            events[p["source"]["offset"]], None
        )
        assert repr(score) == repr(p["score"])
    k, v = history[3]
    flipped = v.replace(b'"op":', b'"op": ', 1)  # the same JSON, another byte
    with pytest.raises(HistoryError, match="signature does not match"):
        decode_record(flipped, k, key)
    with pytest.raises(HistoryError, match="not signed"):
        decode_record(next(v for t, kk, v in unsigned if t == "history" and kk == k), k, key)
    moved = b"perceptron-stream/model/averaged" if k == b"perceptron-stream/model" else b"perceptron-stream/model"
    with pytest.raises(HistoryError, match="moved from another model's history"):
        decode_record(v, moved, key)
    with pytest.raises(HistoryError, match="another --checkpoint-key"):
        decode_record(v, k, b"another-key-of-16-bytes")
    assert decode_record(flipped)["op"] == records[3]["op"]  # without the key: read as it is (the score's check holds)


def test_a_signed_state_in_parts_is_signed_part_by_part_within_the_topic_s_limit():
    """A state past a record's room goes in parts, each signed and still within the topic's limit (its room less
    the signature's bytes), and rebuilds from them; one part unsigned with the key is refused."""
    history = History(b"g/model", 1000, "history", max_record_bytes=1_200, signing_key=SECRET.encode())
    learner = Recorded(Perceptron(), history)
    run = history.begin(learner)
    for i in range(60):
        learner.step({f"feature-{i}-{j}": float(i + j) for j in range(5)}, 1 if i % 2 else -1)
    history.state(learner, SNAPSHOT)
    values = history.take()
    assert max(len(b"g/model") + len(v) for v in values) <= 1_200
    records = [decode_record(v, b"g/model", SECRET.encode()) for v in values]
    assert sum(r["kind"] == "part" for r in records) > 3
    rebuilt = rebuild(records, run, version=learner.updates)
    assert rebuilt.to_state() == learner.unwrapped().to_state()
    part = next(v for v, r in zip(values, records) if r["kind"] == "part")
    with pytest.raises(HistoryError, match="not signed"):
        decode_record(part[: -SIGNATURE_BYTES - 1] + b"}", b"g/model", SECRET.encode())
