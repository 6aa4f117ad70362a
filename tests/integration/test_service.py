"""The service end to end against the embedded broker, over TCP."""

from __future__ import annotations

import json
import random
from typing import Any

from perceptron_stream.learning import make_learner
from perceptron_stream.streams import separable

from tests.support.endpoints import http_get, metrics_once
from tests.support.launch import settings_args, start_service_process
from tests.support.service import stop_process
from tests.support.topics import consume, create_topic, produce
from tests.support.waiting import wait_until


def _offline(events, variant="plain"):
    """The learner run in-process over the same events in the same order."""
    learner = make_learner(variant)
    return [tuple(learner.step(e["x"], e.get("y"))) for e in events]


def _by_seen(records):
    return sorted((json.loads(r.value) for r in records), key=lambda p: p["model"]["seen"])


def test_every_event_is_predicted_as_the_offline_learner_would(broker, topics, tmp_path, service_thread, kafka_client):
    events = [dict(e) for e, _ in zip(separable(dimensions=5, margin=0.05, noise=0.0, seed=3), range(3000))]
    produce(broker.bootstrap_servers, topics["input_topic"], events, keys=[e["id"].encode() for e in events])
    service = service_thread(settings_args(broker, topics, tmp_path))

    predictions = _by_seen(consume(broker.bootstrap_servers, topics["output_topic"], len(events)))
    service.stop()

    assert len(predictions) == len(events)
    assert [p["source"]["offset"] for p in predictions] == list(range(len(events)))  # one partition: in order
    got = [(p["y_pred"], p["score"], p["mistake"]) for p in predictions]
    assert got == _offline(events)
    assert [p["id"] for p in predictions] == [e["id"] for e in events]
    assert predictions[-1]["model"]["mistakes"] == sum(p["mistake"] for p in predictions)
    assert (
        0 < predictions[-1]["model"]["version"] == predictions[-1]["model"]["mistakes"]
    )  # plain: one update per mistake


def test_keys_pass_through_and_partitions_follow_the_processing_order(
    broker, topics, tmp_path, service_thread, kafka_client
):
    create_topic(broker.bootstrap_servers, topics["input_topic"], partitions=3)
    events = [dict(e) for e, _ in zip(separable(dimensions=3, margin=0.05, seed=9), range(1500))]
    keys = [f"k{i % 17}".encode() for i in range(len(events))]
    produce(broker.bootstrap_servers, topics["input_topic"], events, keys=keys)
    service = service_thread(settings_args(broker, topics, tmp_path))
    records = consume(broker.bootstrap_servers, topics["output_topic"], len(events))
    service.stop()

    by_source = {
        (json.loads(r.value)["source"]["partition"], json.loads(r.value)["source"]["offset"]): r for r in records
    }
    assert len(by_source) == len(events)
    for record in records:
        prediction = json.loads(record.value)
        assert record.key == keys[int(prediction["id"].split("-")[1])]
    # the model is one model over all partitions: replaying in the order it saw them gives the same predictions
    predictions = _by_seen(records)
    assert [p["model"]["seen"] for p in predictions] == list(range(1, len(events) + 1))
    event_by_id = {e["id"]: e for e in events}
    assert [(p["y_pred"], p["score"], p["mistake"]) for p in predictions] == _offline(
        [event_by_id[p["id"]] for p in predictions]
    )


def test_unlabeled_events_are_predicted_and_not_learned(broker, topics, tmp_path, service_thread):
    labeled = [{"id": f"l{i}", "x": [1.0, float(i % 3) - 1], "y": 1 if i % 2 else -1} for i in range(50)]
    unlabeled = [{"id": f"u{i}", "x": [1.0, 2.0]} for i in range(20)] + [{"id": "n", "x": [0.5, 0.5], "y": None}]
    produce(broker.bootstrap_servers, topics["input_topic"], labeled + unlabeled)
    service = service_thread(settings_args(broker, topics, tmp_path))
    predictions = _by_seen(consume(broker.bootstrap_servers, topics["output_topic"], 71))
    service.stop()

    tail = predictions[50:]
    assert all(p["y"] is None and p["mistake"] is None for p in tail)
    assert len({p["model"]["version"] for p in tail}) == 1  # no update from unlabeled events
    assert len({p["score"] for p in tail[:20]}) == 1  # same point, same weights, same score
    assert tail[-1]["model"]["seen"] == 71


def _malformed(max_bytes: int) -> list[tuple[bytes | None, str]]:
    """100 bad messages of many kinds, with the reason each must get."""
    kinds = [
        (b"not json", "invalid_json"),
        (b'{"x": [1, 2', "invalid_json"),
        (b"\xff\xfe\x00garbage", "not_utf8"),
        (b'"just a string"', "invalid_event"),
        (b"[1, 2, 3]", "invalid_event"),
        (b'{"x": ["a", 2]}', "invalid_event"),
        (b'{"x": [NaN, 1]}', "non_finite"),
        (b'{"x": [1e999, 1]}', "non_finite"),
        (b"{}", "invalid_event"),
        (b'{"x": [1, 2], "features": {"a": 1}}', "invalid_event"),
        (b'{"x": [1, 2, 3], "y": 1}', "wrong_dimension"),
        (b'{"x": [1, 2], "y": 2}', "bad_label"),
        (b'{"x": [1, 2], "y": "yes"}', "bad_label"),
        (b'{"x": [' + b"1," * max_bytes + b"1]}", "too_large"),
        (b'{"features": {"a": "b"}}', "invalid_event"),
        (b'{"x": "12"}', "invalid_event"),
        (b'{"x": [1, true]}', "invalid_event"),
        (b'{"x": []}', "invalid_event"),
        (None, "invalid_event"),
        (b'{"x": [1, 2], "id": {"a": 1}}', "invalid_event"),
    ]
    return [kinds[i % len(kinds)] for i in range(100)]


def test_malformed_messages_become_dead_letters_and_good_ones_flow(
    broker, topics, tmp_path, service_thread, kafka_client
):
    bad = _malformed(max_bytes=2000)
    good = [{"id": f"g{i}", "x": [random.Random(i).uniform(-1, 1), 1.0], "y": 1 if i % 3 else -1} for i in range(300)]
    stream = [(g, None) for g in good[:1]] + [(b, r) for b, r in bad]  # a good one first fixes d = 2
    rng = random.Random(0)
    rest = [(g, None) for g in good[1:]]
    for item in rest:
        stream.insert(rng.randrange(1, len(stream) + 1), item)
    # a tombstone (null value) needs a key
    produce(broker.bootstrap_servers, topics["input_topic"], [v for v, _ in stream], keys=[b"k"] * len(stream))
    service = service_thread(settings_args(broker, topics, tmp_path, max_message_bytes=2000))

    letters = consume(broker.bootstrap_servers, topics["dlq_topic"], 100)
    assert all(len(r.key or b"") + len(r.value) <= 2000 for r in letters)  # within --max-message-bytes, like inputs
    predictions = consume(broker.bootstrap_servers, topics["output_topic"], 300)
    status = http_get(service.metrics_url + "/metrics")[0]
    metrics = metrics_once(service.metrics_url, 'perceptron_rejected_events_total{reason="bad_label"} 10.0')
    assert service.thread.is_alive()
    service.stop()

    expected_offsets = {i: reason for i, (_, reason) in enumerate(stream) if reason}
    got = {json.loads(r.value)["source"]["offset"]: json.loads(r.value) for r in letters}
    assert sorted(got) == sorted(expected_offsets)
    for offset, letter in got.items():
        assert letter["reason"] == expected_offsets[offset], letter
        assert letter["error"] and len(letter["error"]) < 300
        assert letter["source"]["topic"] == topics["input_topic"]
        original = stream[offset][0] or b""
        if letter["raw_encoding"] == "utf-8":
            kept = letter["raw"].encode()
            assert original.startswith(kept) and letter["raw_truncated"] == (len(kept) < len(original))
            if len(original) <= 1000:  # room enough: kept whole; the too_large one (4 KB) is cut to fit
                assert kept == original
    assert sorted(json.loads(r.value)["id"] for r in predictions) == sorted(g["id"] for g in good)
    assert status == 200
    assert 'perceptron_rejected_events_total{reason="bad_label"} 10.0' in metrics


def test_restart_resumes_where_it_stopped_and_skips_nothing(broker, topics, tmp_path, service_thread, kafka_client):
    events = [dict(e) for e, _ in zip(separable(dimensions=4, margin=0.05, noise=0.05, seed=5), range(2000))]
    produce(broker.bootstrap_servers, topics["input_topic"], events[:1000])
    first = service_thread(settings_args(broker, topics, tmp_path))
    consume(broker.bootstrap_servers, topics["output_topic"], 1000)
    first.stop()
    produce(broker.bootstrap_servers, topics["input_topic"], events[1000:])
    second = service_thread(settings_args(broker, topics, tmp_path))
    records = consume(broker.bootstrap_servers, topics["output_topic"], 2000)
    second.stop()

    predictions = _by_seen(records)
    assert [p["source"]["offset"] for p in predictions] == list(range(2000))  # none skipped, none repeated
    assert [(p["y_pred"], p["score"], p["mistake"]) for p in predictions] == _offline(events)


def test_sigterm_mid_stream_exits_zero_and_loses_nothing(broker, topics, tmp_path):
    events = [dict(e) for e, _ in zip(separable(dimensions=10, margin=0.02, noise=0.05, seed=8), range(30000))]
    produce(broker.bootstrap_servers, topics["input_topic"], events)
    args = settings_args(broker, topics, tmp_path, batch_size=200)
    process = start_service_process(args, tmp_path / "serve.log")
    try:
        # the process's start, its group join and its first batch: a loaded machine may take a while
        consume(broker.bootstrap_servers, topics["output_topic"], 1, timeout=120)
        # the service's own stop deadline is 15 s (then it exits 1): wait past it, the exit code tells
        code = stop_process(process, tmp_path / "serve.log")
    finally:
        if process.poll() is None:
            process.kill()
    assert code == 0, (tmp_path / "serve.log").read_text()[-3000:]

    # a restarted service picks up exactly where the stopped one committed
    process = start_service_process(args, tmp_path / "serve2.log")
    try:
        records = consume(broker.bootstrap_servers, topics["output_topic"], len(events), timeout=120)
    finally:
        stop_process(process, tmp_path / "serve2.log")
    predictions = _by_seen(records)
    assert [p["source"]["offset"] for p in predictions] == list(range(len(events)))
    assert [(p["y_pred"], p["score"], p["mistake"]) for p in predictions] == _offline(events)


def test_missing_topics_with_creation_off_fail_with_a_clear_message(broker, topics, tmp_path):
    import subprocess
    import sys

    from tests.support import ROOT

    args = settings_args(broker, topics, tmp_path, create_topics=False)
    result = subprocess.run(
        [sys.executable, "-m", "perceptron_stream.cli", "serve", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 1
    assert (
        f"topics {topics['input_topic']}, {topics['output_topic']}, {topics['dlq_topic']} do not exist and create_topics is off"
        in result.stderr
    )
    # the brokers answered that: not "could not reach the brokers", and said once
    assert "could not check the topics: topics" in result.stderr and "reach the brokers" not in result.stderr
    assert result.stderr.count("do not exist and create_topics is off") == 1, result.stderr


def test_topics_are_created_with_the_configured_partitions(broker, topics, tmp_path, service_thread):
    from kafka import KafkaConsumer

    service = service_thread(settings_args(broker, topics, tmp_path, topic_partitions=3))
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers)
    try:
        for name in ("input_topic", "output_topic", "dlq_topic"):
            assert wait_until(lambda name=name: consumer.partitions_for_topic(topics[name]), 30, what=name) == {0, 1, 2}
    finally:
        consumer.close()
        service.stop()


def test_open_ended_feature_names_keep_the_model_bounded_and_lose_no_event(broker, topics, tmp_path, service_thread):
    """Issue 12: 20 events of 10,000 new names each, some unlabeled; the model stays at the cap, every event is
    predicted (on its known features), and the features left out are counted, in the metric and the checkpoint."""
    from perceptron_stream.state.local import LocalStore

    cap, rng = 25_000, random.Random(12)
    events = []
    for i in range(20):
        event: dict[str, Any] = {
            "id": f"e{i}",
            "features": {
                f"{i:02d}/token-{j:05d}-{rng.randrange(10**6):06d}": round(rng.uniform(-1, 1), 3) for j in range(10_000)
            },
        }
        if i % 4 != 1:  # events 1, 5, 9, 13 and 17 come unlabeled
            event["y"] = 1 if i % 3 else -1
        events.append(event)
    offline = make_learner("averaged", standardize=True, max_features=cap)
    expected = [tuple(offline.step(e["features"], e.get("y"))) for e in events]
    assert offline.dropped_features == 15 * 10_000 - cap  # the labeled events' names past the cap
    produce(broker.bootstrap_servers, topics["input_topic"], events)
    service = service_thread(
        settings_args(broker, topics, tmp_path, variant="averaged", standardize=True, max_model_features=cap)
    )

    predictions = _by_seen(consume(broker.bootstrap_servers, topics["output_topic"], len(events)))
    wait_until(
        lambda: (
            f"perceptron_dropped_features_total {offline.dropped_features:.1f}"
            in http_get(service.metrics_url + "/metrics")[1]
        ),
        30,
        what="the dropped features counted",
    )
    service.stop()

    assert [p["id"] for p in predictions] == [e["id"] for e in events]  # every event predicted, none lost
    assert [(p["y_pred"], p["score"], p["mistake"]) for p in predictions] == expected
    checkpoint = LocalStore(tmp_path / "state", topics["group_id"]).load("model")
    assert checkpoint is not None
    model = checkpoint.model
    assert len(model["perceptron"]["features"]) == len(model["scaler"]["counts"]) == cap
    assert model["perceptron"]["counters"]["dropped_features"] == offline.dropped_features
    assert checkpoint.meta["max_model_features"] == cap
    assert (
        max(path.stat().st_size for path in LocalStore(tmp_path / "state", topics["group_id"]).files("model"))
        < 8 * 1024 * 1024
    )
