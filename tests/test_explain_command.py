"""``perceptron-stream explain``'s answer, from a task's own outputs and history (no Kafka: its pure part).

The answer is the contract's object (version, score rebuilt, published_score, equal, reasons: every feature,
largest first); a prediction whose published score the history does not give is ``equal: false`` with a
message naming its version; a prediction of a service without the history says so."""

from __future__ import annotations

import json

import pytest
from perceptron_stream.explain import ExplainError, explain_prediction, text, unequal
from perceptron_stream.pipeline.history import decode_record
from perceptron_stream.pipeline.task import Tally

from tests.support.tasks import Sent, cut, make_task, stream_records


def _served(tmp_path, flags: list[str]):
    points = stream_records(21, 200, "named", 4)
    factory, task = make_task(tmp_path, [*flags, "--model-history-topic", "history", "--explain", "2"], "t")
    sent = Sent()
    try:
        for batch in cut(points, [37] * 6):
            task.process(batch, sent, Tally())
    finally:
        factory.close()
    records = [decode_record(v) for t, k, v in sent if t == "history" and k == b"perceptron-stream/model"]
    predictions = [json.loads(v) for t, _, v in sent if t == "predictions"]
    return {r.offset: r for r in points}, predictions, records, sent


@pytest.mark.parametrize("flags", [[], ["--variant", "averaged", "--standardize"]], ids=["plain", "averaged"])
def test_the_answer_is_the_contract_s_object_with_every_feature_largest_first(tmp_path, flags):
    points, predictions, records, _ = _served(tmp_path, flags)
    for p in predictions[::7]:
        r = points[p["source"]["offset"]]
        answer = explain_prediction(p, r.value, r.key, records)
        assert answer["equal"] and answer["score"] == answer["published_score"] == p["score"]
        assert answer["version"] == p["model"]["version"] and answer["run"] == p["model"]["run"]
        magnitudes = [abs(reason["contribution"]) for reason in answer["reasons"]]
        assert magnitudes == sorted(magnitudes, reverse=True)
        assert answer["reasons"][:2] == p["reasons"] and answer["bias"] == p["bias"]
        assert {reason["feature"] for reason in answer["reasons"]} == set(json.loads(r.value)["features"])
        shown = text(answer)
        assert shown.splitlines()[0].startswith(f"event {p['id']} (points[0] offset {r.offset})")
        assert "the published score to the last bit" in shown


def test_a_score_the_history_does_not_give_is_not_equal_and_names_its_version(tmp_path):
    points, predictions, records, _ = _served(tmp_path, [])
    p = predictions[-1]
    r = points[p["source"]["offset"]]
    forged = {**p, "score": p["score"] + 1.0}
    answer = explain_prediction(forged, r.value, r.key, records)
    assert not answer["equal"] and answer["published_score"] == p["score"] + 1.0
    why = unequal(answer)
    assert f"version {p['model']['version']} of run {p['model']['run']} is not rebuilt" in why
    assert "NOT the published score" in text(answer)


def test_a_prediction_without_a_run_or_history_is_refused_saying_why(tmp_path):
    points, predictions, records, _ = _served(tmp_path, [])
    p = predictions[0]
    r = points[p["source"]["offset"]]
    without = {**p, "model": {k: v for k, v in p["model"].items() if k != "run"}}
    with pytest.raises(ExplainError, match="without --model-history-topic"):
        explain_prediction(without, r.value, r.key, records)
    with pytest.raises(ExplainError, match=f"version {p['model']['version']} of run .* cannot be rebuilt"):
        explain_prediction(p, r.value, r.key, [])
    with pytest.raises(ExplainError, match="does not decode"):
        explain_prediction(p, b'{"features": ', r.key, records)


def test_a_challenger_s_answer_is_its_own_model_unchecked_by_a_published_score(tmp_path):
    """--history-challengers, explain --challenger: the challenger's score and parts by its own weights then (its
    version), said to be unchecked: a challenger publishes no score (equal and published_score null)."""
    flags = ["--challengers", "averaged", "--history-challengers"]
    points, predictions, champion, sent = _served(tmp_path, flags)
    theirs = [decode_record(v) for t, k, v in sent if t == "history" and k == b"perceptron-stream/model/averaged"]
    assert theirs and champion
    differ = 0
    for p in predictions[::5]:
        r = points[p["source"]["offset"]]
        answer = explain_prediction(p, r.value, r.key, theirs, "averaged")
        assert answer["challenger"] == "averaged" and answer["equal"] is None and answer["published_score"] is None
        total = sum(reason["contribution"] for reason in answer["reasons"]) + answer["bias"]
        assert abs(total - answer["score"]) <= 1e-12 * (1 + sum(abs(x["contribution"]) for x in answer["reasons"]))
        differ += answer["score"] != p["score"]  # its own weights: the average, not the champion's
    assert differ > len(predictions[::5]) // 2
    assert "challenger averaged's model" in text(answer) and "publishes no score" in text(answer)
    elsewhere = {**p, "model": {**p["model"], "run": "0123456789abcdef"}}  # a run its history does not hold
    with pytest.raises(ExplainError, match=r"challenger averaged's model at event \d+ of run 0123456789abcdef"):
        explain_prediction(elsewhere, r.value, r.key, theirs, "averaged")
