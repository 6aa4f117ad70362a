"""State read back is input: checkpoints bound to their model, on real service processes and brokers.

Each case is one a new user or an attacker met (the trust issue): another
group on the same state directory, the same group against a fresh cluster or
a topic created again, a forged or garbage record on the checkpoint topic, a
FIFO where a checkpoint belongs, and version 0.1's flat state directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from perceptron_stream.config import ServeSettings, load
from perceptron_stream.kafka import CompactedTopic
from perceptron_stream.pipeline.mixer import mix_key
from perceptron_stream.state.checkpoint import decode_checkpoint, encode_checkpoint
from perceptron_stream.state.kafka_store import KafkaStore
from perceptron_stream.state.local import LocalStore

from tests.support import ROOT
from tests.support.brokers import new_broker
from tests.support.checkpoints import resealed
from tests.support.launch import settings_args, start_service_process
from tests.support.partitions import dealt_events, produce_dealt
from tests.support.service import (
    OutputWatcher,
    check_outputs,
    exit_code,
    final_checkpoint,
    has_traceback,
    make_events,
    offline,
    run_to_the_end,
    source_partition_offset,
    stop_process,
    store_args,
    tail,
)
from tests.support.topics import produce, read_all
from tests.support.waiting import wait_until


def _first_run(broker, topics, tmp_path, count=1000, seed=41, **extra) -> list[str]:
    """Serve ``count`` events to the end (checkpointed, committed); the args of that run."""
    produce(broker.bootstrap_servers, topics["input_topic"], make_events(count, seed=seed))
    args = settings_args(broker, topics, tmp_path, batch_size=100, checkpoint_interval_events=200, **extra)
    watcher = OutputWatcher(broker.bootstrap_servers, topics["output_topic"]).start()
    try:
        run_to_the_end(args, watcher, count, tmp_path / "serve-1.log")
    finally:
        watcher.stop()
    return args


def _refused(args, log_path) -> str:
    code = exit_code(args, log_path)
    log = log_path.read_text()
    assert code == 1, log[-3000:]
    assert not has_traceback(log), log[-3000:]
    return log


@pytest.mark.parametrize("kafka_broker", ["apache-kafka"], indirect=True)
def test_another_group_on_the_same_state_dir_starts_its_own_model(kafka_broker, topics, tmp_path):
    """Group B shares group A's --state-dir: B learns every event itself, never from A's checkpoint."""
    broker = kafka_broker
    events = make_events(1000, seed=41)
    _first_run(broker, topics, tmp_path)
    other = {**topics, "group_id": topics["group_id"] + "-b", "output_topic": topics["output_topic"] + "-b"}
    args = settings_args(broker, other, tmp_path, batch_size=100, checkpoint_interval_events=200)
    watcher = OutputWatcher(broker.bootstrap_servers, other["output_topic"]).start()
    try:
        run_to_the_end(args, watcher, len(events), tmp_path / "serve-b.log")
        watcher.settle()
    finally:
        by_source = watcher.stop()
    expected, model = offline(events)
    check_outputs(by_source, expected)  # 1,000 of 1,000 predicted, from zero weights
    assert final_checkpoint(args, "local").model == model
    assert final_checkpoint(settings_args(broker, topics, tmp_path), "local").positions == {
        (topics["input_topic"], 0): 1000
    }


@pytest.mark.parametrize(
    ("kafka_broker", "how"),
    [("apache-kafka", "fresh cluster"), ("apache-kafka", "topic created again"), ("embedded", "fresh cluster")],
    indirect=["kafka_broker"],
)
def test_the_same_group_on_a_new_log_refuses_then_starts_over_when_told(kafka_broker, tmp_path, topics, how):
    """Measured on 0.1: 0 of 1,000 events predicted, ready and healthy. Now: exit 1 naming the topic's
    new id (and, on Apache Kafka, whose every cluster has an id of its own, the cluster's); with
    --start-over, every event predicted by a new model.

    The first run is on the run's shared broker; the new log is the same topic created again there, or the
    topic on a fresh cluster of the test's own (the first one stays up: the service only sees another cluster
    at its address). The embedded broker's fresh cluster is the demo's case (its storage is memory only, and
    every instance reports the same cluster id); its topic created again would repeat Apache Kafka's case."""
    events = make_events(1000, seed=42)
    _first_run(kafka_broker, topics, tmp_path, seed=42)
    if how == "topic created again":
        from kafka import KafkaAdminClient

        admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers)
        try:
            admin.delete_topics([topics["input_topic"]])
            # gone before it is made again: while a deletion is pending, a create is refused ("already exists",
            # which create_topic lets pass) and the producer could write to the old topic or auto-create four
            # partitions
            wait_until(
                lambda: topics["input_topic"] not in admin.list_topics(), 60, what=f"{topics['input_topic']} deleted"
            )
        finally:
            admin.close()
        produce(kafka_broker.bootstrap_servers, topics["input_topic"], events)
        log = _check_refused_then_start_over(kafka_broker, topics, tmp_path, events)
        assert "cluster's id" not in log, log[-3000:]
        return
    with new_broker(kafka_broker.name, tmp_path / "second") as second:
        produce(second.bootstrap_servers, topics["input_topic"], events)
        log = _check_refused_then_start_over(second, topics, tmp_path, events)
    # the embedded broker reports one cluster id for every instance: only the topic's id tells them apart there
    assert ("the Kafka cluster's id is" in log) == (kafka_broker.name == "apache-kafka"), log[-3000:]


def _check_refused_then_start_over(broker, topics, tmp_path, events) -> str:
    """The refusal's log, after checking that --start-over then learns every event afresh."""
    topics = {**topics, "output_topic": topics["output_topic"] + "-again"}  # the first run's predictions stay apart
    args = settings_args(broker, topics, tmp_path, batch_size=100, checkpoint_interval_events=200)
    log = _refused(args, tmp_path / "serve-2.log")
    assert f"topic {topics['input_topic']} had id" in log and "--start-over" in log, log[-3000:]
    assert "Nothing was restored and nothing learned" in log

    watcher = OutputWatcher(broker.bootstrap_servers, topics["output_topic"]).start()
    try:
        run_to_the_end([*args, "--start-over"], watcher, len(events), tmp_path / "serve-3.log")
        watcher.settle()
    finally:
        by_source = watcher.stop()
    expected, model = offline(events)
    check_outputs(by_source, expected)
    assert final_checkpoint(args, "local").model == model
    return log


def test_a_checkpoint_record_with_positions_past_the_log_end_is_refused(kafka_broker, topics, tmp_path):
    """Measured on 0.1: such a record made the service skip offsets silently. (On the embedded broker too: it
    answers ListOffsets short, and the service reads a log's true end with a fetch: admin.log_ranges.)"""
    broker = kafka_broker
    args = _first_run(broker, topics, tmp_path, count=600, seed=43, **store_args("kafka", topics))
    settings = load(ServeSettings, args)
    store = KafkaStore(CompactedTopic(settings, settings.checkpoint_topic), settings.group_id)
    try:
        newest = store.load("model")
        assert newest is not None
        from dataclasses import replace

        forged = replace(newest, seq=newest.seq + 1, positions={(topics["input_topic"], 0): 1_000_000})
        store.save(forged)
    finally:
        store.close()
    log = _refused(args, tmp_path / "serve-2.log")
    assert (
        f"checkpoint {newest.seq + 1} holds positions outside {topics['input_topic']}'s logs: partition 0 at offset "
        "1000000, outside its log (0 to 600)"
    ) in log, log[-3000:]


def test_with_a_key_forged_unsigned_and_garbage_records_fall_back_to_the_signed_checkpoint(broker, topics, tmp_path):
    key = {"PERCEPTRON_STREAM_CHECKPOINT_KEY": "0123456789abcdef0123456789abcdef"}
    events = make_events(1200, seed=44)
    produce(broker.bootstrap_servers, topics["input_topic"], events[:600])
    args = settings_args(
        broker, topics, tmp_path, batch_size=100, checkpoint_interval_events=200, **store_args("kafka", topics)
    )
    watcher = OutputWatcher(broker.bootstrap_servers, topics["output_topic"]).start()
    os.environ.update(key)  # the child processes inherit it, never as a flag
    try:
        run_to_the_end(args, watcher, 600, tmp_path / "serve-1.log")
        settings = load(ServeSettings, args)
        topic = CompactedTopic(settings, settings.checkpoint_topic)
        store = KafkaStore(topic, settings.group_id)
        store.key = key["PERCEPTRON_STREAM_CHECKPOINT_KEY"].encode()
        try:
            newest = store.load("model")
            assert newest is not None
            slots = store.slot_keys("model")
            forged = json.loads(encode_checkpoint(newest))  # well formed, checksummed, unsigned
            forged["seq"] = newest.seq + 1
            forged["model"]["weights"] = [-100.0] * len(forged["model"]["weights"])
            topic.put(slots[(newest.seq + 1) % 3], resealed(forged))
            topic.put(slots[(newest.seq + 2) % 3], b"[" * 100_000)
        finally:
            store.close()
        produce(broker.bootstrap_servers, topics["input_topic"], events[600:])
        run_to_the_end(args, watcher, len(events), tmp_path / "serve-2.log")
        watcher.settle()
    finally:
        for name in key:
            os.environ.pop(name, None)
        by_source = watcher.stop()
    log = (tmp_path / "serve-2.log").read_text()
    assert "the checkpoint is not signed, and --checkpoint-key is set" in log and "not valid JSON" in log, log[-3000:]
    assert key["PERCEPTRON_STREAM_CHECKPOINT_KEY"] not in log + (tmp_path / "serve-1.log").read_text()
    expected, model = offline(events)
    check_outputs(by_source, expected)  # the forged weights predicted nothing
    assert final_checkpoint(args, "kafka").model == model


def test_reading_the_checkpoint_topic_holds_one_record_per_slot(broker, topics, tmp_path):
    """Measured on 0.1: six 8 MiB records took the start-up to 351 MB."""
    settings = load(ServeSettings, settings_args(broker, topics, tmp_path))
    name = topics["input_topic"] + "-checkpoints"
    from perceptron_stream.app import CHECKPOINT_TOPIC_CONFIG
    from perceptron_stream.kafka import TopicSpec, ensure_topics

    ensure_topics(settings, [TopicSpec(name, 1, 1, CHECKPOINT_TOPIC_CONFIG)], True)
    topic = CompactedTopic(settings, name)
    try:
        for i in range(6):
            topic.put(
                f"{settings.group_id}/{7 + i}".encode(), bytes([65 + i]) * (8 * 1024 * 1024)
            )  # slots it never writes
        topic.put(f"{settings.group_id}/0".encode(), b"{}")
    finally:
        topic.close()
    code = textwrap.dedent(f"""
        import resource
        from perceptron_stream.config import ServeSettings, load
        from perceptron_stream.kafka import CompactedTopic
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        topic = CompactedTopic(load(ServeSettings, ["--bootstrap-servers", {broker.bootstrap_servers!r}]), {name!r})
        latest = topic.read_latest({{b"{settings.group_id}/0", b"{settings.group_id}/1"}})
        topic.close()
        print(sorted(latest), (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    keys, grown_mib = out.stdout.strip().rsplit(" ", 1)
    assert keys == f"[b'{settings.group_id}/0']", out.stderr[-2000:]
    assert int(grown_mib) < 40, f"reading grew the process by {grown_mib} MiB"


def test_a_fifo_where_a_checkpoint_belongs_neither_hangs_nor_stops_the_service(broker, topics, tmp_path):
    """Measured on 0.1: a FIFO in the state directory hung the start-up, SIGTERM ignored."""
    events = make_events(800, seed=45)
    args = _first_run(broker, topics, tmp_path, count=400, seed=45)
    settings = load(ServeSettings, args)
    store = LocalStore(settings.state_dir, settings.group_id)
    newest = store.files("model")[0]
    os.mkfifo(newest.with_name("checkpoint-999999999999.json"))
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(newest.read_bytes())
    os.symlink(elsewhere, newest.with_name("checkpoint-999999999998.json"))
    produce(broker.bootstrap_servers, topics["input_topic"], events[400:])
    watcher = OutputWatcher(broker.bootstrap_servers, topics["output_topic"]).start()
    try:
        run_to_the_end(args, watcher, 800, tmp_path / "serve-2.log")
    finally:
        watcher.stop()
    log = (tmp_path / "serve-2.log").read_text()
    assert "not a regular file" in log and "symbolic link, refused" in log, log[-3000:]
    assert final_checkpoint(args, "local").positions == {(topics["input_topic"], 0): 800}


def test_version_0_1s_flat_state_dir_is_adopted_by_its_group_and_refused_by_another(broker, topics, tmp_path):
    args = _first_run(broker, topics, tmp_path, count=500, seed=46)
    settings = load(ServeSettings, args)
    store = LocalStore(settings.state_dir, settings.group_id)
    newest = final_checkpoint(args, "local")
    import hashlib

    for path in store.files("model"):  # rewrite as version 0.1 wrote them: no owner, flat in the state dir
        body = json.loads(path.read_bytes())
        for k in ("sha256", "hmac", "owner"):
            body.pop(k, None)
        body["format"] = 1
        body["sha256"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        (settings.state_dir / path.name).write_text(json.dumps(body))
        path.unlink()

    other = {**topics, "group_id": topics["group_id"] + "-b"}
    log = _refused(settings_args(broker, other, tmp_path), tmp_path / "serve-b.log")
    assert "was written by version 0.1, which did not record its consumer group or cluster" in log, log[-3000:]

    produce(broker.bootstrap_servers, topics["input_topic"], make_events(100, seed=47))
    watcher = OutputWatcher(broker.bootstrap_servers, topics["output_topic"]).start()
    try:
        run_to_the_end(args, watcher, 600, tmp_path / "serve-2.log")
    finally:
        watcher.stop()
    assert not store.legacy_files() and store.files("model")
    after = final_checkpoint(args, "local")
    assert (
        after.positions == {(topics["input_topic"], 0): 600}
        and after.model["counters"]["seen"] == newest.model["counters"]["seen"] + 100
    )


def test_forged_mix_records_are_refused_counted_and_change_no_prediction(
    apache_kafka, topics, tmp_path, service_thread
):
    """Partition scope with mixing, no --checkpoint-key, on Apache Kafka. Measured on f27e9e1: a mix record claiming
    2**63-1 mistakes took the mix (μ ≈ 1, its weights replaced the replica's); one of 500,000 features filled a
    replica to its cap; one of 1e308 weights made scores null. Forged records of each kind wait on the mix topic
    under partition 1's key (a replica that learns nothing here: every event is on partition 0) before any event
    comes; the service refuses and counts each, and partition 0's replica, mixing with itself alone, publishes what
    an offline replay of its events publishes, and ends with its model."""
    from perceptron_stream.app import CHECKPOINT_TOPIC_CONFIG
    from perceptron_stream.kafka import TopicSpec, cluster_identity, ensure_topics
    from perceptron_stream.learning import Perceptron
    from perceptron_stream.pipeline.mixer import mix_key
    from perceptron_stream.runtime.factory import model_meta
    from perceptron_stream.state.checkpoint import Checkpoint, Owner

    from tests.support.endpoints import metric, metrics_once
    from tests.support.topics import create_topic

    bootstrap = apache_kafka.bootstrap_servers
    cap, every = 100, 50
    args = settings_args(
        apache_kafka,
        topics,
        tmp_path,
        model_scope="partition",
        mix_topic=f"mix-{topics['group_id']}",
        mix_every=every,
        max_model_features=cap,
        batch_size=50,
    )
    settings = load(ServeSettings, args)
    create_topic(bootstrap, settings.input_topic, partitions=2)
    ensure_topics(settings, [TopicSpec(settings.mix_topic, 1, 1, CHECKPOINT_TOPIC_CONFIG)], True)
    cluster_id, topic_id = cluster_identity(settings, settings.input_topic)

    def forged(weights, mistakes: int = 5) -> bytes:
        state = Perceptron.from_weights([0.0]).to_state()  # a plain perceptron's state, then written over
        names = list(weights) if isinstance(weights, dict) else list(range(len(weights)))
        state.update(features=names, weights=list(weights.values()) if isinstance(weights, dict) else weights)
        owner = Owner(settings.group_id, settings.input_topic, "partition-1", cluster_id, topic_id)
        record = Checkpoint(
            seq=1,
            positions={(settings.input_topic, 1): 0},
            model=state,
            meta=model_meta(settings),
            owner=owner,
            task={"mix": {"mistakes": mistakes, "learned": every, "inputs": []}},
        )
        return resealed(json.loads(encode_checkpoint(record)))

    records = {
        "too_large": [
            forged({f"junk-{i:06d}": 1.0 for i in range(20_000)}),  # ~400 KB: longer than 100 features may take
            forged({f"junk-{i}": 1.0 for i in range(cap + 1)}),  # short, but more features than the cap
        ],
        "implausible": [forged([-100.0] * 10, mistakes=2**63 - 1)],  # would take the mix
        "non_finite": [forged([1e308] * 10)],
    }
    values = [v for vs in records.values() for v in vs]
    produce(bootstrap, settings.mix_topic, values, keys=[mix_key(settings.group_id, 1)] * len(values))

    service = service_thread(args)
    lines = [f'perceptron_rejected_state_total{{kind="mix",reason="{r}"}} {float(len(v))}' for r, v in records.items()]
    text = metrics_once(service.metrics_url, *lines, timeout=60)
    for reason, forgeries in records.items():
        assert metric(text, f'perceptron_rejected_state_total{{kind="mix",reason="{reason}"}}') == len(forgeries), text

    events = make_events(300, seed=48)
    watcher = OutputWatcher(bootstrap, settings.output_topic).start()
    try:
        produce(bootstrap, settings.input_topic, events, partition=0)
        wait_until(lambda: watcher.distinct() >= len(events), 90, what="every event predicted")
        watcher.settle()
    finally:
        by_source = watcher.stop()
    expected, model = offline(events)
    assert sorted(by_source) == list(range(len(events)))
    for offset, want in enumerate(expected):  # every score as without the forged records: none reached a mix
        got = json.loads(by_source[offset][0])
        assert json.dumps([got[k] for k in ("id", "y_pred", "score", "y", "mistake")]) == json.dumps(
            [want[k] for k in ("id", "y_pred", "score", "y", "mistake")]
        ), (offset, got, want)
        mixes = offset // every  # it mixed (with itself alone) after each --mix-every events
        assert got["model"] == {"scope": "partition", "partition": 0, "mixes": mixes, **want["model"]}, (offset, got)
    assert service.stop() == 0
    final = LocalStore(settings.state_dir, settings.group_id).load("partition-0")
    assert final is not None and (final.model["features"], final.model["weights"]) == (
        model["features"],
        model["weights"],
    )


# replay, and one policy per group (issue 35) -------------------------------------------------------------------
KEY_ENV, KEY = "PERCEPTRON_STREAM_CHECKPOINT_KEY", "0123456789abcdef0123456789abcdef"


def _slots(args) -> dict[bytes, bytes | None]:
    """The checkpoint topic's slot records of the group's model, as they are."""
    settings = load(ServeSettings, args)
    store = KafkaStore(CompactedTopic(settings, settings.checkpoint_topic), settings.group_id)
    try:
        return store.topic.read_latest(set(store.slot_keys("model")))
    finally:
        store.close()


@pytest.mark.parametrize("kafka_broker", ["apache-kafka"], indirect=True)
def test_an_old_signed_checkpoint_put_back_under_every_slot_is_refused_as_stale(
    kafka_broker, topics, tmp_path, monkeypatch
):
    """Measured on f27e9e1: an old signed checkpoint (position 40) re-written under every slot was restored although
    the group had committed 200, and the events between were learned and published again. Now: exit 1 naming the
    checkpoint, the committed offset and the way out; nothing written."""
    monkeypatch.setenv(KEY_ENV, KEY)  # the child processes inherit it
    args = _first_run(kafka_broker, topics, tmp_path, count=600, seed=48, **store_args("kafka", topics))
    slots = _slots(args)
    signed = {k: decode_checkpoint(v or b"", KEY.encode()) for k, v in slots.items()}
    oldest = min(signed, key=lambda k: signed[k].seq)
    position = signed[oldest].positions[(topics["input_topic"], 0)]
    assert position < 600, signed  # an older checkpoint than the one the group committed
    settings = load(ServeSettings, args)
    topic = CompactedTopic(settings, settings.checkpoint_topic)
    try:
        for key in slots:  # the attacker's replay: the old record's bytes, signature and all, under every slot
            topic.put(key, slots[oldest])
    finally:
        topic.close()
    replayed = _slots(args)
    log = _refused(args, tmp_path / "serve-2.log")
    assert (
        f"checkpoint {signed[oldest].seq} of model, the newest usable one, is behind the offsets consumer group "
        f"{topics['group_id']} committed ({topics['input_topic']} partition 0 at offset {position}, the group "
        "committed 600)"
    ) in log, log[-3000:]
    assert f"--reset-offsets --topic {topics['input_topic']}:0 --to-offset {position}" in log, log[-3000:]
    assert _slots(args) == replayed  # nothing written


@pytest.mark.parametrize("kafka_broker", ["apache-kafka"], indirect=True)
def test_an_instance_without_the_key_refuses_a_keyed_group_which_then_restarts_with_its_state(
    kafka_broker, topics, tmp_path, monkeypatch
):
    """Measured on f27e9e1: an instance without --checkpoint-key restored the group's signed checkpoints without a
    word and overwrote every slot unsigned; the keyed instances then could not restart, even with --start-over.
    Now it exits 2 naming the setting before writing anything, and the keyed instance goes on from its state."""
    events = make_events(900, seed=49)
    produce(kafka_broker.bootstrap_servers, topics["input_topic"], events[:600])
    args = settings_args(
        kafka_broker, topics, tmp_path, batch_size=100, checkpoint_interval_events=200, **store_args("kafka", topics)
    )
    watcher = OutputWatcher(kafka_broker.bootstrap_servers, topics["output_topic"]).start()
    try:
        monkeypatch.setenv(KEY_ENV, KEY)
        run_to_the_end(args, watcher, 600, tmp_path / "serve-1.log")
        before = _slots(args)

        monkeypatch.delenv(KEY_ENV)
        code = exit_code(args, tmp_path / "serve-unkeyed.log")
        log = (tmp_path / "serve-unkeyed.log").read_text()
        assert code == 2, log[-3000:]
        assert "invalid setting checkpoint_key (--checkpoint-key" in log and "is signed" in log, log[-3000:]
        assert not has_traceback(log), log[-3000:]
        assert _slots(args) == before  # nothing written

        monkeypatch.setenv(KEY_ENV, KEY)
        produce(kafka_broker.bootstrap_servers, topics["input_topic"], events[600:])
        run_to_the_end(args, watcher, len(events), tmp_path / "serve-2.log")
        watcher.settle()
    finally:
        by_source = watcher.stop()
    expected, model = offline(events)
    check_outputs(by_source, expected)
    assert final_checkpoint(args, "kafka").model == model  # each event learned once, by the keyed model


@pytest.mark.parametrize("kafka_broker", ["apache-kafka"], indirect=True)
def test_an_old_signed_mix_record_sent_again_is_refused_as_replayed(
    kafka_broker, topics, tmp_path, service_thread, monkeypatch
):
    """Measured on f27e9e1: partition 0's signed mix record number 1, sent again after number 12, was mixed as if
    new. Now the board refuses it (``replayed``) and keeps the newest."""
    monkeypatch.setenv(KEY_ENV, KEY)
    events = dealt_events(1200, seed=50, partitions=2)
    produce_dealt(kafka_broker.bootstrap_servers, topics["input_topic"], events, partitions=2)
    args = settings_args(
        kafka_broker,
        topics,
        tmp_path,
        model_scope="partition",
        mix_every=50,
        batch_size=100,
        mix_topic=f"mix-{topics['group_id']}",
        **store_args("kafka", topics),
    )
    service = service_thread(args)

    def mixed(seq: int) -> bool:
        board = service.app.factory.board  # once start-up opened it
        newest = None if board is None else board.latest.get(0)
        return newest is not None and newest.seq >= seq

    # the replayed record comes after the genuine ones in the topic: the board has read those when it reads it
    wait_until(lambda: mixed(3), 120, what="partition 0's third mix")
    board = service.app.factory.board
    assert board is not None
    settings = load(ServeSettings, args)
    key = mix_key(topics["group_id"], 0)
    [first] = [
        m.value
        for m in read_all(kafka_broker.bootstrap_servers, settings.mix_topic)
        if m.key == key and decode_checkpoint(m.value).seq == 1
    ]
    topic = CompactedTopic(settings, settings.mix_topic)
    try:
        topic.put(key, first)
    finally:
        topic.close()
    registry = service.app.metrics.registry

    def refused() -> float | None:
        return registry.get_sample_value("perceptron_rejected_state_total", {"kind": "mix", "reason": "replayed"})

    wait_until(lambda: refused() == 1, 60, what="the replayed mix record refused")
    assert board.latest[0].seq >= 3


@pytest.mark.parametrize("kafka_broker", ["apache-kafka"], indirect=True)
def test_two_instances_of_other_variants_started_together_in_a_new_group_one_refuses_before_writing(
    kafka_broker, topics, tmp_path
):
    """Measured on f27e9e1: two instances of one group (partition scope) with another --variant each, started
    together, served side by side (44 warnings each), then exited one after the other. Each now sees the other's
    policy in its client id before it processes anything and waits a session for it to leave; the first whose wait
    ends refuses naming variant (exit 2) having written nothing, and the other, alone then, serves every event once
    (were both to end their wait in the same moment, both would refuse: then nothing is written at all)."""
    events = dealt_events(400, seed=51, partitions=2)
    produce_dealt(kafka_broker.bootstrap_servers, topics["input_topic"], events, partitions=2)
    base = dict(model_scope="partition", batch_size=100, **store_args("kafka", topics))
    variants = ["plain", "averaged"]
    logs = {v: tmp_path / f"{v}.log" for v in variants}
    watcher = OutputWatcher(kafka_broker.bootstrap_servers, topics["output_topic"], by=source_partition_offset).start()
    processes = {
        v: start_service_process(settings_args(kafka_broker, topics, tmp_path / v, variant=v, **base), logs[v])
        for v in variants
    }
    try:
        wait_until(lambda: any(p.poll() is not None for p in processes.values()), 120, what="one instance's refusal")
        refused = [v for v, p in processes.items() if p.poll() is not None]
        for v in refused:
            log = logs[v].read_text()
            assert processes[v].returncode == 2, log[-3000:]
            # another member seen (running another model), or, if the other started alone first, its checkpoint
            assert "invalid setting variant (--variant" in log, log[-3000:]
            assert not has_traceback(log), log[-3000:]
        survivors = [v for v in variants if v not in refused]
        survivor = survivors[0] if survivors else None
        if survivor is not None:
            wait_until(
                lambda: watcher.distinct() >= len(events) or processes[survivor].poll() is not None,
                120,
                what="every event predicted by the instance left",
            )
            assert stop_process(processes[survivor], logs[survivor]) == 0, tail(logs[survivor])
            watcher.settle()
    finally:
        by_source = watcher.stop()
        for p in processes.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    checkpoints = [
        decode_checkpoint(m.value) for m in read_all(kafka_broker.bootstrap_servers, base["checkpoint_topic"])
    ]
    if survivor is None:
        assert by_source == {} and checkpoints == []
    else:
        assert len(by_source) == len(events) and all(len(copies) == 1 for copies in by_source.values())
        assert checkpoints and {cp.meta["variant"] for cp in checkpoints} == {survivor}
