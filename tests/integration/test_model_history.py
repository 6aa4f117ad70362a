"""The model history on Apache Kafka: every published prediction, first copies and the copies a SIGKILL made the
service publish again, is explained by the weights that made it (``perceptron-stream explain``), to the last bit
of its score; a history altered afterwards is refused, naming why.

The service runs as real processes on the credit stream (named features, its policy changing midway), is SIGKILLed
mid-stream and restarted: under at-least-once the events after its last checkpoint are predicted again by a new
run (two copies, each naming its run); under exactly-once the killed run's open transaction is aborted, its history
records with it.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from itertools import islice

import pytest
from perceptron_stream.config import KafkaSettings
from perceptron_stream.explain import ExplainError, explain_prediction
from perceptron_stream.kafka import read_partition
from perceptron_stream.pipeline.history import decode_record, history_key
from perceptron_stream.streams import credit

from tests.support.launch import settings_args, start_service_process
from tests.support.service import OutputWatcher, stop_process, store_args, tail, wait_assigned
from tests.support.topics import produce
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

COUNT = 4000
CASES = {
    "kafka-python-at-least-once-plain": ("kafka-python", [], {}),
    "confluent-exactly-once-standardized-averaged": (
        "confluent",
        ["--standardize", "--variant", "averaged"],
        {"processing_guarantee": "exactly-once", "commit_interval_ms": 100},
    ),
}


def _read(bootstrap: str, topic: str) -> list[tuple[int, bytes | None, bytes]]:
    """(offset, key, value) of the committed records of ``topic[0]`` (none of them a tombstone here)."""
    return [
        (o, k, v or b"") for o, k, v in read_partition(KafkaSettings(bootstrap_servers=bootstrap), topic, 0, None, 60)
    ]


def _explain_cli(bootstrap: str, prediction: str, history: str, group: str, fmt: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "perceptron_stream.cli", "explain", "--prediction", prediction,
         "--model-history-topic", history, "--group-id", group, "--bootstrap-servers", bootstrap, "--format", fmt],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_every_prediction_across_a_sigkill_is_explained_by_the_weights_that_made_it(
    apache_kafka, tmp_path, topics, case
):
    client, flags, guarantee = CASES[case]
    bootstrap = apache_kafka.bootstrap_servers
    history = f"history-{topics['group_id']}"
    events = [{"id": f"c-{i}", **e} for i, e in enumerate(islice(credit(drift_every=COUNT // 2), COUNT))]
    produce(bootstrap, topics["input_topic"], events, keys=[e["id"].encode() for e in events])
    args = (
        settings_args(
            apache_kafka,
            topics,
            tmp_path,
            kafka_client=client,
            batch_size=100,
            model_history_topic=history,
            history_snapshot_every=200,
            **guarantee,
            **store_args("kafka", topics),
        )
        + flags
    )
    watcher = OutputWatcher(bootstrap, topics["output_topic"], read_committed=True).start()
    process = None
    try:
        process = start_service_process(args, tmp_path / "serve-0.log")
        wait_until(
            lambda: watcher.distinct() >= COUNT // 3 or process.poll() is not None, 180, interval=0.005, what="a third"
        )
        assert process.poll() is None, tail(tmp_path / "serve-0.log")
        process.kill()
        process.wait()
        log_path = tmp_path / "serve-1.log"
        process = start_service_process(args, log_path)
        wait_assigned(process, log_path, topics["input_topic"])
        wait_until(lambda: watcher.distinct() >= COUNT or process.poll() is not None, 180, what="every event")
        assert stop_process(process, log_path) == 0, tail(log_path)
        watcher.settle()
    finally:
        if process is not None and process.poll() is None:
            process.kill()
        watcher.stop()
    inputs = {offset: (key, value) for offset, key, value in _read(bootstrap, topics["input_topic"])}
    predictions = [(offset, json.loads(value)) for offset, _, value in _read(bootstrap, topics["output_topic"])]
    key = history_key(topics["group_id"], "model")
    records = [decode_record(value) for _, k, value in _read(bootstrap, history) if k == key]
    runs = {doc["model"]["run"] for _, doc in predictions}
    assert len(runs) >= 2, runs  # the restart began a run of its own
    assert {r["run"] for r in records if r["kind"] == "state" and r["cause"] == "start"} >= runs
    by_source: dict[int, list] = {}
    for offset, doc in predictions:
        by_source.setdefault(doc["source"]["offset"], []).append((offset, doc))
    assert set(by_source) == set(range(COUNT))
    again = [copies for copies in by_source.values() if len(copies) > 1]
    if guarantee:
        assert not again  # each event published once
    rng = random.Random(37)
    chosen = rng.sample(predictions, 300) + [copy for copies in again for copy in copies]
    for _, doc in chosen:
        key_, event = inputs[doc["source"]["offset"]]
        answer = explain_prediction(doc, event, key_, records)  # refuses unless the score is the published one
        assert answer["score"] == doc["score"] and answer["y_pred"] == doc["y_pred"]
        total = sum(r["contribution"] for r in answer["reasons"]) + answer["bias"]
        assert abs(total - doc["score"]) <= 1e-12 * (1 + sum(abs(r["contribution"]) for r in answer["reasons"]))
    # the command, as a person runs it: the prediction's topic position, the history, the group
    offset, doc = predictions[-1]
    done = _explain_cli(bootstrap, f"{topics['output_topic']}:0:{offset}", history, topics["group_id"], "json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["score"] == doc["score"] and answer["model"]["run"] == doc["model"]["run"]
    assert {r["feature"] for r in answer["reasons"]} == {"age", "salary", "years_in_job", "debt"}
    done = _explain_cli(bootstrap, f"{topics['output_topic']}:0:{offset}", history, topics["group_id"], "text")
    assert done.returncode == 0 and f"event {doc['id']}" in done.stdout and "bias" in done.stdout, done.stderr


def test_an_altered_history_is_refused_naming_why(apache_kafka, tmp_path, topics):
    """A change of the history rewritten (a copy of a record with one event's values altered, appended as anyone
    with write access could): the predictions after it rebuild another score, and explain refuses them (exit 1)."""
    bootstrap = apache_kafka.bootstrap_servers
    history = f"history-{topics['group_id']}"
    events = [{"id": f"c-{i}", **e} for i, e in enumerate(islice(credit(), 1000))]
    produce(bootstrap, topics["input_topic"], events)
    args = settings_args(apache_kafka, topics, tmp_path, model_history_topic=history)
    watcher = OutputWatcher(bootstrap, topics["output_topic"]).start()
    try:
        process = start_service_process(args, tmp_path / "serve.log")
        wait_until(lambda: watcher.distinct() >= 1000 or process.poll() is not None, 180, what="every event")
        assert stop_process(process, tmp_path / "serve.log") == 0
    finally:
        watcher.stop()
    key = history_key(topics["group_id"], "model")
    records = [decode_record(value) for _, k, value in _read(bootstrap, history) if k == key]
    changes = next(r for r in records if r["kind"] == "changes" and len(r["changes"]) > 5)
    kind, seen, x, y = changes["changes"][2]
    changes["changes"][2] = [kind, seen, {name: value * 3.0 + 1.0 for name, value in x.items()}, y]
    produce(bootstrap, history, [json.dumps(changes).encode()], keys=[key])
    predictions = [(offset, json.loads(value)) for offset, _, value in _read(bootstrap, topics["output_topic"])]
    after = [(o, d) for o, d in predictions if seen < d["model"]["seen"] <= seen + 200]
    inputs = {offset: (k, value) for offset, k, value in _read(bootstrap, topics["input_topic"])}
    tampered = [decode_record(value) for _, k, value in _read(bootstrap, history) if k == key]
    refused = []
    for offset, doc in after:
        try:
            explain_prediction(doc, inputs[doc["source"]["offset"]][1], None, tampered)
        except ExplainError as exc:
            refused.append((offset, str(exc)))
    assert refused, "the altered change went unnoticed"
    offset, why = refused[0]
    assert "altered" in why
    done = _explain_cli(bootstrap, f"{topics['output_topic']}:0:{offset}", history, topics["group_id"], "text")
    assert done.returncode == 1 and "altered" in done.stderr and not done.stdout, (done.stdout, done.stderr)
