"""Checkpoints on disk and in Kafka, with real service processes: damaged
checkpoints, incompatible ones, no checkpoint yet, a second instance, and the
log cleaner compacting the checkpoint topic under a running service. The
guarantees run on Apache Kafka (tests/conftest.py); the tests about the
service alone (refusals of the state it finds) on the embedded broker.

The end state is always held to the same bar as the crash tests: every input
offset predicted, repeats identical, and the final model exactly the one an
uninterrupted run computes.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import ClassVar

import pytest
from perceptron_stream.config import ServeSettings, load
from perceptron_stream.kafka import CompactedTopic
from perceptron_stream.state.checkpoint import encode_checkpoint
from perceptron_stream.state.kafka_store import KafkaStore
from perceptron_stream.state.local import LocalStore

from tests.support.apache_kafka import create_compacting_topic, records_left
from tests.support.brokers import new_broker
from tests.support.launch import settings_args, start_service_process
from tests.support.service import (
    OutputWatcher,
    check_outputs,
    exit_code,
    final_checkpoint,
    make_events,
    offline,
    run_to_the_end,
    stop_process,
    store_args,
    tail,
)
from tests.support.topics import produce
from tests.support.waiting import wait_until

#: Guarantees are Apache Kafka's (tests/conftest.py): both stores on it. The embedded broker's own quirks that the
#: service works around are tested where they bite (test_trust: positions past a log's short end, the Kafka store
#: read past short end offsets).
STORES = ["kafka", "local"]


# damaged checkpoints ------------------------------------------------------
def _damage_local(args) -> list[str]:
    """Truncate the newest checkpoint file and break the checksum of the next; their names."""
    settings = load(ServeSettings, args)
    store = LocalStore(settings.state_dir, settings.group_id)
    newest, second, oldest = store.files("model")[:3]
    newest.write_bytes(newest.read_bytes()[: len(newest.read_bytes()) // 2])  # a write cut short
    body = json.loads(second.read_bytes())
    body["model"]["bias"] += 1.0  # valid JSON, wrong content: only the checksum can tell
    second.write_text(json.dumps(body))
    restored = store.load("model")
    assert restored is not None and restored.seq == int(oldest.stem.split("-")[1])
    return [newest.name, second.name]


def _damage_kafka(args) -> list[str]:
    """Write a truncated record over the newest checkpoint's key and a tampered one over the next."""
    settings = load(ServeSettings, args)
    topic = CompactedTopic(settings, settings.checkpoint_topic)
    store = KafkaStore(topic, settings.group_id)
    try:
        newest = store.load("model")
        assert newest is not None
        keys = [f"{settings.group_id}/{(newest.seq - age) % store.keep}" for age in (0, 1)]
        good = encode_checkpoint(newest)
        topic.put(keys[0].encode(), good[: len(good) // 2])
        body = json.loads(good)
        body["seq"] -= 1
        body["model"]["bias"] += 1.0
        topic.put(keys[1].encode(), json.dumps(body).encode())
        restored = store.load("model")
        assert restored is not None and restored.seq == newest.seq - 2
    finally:
        store.close()
    return keys


@pytest.mark.parametrize("store", ["local", "kafka"])
@pytest.mark.parametrize("kafka_broker", ["apache-kafka"], indirect=True)
def test_damaged_newest_checkpoints_fall_back_to_an_older_one_and_end_exact(kafka_broker, topics, tmp_path, store):
    broker = kafka_broker
    count, first_part = 8000, 5000
    events = make_events(count, seed=21)
    expected, model = offline(events)
    args = settings_args(
        broker, topics, tmp_path, batch_size=100, checkpoint_interval_events=500, **store_args(store, topics)
    )
    watcher = OutputWatcher(broker.bootstrap_servers, topics["output_topic"]).start()
    try:
        produce(broker.bootstrap_servers, topics["input_topic"], events[:first_part])
        run_to_the_end(args, watcher, first_part, tmp_path / "serve-1.log")
        damaged = (_damage_local if store == "local" else _damage_kafka)(args)

        produce(broker.bootstrap_servers, topics["input_topic"], events[first_part:])
        run_to_the_end(args, watcher, count, tmp_path / "serve-2.log")
        watcher.settle()
    finally:
        by_source = watcher.stop()

    log = (tmp_path / "serve-2.log").read_text()
    for name in damaged:
        assert name in log, log[-3000:]
    assert "unusable" in log and "truncated or corrupt" in log and "checksum does not match" in log, log[-3000:]
    assert check_outputs(by_source, expected) > 0  # the events after the older checkpoint were replayed
    checkpoint = final_checkpoint(args, store)
    assert checkpoint.positions == {(topics["input_topic"], 0): count}
    assert checkpoint.model == model


def _restart_refused(broker, topics, tmp_path, count: int, seed: int, damage) -> tuple[str, object]:
    """Run to the end, ``damage(store)`` the local state, start again: exit 1, no traceback, nothing published.

    The restart's log and the state directory.
    """
    produce(broker.bootstrap_servers, topics["input_topic"], make_events(count, seed=seed))
    args = settings_args(broker, topics, tmp_path, batch_size=100, checkpoint_interval_events=500)
    watcher = OutputWatcher(broker.bootstrap_servers, topics["output_topic"]).start()
    try:
        run_to_the_end(args, watcher, count, tmp_path / "serve-1.log")  # checkpoints, then commits them
        settings = load(ServeSettings, args)
        store = LocalStore(settings.state_dir, settings.group_id)
        state_dir = store.task_dir("model")
        damage(store)
        before = watcher.settle()
        records_before = watcher.records

        code = exit_code(args, tmp_path / "serve-2.log")
        time.sleep(1.0)
    finally:
        watcher.stop()
    log = (tmp_path / "serve-2.log").read_text()
    assert code == 1, log[-3000:]
    assert "Traceback" not in log
    assert (watcher.distinct(), watcher.records) == (before, records_before)  # nothing published from zero weights
    return log, state_dir


def test_every_checkpoint_damaged_stops_the_service_naming_the_state_dir(broker, topics, tmp_path):
    def lose_the_data_blocks(store):
        for path in store.files("model"):
            path.write_bytes(b"\x00" * 100)

    log, state_dir = _restart_refused(broker, topics, tmp_path, 3000, 22, lose_the_data_blocks)
    assert f"no usable checkpoint in {state_dir}" in log, log[-3000:]
    assert "move them away to start from zero weights" in log


def test_a_checkpoint_of_other_model_settings_is_refused(broker, topics, tmp_path):
    events = make_events(1000, seed=23)
    produce(broker.bootstrap_servers, topics["input_topic"], events)
    args = settings_args(broker, topics, tmp_path, checkpoint_interval_events=500)
    watcher = OutputWatcher(broker.bootstrap_servers, topics["output_topic"]).start()
    try:
        run_to_the_end(args, watcher, len(events), tmp_path / "serve-1.log")
    finally:
        watcher.stop()
    saved = final_checkpoint(args, "local")

    code = exit_code([*args, "--variant", "averaged"], tmp_path / "serve-2.log")
    log = (tmp_path / "serve-2.log").read_text()
    assert code == 2, log[-3000:]  # a bad setting: the group's model runs with another variant
    assert "invalid setting variant (--variant" in log, log[-3000:]
    assert "the checkpoint was taken with other model settings (variant was 'plain', now 'averaged')" in log, log[
        -3000:
    ]
    assert log.count("variant was 'plain', now 'averaged'") == 1, log[-3000:]  # said once (it was, each checkpoint)
    assert "Traceback" not in log
    assert final_checkpoint(args, "local") == saved  # left as it was


# no checkpoint yet ----------------------------------------------------------
@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("kafka_broker", ["apache-kafka"], indirect=True)
def test_a_crash_before_the_first_checkpoint_relearns_from_the_start(kafka_broker, topics, tmp_path, store):
    broker = kafka_broker
    """Offsets committed with no checkpoint behind them would skip events the lost model had learned."""
    count = 3000
    events = make_events(count, seed=24)
    expected, model = offline(events)
    produce(broker.bootstrap_servers, topics["input_topic"], events)
    args = settings_args(
        broker,
        topics,
        tmp_path,
        batch_size=100,
        checkpoint_interval_events=1_000_000,
        checkpoint_interval_seconds=3600,
        **store_args(store, topics),
    )
    watcher = OutputWatcher(broker.bootstrap_servers, topics["output_topic"]).start()
    try:
        process = start_service_process(args, tmp_path / "serve-1.log")
        try:
            wait_until(
                lambda: watcher.distinct() >= count or process.poll() is not None, 120, what="every offset predicted"
            )
            time.sleep(0.5)  # the loop turns a few more times: any commit it would make is made
        finally:
            process.kill()
            process.wait()
        assert final_checkpoint(args, store) is None
        run_to_the_end(args, watcher, count, tmp_path / "serve-2.log", records=2 * count)
        watcher.settle()
    finally:
        by_source = watcher.stop()
    assert check_outputs(by_source, expected) == count  # all learned again from zero, identically
    checkpoint = final_checkpoint(args, store)
    assert checkpoint.positions == {(topics["input_topic"], 0): count}
    assert checkpoint.model == model


# one instance per model -----------------------------------------------------
@pytest.mark.parametrize("store", STORES)
@pytest.mark.parametrize("kafka_broker", ["apache-kafka"], indirect=True)
def test_a_second_instance_of_the_same_model_fails_fast_and_the_first_goes_on(kafka_broker, topics, tmp_path, store):
    broker = kafka_broker
    count, first_part = 6000, 3000
    events = make_events(count, seed=25)
    expected, model = offline(events)
    produce(broker.bootstrap_servers, topics["input_topic"], events[:first_part])
    args = settings_args(
        broker, topics, tmp_path, batch_size=100, checkpoint_interval_events=500, **store_args(store, topics)
    )
    watcher = OutputWatcher(broker.bootstrap_servers, topics["output_topic"]).start()
    first = start_service_process(args, tmp_path / "serve-1.log")
    try:
        wait_until(
            lambda: watcher.distinct() >= first_part or first.poll() is not None, 120, what="the first part predicted"
        )
        # the same model again (same group, same state), e.g. a second replica by mistake
        code = exit_code(args, tmp_path / "serve-2.log")
        log = (tmp_path / "serve-2.log").read_text()
        assert code == 1, log[-3000:]
        if store == "local":
            settings = load(ServeSettings, args)
            state_dir = LocalStore(settings.state_dir, settings.group_id).task_dir("model")
            assert f"state directory {state_dir} is in use by pid {first.pid}" in log, log[-3000:]
        else:
            assert (
                f"consumer group {topics['group_id']} has 1 other member(s): processing nothing until they leave" in log
            )
            assert f"consumer group {topics['group_id']} still has 1 other active member(s) after 12 s" in log, log[
                -3000:
            ]
        assert "Traceback" not in log

        produce(broker.bootstrap_servers, topics["input_topic"], events[first_part:])
        wait_until(
            lambda: watcher.distinct() >= count or first.poll() is not None, 120, what="the second part predicted"
        )
        assert first.poll() is None, tail(tmp_path / "serve-1.log")
    finally:
        code = stop_process(first, tmp_path / "serve-1.log")
        by_source = watcher.stop()
    assert code == 0, tail(tmp_path / "serve-1.log")
    assert "Traceback" not in (tmp_path / "serve-1.log").read_text(), tail(tmp_path / "serve-1.log")
    check_outputs(by_source, expected)
    checkpoint = final_checkpoint(args, store)
    assert checkpoint.positions == {(topics["input_topic"], 0): count}
    assert checkpoint.model == model


# lost state -----------------------------------------------------------------
def test_committed_offsets_without_a_checkpoint_are_refused_not_a_silent_reset(broker, topics, tmp_path):
    """An emptied state directory (a new volume, say): going on would learn from mid-stream with zero weights."""

    def empty(store):
        for path in store.files("model"):
            path.unlink()

    log, state_dir = _restart_refused(broker, topics, tmp_path, 2000, 26, empty)
    assert (
        f"consumer group {topics['group_id']} has committed offsets on {topics['input_topic']} (partition 0 at 2000) "
        f"but the state store (local, {state_dir}) has no checkpoint"
    ) in log, log[-3000:]


def test_a_partition_the_restored_checkpoint_does_not_know_is_learned_from_its_start(broker, topics, tmp_path):
    """Fallback to a checkpoint older than a partition's first events: its committed offset (from the lost
    newer checkpoint) would skip them; the model must learn them, from where a new model starts."""
    from tests.support.topics import consume, create_topic

    create_topic(broker.bootstrap_servers, topics["input_topic"], partitions=2)
    events = make_events(2000, seed=27)
    args = settings_args(broker, topics, tmp_path, batch_size=100, checkpoint_interval_events=200)
    produce(broker.bootstrap_servers, topics["input_topic"], events[:1000], partition=0)
    process = start_service_process(args, tmp_path / "serve-1.log")
    try:
        wait_until(
            lambda: (
                (final_checkpoint(args, "local") or _NONE).positions.get((topics["input_topic"], 0)) == 1000
                or process.poll() is not None
            ),
            120,
            what="partition 0 checkpointed",
        )
    finally:
        assert stop_process(process, tmp_path / "serve-1.log") == 0, tail(tmp_path / "serve-1.log")
    older = final_checkpoint(args, "local")
    assert set(older.positions) == {(topics["input_topic"], 0)}

    # partition 1's events come in; the only checkpoint that has them is the last one
    produce(broker.bootstrap_servers, topics["input_topic"], events[1000:], partition=1)
    one_checkpoint = settings_args(
        broker, topics, tmp_path, batch_size=100, checkpoint_interval_events=1_000_000, checkpoint_interval_seconds=3600
    )
    process = start_service_process(one_checkpoint, tmp_path / "serve-2.log")
    try:
        consume(broker.bootstrap_servers, topics["output_topic"], 2000, timeout=120)
    finally:
        assert stop_process(process, tmp_path / "serve-2.log") == 0, tail(tmp_path / "serve-2.log")
    settings = load(ServeSettings, args)
    newest = LocalStore(settings.state_dir, settings.group_id).files("model")[0]
    assert json.loads(newest.read_bytes())["positions"] == [
        [topics["input_topic"], 0, 1000],
        [topics["input_topic"], 1, 1000],
    ]
    newest.write_bytes(newest.read_bytes()[:100])  # lost: the restart falls back to the older one

    process = start_service_process(args, tmp_path / "serve-3.log")
    try:
        wait_until(
            lambda: (
                (
                    (final_checkpoint(args, "local") or _NONE).positions
                    == {(topics["input_topic"], 0): 1000, (topics["input_topic"], 1): 1000}
                )
                or process.poll() is not None
            ),
            120,
            what="partition 1 learned again",
        )
    finally:
        assert stop_process(process, tmp_path / "serve-3.log") == 0, tail(tmp_path / "serve-3.log")
    assert final_checkpoint(args, "local").model["counters"]["seen"] == 2000  # partition 1 learned, once


class _NONE:  # a stand-in for "no checkpoint yet" in the waits above
    positions: ClassVar[dict] = {}


# no store -------------------------------------------------------------------
def test_a_storeless_service_is_ready_and_resumes_from_its_commits(broker, topics, tmp_path, service_thread):
    from tests.support.endpoints import http_get
    from tests.support.topics import consume

    events = make_events(500, seed=28)
    produce(broker.bootstrap_servers, topics["input_topic"], events)
    args = settings_args(broker, topics, tmp_path, state_store="none")
    service = service_thread(args)
    wait_until(lambda: http_get(service.metrics_url + "/readyz")[0] == 200, 60, what="/readyz 200 without a store")
    assert len(consume(broker.bootstrap_servers, topics["output_topic"], 500)) == 500
    service.stop()
    assert not (tmp_path / "state").exists()  # nothing written

    produce(broker.bootstrap_servers, topics["input_topic"], events[:100])
    service = service_thread(args)
    outputs = consume(broker.bootstrap_servers, topics["output_topic"], 600)
    time.sleep(1.0)
    outputs = consume(broker.bootstrap_servers, topics["output_topic"], 600)
    assert sorted(json.loads(m.value)["source"]["offset"] for m in outputs) == list(
        range(600)
    )  # resumed at 500, no repeats


# the log cleaner ---------------------------------------------------------------
def test_the_log_cleaner_compacts_the_checkpoint_topic_and_the_newest_checkpoint_is_still_restored(topics, tmp_path):
    """Apache Kafka only: the embedded broker never compacts. The topic holds one record per slot's newest
    checkpoint (and the active segment) once the cleaner has run; a restart restores the newest and ends exact."""
    with new_broker("apache-kafka", tmp_path) as apache_kafka:  # its cleaner serves this test's topic alone
        _compact_then_restore(apache_kafka, topics, tmp_path)


def _compact_then_restore(apache_kafka, topics, tmp_path) -> None:
    count, first_part = 6000, 3000
    events = make_events(count, seed=25)
    expected, model = offline(events)
    args = settings_args(
        apache_kafka, topics, tmp_path, batch_size=100, checkpoint_interval_events=200, **store_args("kafka", topics)
    )
    checkpoint_topic = load(ServeSettings, args).checkpoint_topic
    create_compacting_topic(apache_kafka.bootstrap_servers, checkpoint_topic)
    watcher = OutputWatcher(apache_kafka.bootstrap_servers, topics["output_topic"]).start()
    try:
        produce(apache_kafka.bootstrap_servers, topics["input_topic"], events[:first_part])
        run_to_the_end(args, watcher, first_part, tmp_path / "serve-1.log")
        newest = final_checkpoint(args, "kafka")
        written = records_left(apache_kafka.bootstrap_servers, checkpoint_topic)[1]
        assert written > 10, f"only {written} checkpoints written"
        # the cleaner wakes every second on the suite's broker; every segment but the active (newest) one is cleanable
        try:
            left = wait_until(
                lambda: (n := records_left(apache_kafka.bootstrap_servers, checkpoint_topic)[0]) < written and n,
                90,
                interval=1.0,
                what=f"the cleaner to compact {checkpoint_topic}",
            )
        except AssertionError as exc:
            cleaner = [line for line in Path(apache_kafka.info.log_path).read_text().splitlines() if "Cleaner" in line]
            raise AssertionError(
                f"{exc}: {records_left(apache_kafka.bootstrap_servers, checkpoint_topic)} (left, written); "
                "the broker's cleaner said:\n" + "\n".join(cleaner[-20:])
            ) from None

        produce(apache_kafka.bootstrap_servers, topics["input_topic"], events[first_part:])
        run_to_the_end(args, watcher, count, tmp_path / "serve-2.log")
        watcher.settle()
    finally:
        by_source = watcher.stop()
    print(f"checkpoint records: {written} written, {left} left after compaction")
    log = (tmp_path / "serve-2.log").read_text()
    assert f"restored checkpoint {newest.seq} of model" in log, log[-3000:]
    assert check_outputs(by_source, expected) == 0  # restored where the first run stopped: nothing predicted twice
    checkpoint = final_checkpoint(args, "kafka")
    assert checkpoint.positions == {(topics["input_topic"], 0): count}
    assert checkpoint.model == model
