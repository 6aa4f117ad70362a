"""``--processing-guarantee exactly-once`` with real processes: what a read_committed reader sees after a SIGKILL,
and the combinations start-up refuses (docs: concepts/guarantees.md).

On Apache Kafka, both clients: the service SIGKILLed mid-stream twice and run to the end; a read_committed
reader of the predictions sees every input offset exactly once, each prediction the uninterrupted run's, and
the last committed checkpoint holds the uninterrupted run's model. The embedded broker is refused (its
read_committed readers see aborted records: tests/integration/test_transactions.py). A zombie (an instance frozen
past its session timeout while another took its partition) publishes nothing once it thaws, and stops naming the
fencing.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import threading
import time
from pathlib import Path

import pytest
from perceptron_stream.config import ServeSettings, load
from perceptron_stream.kafka import CompactedTopic
from perceptron_stream.learning import learner_from_state, make_learner
from perceptron_stream.learning.labels import is_mistake
from perceptron_stream.learning.mixing import mix_states
from perceptron_stream.state.checkpoint import decode_checkpoint, owner_of
from perceptron_stream.state.kafka_store import KafkaStore

from tests.support.labels import label_topics, labeled_points, send_labels, send_points
from tests.support.launch import settings_args, start_service_process
from tests.support.partitions import (
    PARTITIONS,
    DealtFlow,
    check_partition_outputs,
    dealt_events,
    held_partitions,
    of_partition,
    produce_dealt,
    replay,
    replicas,
)
from tests.support.service import (
    DEFAULT_MAX_MODEL_FEATURES,
    OutputWatcher,
    check_outputs,
    exit_code,
    has_traceback,
    label_offset,
    make_events,
    offline,
    source_partition_offset,
    stop_process,
    store_args,
    tail,
    wait_assigned,
)
from tests.support.topics import produce, read_all, stable_offsets
from tests.support.waiting import wait_until

EXACTLY_ONCE = {"processing_guarantee": "exactly-once", "commit_interval_ms": 100}


def _committed_checkpoint(args: list[str]):
    """The checkpoint committed with the group's offsets, as an exactly-once restart restores it (the offsets read
    stable: the last commit's are pending until its markers are written)."""
    s = load(ServeSettings, args)
    committed = {
        (topic, p): o
        for topic in filter(None, (s.input_topic, s.label_topic))
        for p, o in stable_offsets(s, s.group_id, topic).items()
    }
    store = KafkaStore(CompactedTopic(s, s.checkpoint_topic), s.group_id)
    try:
        return store.load("model", committed=committed)
    finally:
        store.close()


def _freeze_in_a_transaction(process, log: Path, bootstrap: str, topic: str, mine, timeout: float = 120.0) -> None:
    """SIGSTOP ``process`` at a moment when its open transaction holds a record of ``topic``'s partition 0 (one
    that ``mine(value)`` says it wrote), SIGCONT and try again a moment later when it does not. Its transaction is
    the one of the transactional id its ``log`` names: an instance SIGKILLed before it leaves its transaction open
    for the transaction timeout, and may have written for the same partitions.

    A test that kills or freezes an instance "with a transaction open" to prove that a read_committed reader never
    sees what it held cannot trust a sleep for that: the watcher that paces it sees outputs just after a commit, and
    on a loaded machine the instance may have sent nothing since. So it is asked of the broker, while the process
    is stopped: the partition's leader names each producer's open transaction by its first offset there
    (DescribeProducers), the coordinators the transactions' states (ListTransactions). A start offset seen before
    and after its transaction is Ongoing is the open transaction's, not a committed one whose markers are still
    being written (a transaction is Ongoing again only once every marker of the one before is in the logs, and a
    stopped process opens none).
    """
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

    tp = TopicPartition(topic, 0)
    [own_id] = re.findall(r"transactions under transactional id (\S+)", log.read_text())
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    reader = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    reader.assign([tp])

    def open_starts() -> dict[int, int]:  # producer id -> first offset of its open transaction on ``tp``
        state = admin.describe_producers([tp])[tp]
        return {p.producer_id: p.current_transaction_start_offset for p in state.active_producers}

    def value_at(offset: int) -> bytes:
        reader.seek(tp, offset)
        records = wait_until(lambda: reader.poll(timeout_ms=200).get(tp), 30, what=f"the record at {tp} {offset}")
        assert records[0].offset == offset, (records[0].offset, offset)
        return records[0].value

    def holds_its_own_record() -> bool:
        before = {pid: start for pid, start in open_starts().items() if start >= 0}
        if not before:
            return False
        listed = admin.list_transactions(producer_id_filters=list(before))
        ongoing = {
            t.producer_id
            for rows in listed.values()
            for t in rows
            if t.state == "Ongoing" and t.transactional_id == own_id
        }
        after = open_starts()
        return any(before[pid] == after.get(pid) and mine(value_at(before[pid])) for pid in ongoing)

    deadline = time.monotonic() + timeout
    try:
        while True:
            assert process.poll() is None, f"exited with {process.returncode} before it was frozen"
            os.kill(process.pid, signal.SIGSTOP)
            if holds_its_own_record():
                return
            os.kill(process.pid, signal.SIGCONT)
            assert time.monotonic() < deadline, f"never frozen with a record of {topic} in its open transaction"
            time.sleep(random.uniform(0.05, 0.3))  # another moment of its commit interval
    finally:
        reader.close()
        admin.close()


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_sigkill_mid_stream_leaves_each_offset_predicted_exactly_once_for_read_committed_readers(
    client, apache_kafka, topics, tmp_path
):
    count = 6000
    events = make_events(count, seed=31)
    keys = [e["id"].encode() for e in events]
    expected, model = offline(events)
    produce(apache_kafka.bootstrap_servers, topics["input_topic"], events, keys=keys)
    args = settings_args(
        apache_kafka,
        topics,
        tmp_path,
        batch_size=100,
        kafka_client=client,
        **EXACTLY_ONCE,
        **store_args("kafka", topics),
    )
    watcher = OutputWatcher(apache_kafka.bootstrap_servers, topics["output_topic"], read_committed=True).start()
    process = None
    try:
        for run, kill_at in enumerate((count // 5, count // 2)):
            log_path = tmp_path / f"serve-{run}.log"
            process = start_service_process(args, log_path)
            wait_until(
                lambda kill_at=kill_at, process=process: watcher.distinct() >= kill_at or process.poll() is not None,
                180,
                interval=0.005,
                what=f"run {run}: {kill_at} offsets predicted",
            )
            assert process.poll() is None, f"run {run} exited with {process.returncode}:\n{tail(log_path)}"
            process.kill()  # with a transaction open: its outputs sent, some of them flushed to the log
            process.wait()
        log_path = tmp_path / "serve-final.log"
        process = start_service_process(args, log_path)
        wait_assigned(process, log_path, topics["input_topic"])
        wait_until(
            lambda: watcher.distinct() >= count or process.poll() is not None, 180, what="every offset predicted"
        )
        assert stop_process(process, log_path) == 0, tail(log_path)
        watcher.settle()
    finally:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        by_source = watcher.stop()

    for path in sorted(tmp_path.glob("serve-*.log")):
        assert not has_traceback(path.read_text(errors="replace")), f"{path.name}:\n{tail(path)}"
    repeats = check_outputs(by_source, expected, input_topic=topics["input_topic"], keys=watcher.keys, input_keys=keys)
    assert repeats == 0, f"{repeats} predictions seen twice by a read_committed reader"
    checkpoint = _committed_checkpoint(args)
    assert checkpoint.positions == {(topics["input_topic"], 0): count}
    assert checkpoint.model == model  # the exact state of an uninterrupted run


def _trickle(bootstrap: str, topic: str, events: list[dict], per_chunk: int = 1000, every_s: float = 0.5) -> None:
    """``events`` written ``per_chunk`` every ``every_s``: a stream that keeps coming."""
    for start in range(0, len(events), per_chunk):
        produce(bootstrap, topic, events[start : start + per_chunk])
        time.sleep(every_s)


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_a_zombie_whose_partition_moved_publishes_nothing_and_stops_naming_the_fencing(
    client, apache_kafka, topics, tmp_path
):
    """Partition scope: A processes, is frozen (SIGSTOP) with a transaction open, B takes its partition once A's
    session (6 s) is over and runs to the end; A thaws (SIGCONT), is fenced and exits 1. A read_committed reader
    sees every offset predicted once, as the uninterrupted run: nothing A sent after its last commit shows.

    A thawed zombie learns that it is one when its commit is refused (the group's generation moved on) or, first,
    from its client (its session expired: its partitions are lost, and it aborts without trying a commit),
    whichever comes first; both end the same way."""
    count = 20_000
    events = make_events(count, seed=32)
    expected = [
        {**e, "model": {"scope": "partition", "partition": 0, "mixes": 0, **e["model"]}}  # a replica's outputs
        for e in offline(events)[0]
    ]
    produce(apache_kafka.bootstrap_servers, topics["input_topic"], events[:1000])
    # events keep coming (2,000/s) and A commits every 3 s: A has outputs in its open transaction most of the time,
    # whichever client (confluent would have processed a whole backlog in its first interval); it is frozen at one
    args = settings_args(
        apache_kafka,
        topics,
        tmp_path,
        batch_size=100,
        kafka_client=client,
        model_scope="partition",
        mix_every=0,
        processing_guarantee="exactly-once",
        commit_interval_ms=3000,
        **store_args("kafka", topics),
    )
    watcher = OutputWatcher(apache_kafka.bootstrap_servers, topics["output_topic"], read_committed=True).start()
    a_log, b_log = tmp_path / "serve-a.log", tmp_path / "serve-b.log"
    a = start_service_process(args, a_log)
    b = None
    flow = threading.Thread(
        target=_trickle, args=(apache_kafka.bootstrap_servers, topics["input_topic"], events[1000:]), daemon=True
    )
    try:
        wait_assigned(a, a_log, topics["input_topic"])
        flow.start()
        wait_until(lambda: watcher.distinct() > 0 or a.poll() is not None, 120, interval=0.005, what="A's first commit")
        assert a.poll() is None, f"A exited with {a.returncode}:\n{tail(a_log)}"
        _freeze_in_a_transaction(a, a_log, apache_kafka.bootstrap_servers, topics["output_topic"], lambda value: True)
        frozen_at = watcher.distinct()
        assert frozen_at < count, "A was done before it was frozen: the test proves nothing"
        b = start_service_process(args, b_log)
        wait_assigned(b, b_log, topics["input_topic"], timeout=180)  # once A's session is over
        os.kill(a.pid, signal.SIGCONT)
        assert a.wait(120) == 1, tail(a_log)
        assert "fenced: a newer owner has this instance's partitions" in a_log.read_text(errors="replace"), tail(a_log)
        flow.join(120)
        wait_until(lambda: watcher.distinct() >= count or b.poll() is not None, 180, what="every offset predicted")
        assert stop_process(b, b_log) == 0, tail(b_log)
        watcher.settle()
    finally:
        if flow.is_alive():
            flow.join(120)
        for process in (a, b):
            if process is not None and process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.kill()
                process.wait()
        by_source = watcher.stop()

    for path in (a_log, b_log):
        assert not has_traceback(path.read_text(errors="replace")), f"{path.name}:\n{tail(path)}"
    repeats = check_outputs(by_source, expected, input_topic=topics["input_topic"])
    assert repeats == 0, f"{repeats} predictions seen twice by a read_committed reader (frozen at {frozen_at})"


def _replay_with_labels(points: list[dict], labels: list[tuple[str, int]], later: list[dict]):
    """Offline: each point's prediction (as the service publishes it), each label's outcome (id, y, y_pred, score,
    mistake) in the order the labels came, the predictions of ``later`` points, and the model at the end."""
    learner = make_learner(max_features=DEFAULT_MAX_MODEL_FEATURES)
    predictions, published = [], {}

    def predict(p: dict) -> None:
        y_pred, score, _ = learner.step(p["x"], None)
        published[p["id"]] = (y_pred, score)
        model = {"version": learner.updates, "seen": learner.seen, "mistakes": learner.mistakes}
        predictions.append(
            {"id": p["id"], "y_pred": y_pred, "score": score, "y": None, "mistake": None, "model": model}
        )

    for p in points:
        predict(p)
    x_of, outcomes = {p["id"]: p["x"] for p in points}, []
    for point_id, y in labels:
        y_pred, score = published[point_id]
        learner.relabel(x_of[point_id], y, is_mistake(y, score))
        outcomes.append((point_id, y, y_pred, score, is_mistake(y, score)))
    for p in later:
        predict(p)
    return predictions, outcomes, learner.to_state()


def _trickle_labels(broker, topic: str, labels: list[tuple[str, int]], per_chunk: int = 60) -> None:
    """``labels`` written ``per_chunk`` every 0.2 s: labels that keep coming across a kill and two restarts."""
    for start in range(0, len(labels), per_chunk):
        send_labels(broker, topic, labels[start : start + per_chunk])
        time.sleep(0.2)


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_delayed_labels_across_a_sigkill_and_an_aborted_commit_publish_each_prediction_and_outcome_once(
    client, apache_kafka, topics, tmp_path
):
    """Group scope, one partition, the Kafka store: points, then their labels in a shuffled order while the service
    is SIGKILLed (a transaction open), restarted with its first transaction aborted once every record of it (outcomes,
    the pending changelog's records, the checkpoint) was in the logs (tests.support.faults), and
    restarted again; then more points. A read_committed reader sees every prediction and every outcome exactly once,
    each the offline replay's; the aborted records are in the logs, yet no restore had a stale change to undo (the
    changelog's reader never sees them), and the committed checkpoint is the replay's model: each label learned once."""
    bootstrap, group = apache_kafka.bootstrap_servers, topics["group_id"]
    names = label_topics(apache_kafka, topics)
    points, later = labeled_points(600, seed=81), labeled_points(200, seed=82, start=600)
    labels = [(p["id"], p["_y"]) for p in points]
    random.Random(81).shuffle(labels)
    expected, outcomes, model = _replay_with_labels(points, labels, later)
    args = settings_args(
        apache_kafka,
        names,
        tmp_path,
        batch_size=20,
        kafka_client=client,
        **EXACTLY_ONCE,
        state_store="kafka",
        checkpoint_topic=f"ckpt-{group}",
        pending_topic=f"pending-{group}",
    )
    predictions = OutputWatcher(bootstrap, names["output_topic"], read_committed=True).start()
    scored = OutputWatcher(bootstrap, names["outcome_topic"], read_committed=True, by=label_offset).start()
    logs = [tmp_path / f"serve-{run}.log" for run in ("killed", "aborted", "last")]
    flow = threading.Thread(target=_trickle_labels, args=(apache_kafka, names["label_topic"], labels), daemon=True)
    process = start_service_process(args, logs[0])
    try:
        send_points(apache_kafka, names["input_topic"], points)
        wait_until(
            lambda: predictions.distinct() >= len(points) or process.poll() is not None, 120, what="points predicted"
        )
        flow.start()
        wait_until(
            lambda: scored.distinct() >= len(labels) // 4 or process.poll() is not None,
            120,
            interval=0.01,
            what="a quarter of the labels joined",
        )
        assert process.poll() is None, tail(logs[0])
        process.kill()  # with a transaction open: outcomes sent, some of them in the log
        process.wait()
        process = start_service_process(args, logs[1], fault=("abort-transaction", "1"))
        assert process.wait(120) == 1, tail(logs[1])
        assert "transaction 1 aborted before its commit" in logs[1].read_text(), tail(logs[1])
        process = start_service_process(args, logs[2])
        wait_assigned(process, logs[2], names["input_topic"])
        flow.join(60)
        wait_until(
            lambda: scored.distinct() >= len(labels) or process.poll() is not None, 120, what="every label joined"
        )
        send_points(apache_kafka, names["input_topic"], later)
        wait_until(
            lambda: predictions.distinct() >= len(expected) or process.poll() is not None, 120, what="later points"
        )
        assert stop_process(process, logs[2]) == 0, tail(logs[2])
        predictions.settle()
        scored.settle()
    finally:
        flow.join(60)
        if process.poll() is None:
            process.kill()
            process.wait()
        by_source, by_label = predictions.stop(), scored.stop()

    for path in logs:
        log = path.read_text(errors="replace")
        assert not has_traceback(log), f"{path.name}:\n{tail(path)}"
        assert "stale changes undone" not in log, f"{path.name}:\n{tail(path)}"  # nothing aborted was read back
    repeats = check_outputs(by_source, expected, input_topic=names["input_topic"])
    assert repeats == 0, f"{repeats} predictions seen twice by a read_committed reader"
    assert sorted(by_label) == list(range(len(labels)))
    for offset, values in by_label.items():
        assert len(values) == 1, f"label {offset}: {len(values)} outcomes seen by a read_committed reader"
        got = json.loads(values[0])
        assert (got["id"], got["y"], got["y_pred"], got["score"], got["mistake"]) == outcomes[offset], offset
    # the aborted transactions' records are in the logs, where a read_uncommitted reader sees them
    assert len(read_all(bootstrap, names["outcome_topic"])) > len(labels)
    changelog = f"pending-{group}"
    assert len(read_all(bootstrap, changelog)) > len(read_all(bootstrap, changelog, read_committed=True))
    checkpoint = _committed_checkpoint(args)
    assert checkpoint.positions == {(names["input_topic"], 0): len(expected), (names["label_topic"], 0): len(labels)}
    assert checkpoint.model == model  # each label learned once, in its order
    assert checkpoint.task["labels"]["pending"] == {"0": len(later)}  # the later points wait for their labels
    assert read_all(bootstrap, names["dlq_topic"], read_committed=True) == []  # no label unknown or a duplicate


def _shared(logs: dict, names: str, partitions: int = PARTITIONS) -> bool:
    """Whether the services ``names`` each hold partitions, none held twice, all held (a rebalance is over)."""
    held = [held_partitions(logs[name].read_text()) for name in names]
    return all(held) and sum(map(len, held)) == partitions and set().union(*held) == set(range(partitions))


def _restored(log: str) -> set[int]:
    """The partitions whose replicas a service restored (or started anew) since its last assignment."""
    since = log[log.rfind(" assigned ") :]
    return {int(p) for p in re.findall(r"(?:restored checkpoint \d+ of|no checkpoint yet of) partition-(\d+)", since)}


def _partition_scope(apache_kafka, topics, tmp_path, client: str, **extra) -> list[str]:
    return settings_args(
        apache_kafka,
        topics,
        tmp_path,
        batch_size=20,
        kafka_client=client,
        model_scope="partition",
        processing_guarantee="exactly-once",
        mix_topic=f"mix-{topics['group_id']}",
        **store_args("kafka", topics),
        **extra,
    )


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_three_instances_a_sigkill_a_newcomer_and_a_zombie_leave_each_input_predicted_once_as_its_replay(
    client, apache_kafka, topics, tmp_path
):
    """The whole scenario, 3 ``serve`` processes over 6 keyed partitions, --mix-every 0: A is SIGKILLed mid-stream,
    D joins, B is frozen (SIGSTOP) past its session while its partitions move to the others, then thaws, is fenced
    and exits 1. A read_committed reader sees every input (partition, offset) exactly once, each the offline replay of
    its partition alone (nothing the zombie sent after its partitions moved, nothing of A's open transaction), and
    each replica's committed checkpoint is that replay."""
    bootstrap, input_topic = apache_kafka.bootstrap_servers, topics["input_topic"]
    events = dealt_events(12_000, seed=93)
    produce_dealt(bootstrap, input_topic, events[:600])
    args = _partition_scope(apache_kafka, topics, tmp_path, client, mix_every=0, commit_interval_ms=1000)
    watcher = OutputWatcher(bootstrap, topics["output_topic"], read_committed=True, by=source_partition_offset).start()
    logs = {name: tmp_path / f"serve-{name}.log" for name in "abcd"}
    processes = {name: start_service_process(args, logs[name]) for name in "abc"}
    flow = DealtFlow(bootstrap, input_topic, events[600:], per_second=300)
    try:
        wait_until(lambda: _shared(logs, "abc"), 120, what="A, B and C sharing the partitions")
        flow.start()  # until B is fenced: B is frozen with outputs in its open transaction
        wait_until(lambda: watcher.distinct() >= 900, 120, interval=0.01, what="900 events predicted")
        processes["a"].kill()  # its partitions idle until its session ends, its open transaction until it times out
        processes["a"].wait()
        processes["d"] = start_service_process(args, logs["d"])
        wait_until(lambda: _shared(logs, "bcd"), 120, what="B, C and the newcomer D sharing the partitions")
        b_held = held_partitions(logs["b"].read_text())
        wait_until(lambda: _restored(logs["b"].read_text()) == b_held, 120, what="B's replicas restored")
        _freeze_in_a_transaction(  # B processes: frozen with outputs in its open transaction (a commit a second)
            processes["b"],
            logs["b"],
            bootstrap,
            topics["output_topic"],
            lambda value: json.loads(value)["source"]["partition"] in b_held,
        )
        wait_until(
            lambda: b_held & (held_partitions(logs["c"].read_text()) | held_partitions(logs["d"].read_text())),
            120,
            what="B's partitions moved on (its session over)",
        )
        os.kill(processes["b"].pid, signal.SIGCONT)
        assert processes["b"].wait(120) == 1, tail(logs["b"])
        assert "fenced: a newer owner has this instance's partitions" in logs["b"].read_text(), tail(logs["b"])
        events = events[:600] + flow.stop()
        wait_until(lambda: watcher.distinct() >= len(events), 180, what="every (partition, offset) predicted")
        for name in "cd":
            assert stop_process(processes[name], logs[name]) == 0, tail(logs[name])
        watcher.settle()
    finally:
        flow.stop()
        for process in processes.values():
            if process.poll() is None:
                os.kill(process.pid, signal.SIGCONT)
                process.kill()
                process.wait()
        by_source = watcher.stop()

    for name in "bcd":
        assert not has_traceback(logs[name].read_text(errors="replace")), f"{name}:\n{tail(logs[name])}"
    repeats = check_partition_outputs(by_source, events)
    assert repeats == 0, f"{repeats} predictions seen twice by a read_committed reader"
    aborted = len(read_all(bootstrap, topics["output_topic"])) - len(events)
    assert aborted > 0, "no open transaction of A or B was aborted: the test proves nothing"  # in the log, unseen
    for p, checkpoint in replicas(args, committed=True).items():
        learner, _ = replay(of_partition(events, p))
        assert checkpoint.positions == {(input_topic, p): len(of_partition(events, p))}
        assert checkpoint.model == learner.to_state(), f"partition {p}: not the offline replay of its events"
    print(f"{len(events)} events, {aborted} predictions aborted")


def _replay_mixing(events: list[dict], p: int, position, committed: dict):
    """Partition ``p``'s replica offline: its events stepped, and at the position of each of its committed mix
    records the record's state checked and the mix it names made (of committed records only). What it published for
    each event (y_pred, score, mistake, model), and the learner at the end."""
    learner = make_learner(max_features=DEFAULT_MAX_MODEL_FEATURES)
    at = {position(r): r for (q, _), r in committed.items() if q == p}
    mixes, published = 0, []
    for offset, e in enumerate(events):
        y_pred, score, mistake = learner.step(e["x"], e["y"])
        model = {"version": learner.updates, "seen": learner.seen, "mistakes": learner.mistakes}
        published.append((y_pred, score, mistake, {"scope": "partition", "partition": p, "mixes": mixes, **model}))
        record = at.get(offset + 1)
        if record is not None:  # it published its state here, then mixed
            assert (record.seq, record.model) == (mixes + 1, learner.to_state()), (p, offset, record.seq)
            inputs = record.task["mix"]["inputs"]
            states = [record.model if q == p else committed[(q, seq)].model for q, seq, _ in inputs]
            learner = learner_from_state(mix_states(record.model, states, [mu for _, _, mu in inputs]))
            mixes += 1
    assert mixes == len(at), f"partition {p}: a committed mix record off its replica's path"
    return published, learner


def test_mixing_replicas_across_a_sigkill_publish_each_prediction_once_and_mix_only_committed_states(
    apache_kafka, topics, tmp_path
):
    """Partition scope with --mix-every 10 over 4 keyed partitions, two instances; A is SIGKILLed with mix records in
    its open transaction (a commit a second), B takes its partitions. A read_committed reader sees every (partition,
    offset) predicted once, each mix number of each partition once; replaying each partition from its committed mix
    records alone (every record's state checked, every mix made of the committed records it names) gives every
    published prediction and the committed replica: no replica mixed a state that was never committed. On the
    default client only (30-40 s a run): a mix record is an output like any other, sent through the stream's
    transaction, which test_transactions proves on both clients."""
    client = "kafka-python"
    bootstrap, input_topic, partitions = apache_kafka.bootstrap_servers, topics["input_topic"], 4
    events = dealt_events(12_000, seed=94, partitions=partitions)
    produce_dealt(bootstrap, input_topic, events[:200], partitions)
    args = _partition_scope(apache_kafka, topics, tmp_path, client, mix_every=10, commit_interval_ms=1000)
    watcher = OutputWatcher(bootstrap, topics["output_topic"], read_committed=True, by=source_partition_offset).start()
    logs = {name: tmp_path / f"serve-{name}.log" for name in "ab"}
    processes = {name: start_service_process(args, logs[name]) for name in "ab"}
    flow = DealtFlow(bootstrap, input_topic, events[200:], per_second=200)
    try:
        wait_until(lambda: _shared(logs, "ab", partitions), 120, what="A and B sharing the partitions")
        flow.start()
        wait_until(lambda: watcher.distinct() >= 600, 120, interval=0.01, what="600 events predicted")
        a_held = held_partitions(logs["a"].read_text())
        _freeze_in_a_transaction(  # killed with one of its mix records in its open transaction
            processes["a"],
            logs["a"],
            bootstrap,
            f"mix-{topics['group_id']}",
            lambda value: int(owner_of(decode_checkpoint(value)).task.split("-")[1]) in a_held,
        )
        processes["a"].kill()
        processes["a"].wait()
        wait_until(lambda: _restored(logs["b"].read_text()) == set(range(partitions)), 120, what="B restored all")
        taken_over = watcher.distinct()
        wait_until(lambda: watcher.distinct() >= taken_over + 400, 120, what="B mixing on its own")
        events = events[:200] + flow.stop()
        wait_until(lambda: watcher.distinct() >= len(events), 180, what="every (partition, offset) predicted")
        assert stop_process(processes["b"], logs["b"]) == 0, tail(logs["b"])
        watcher.settle()
    finally:
        flow.stop()
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        by_source = watcher.stop()

    assert not has_traceback(logs["b"].read_text(errors="replace")), tail(logs["b"])
    mix_topic = f"mix-{topics['group_id']}"
    records = [decode_checkpoint(m.value) for m in read_all(bootstrap, mix_topic, read_committed=True)]
    committed = {(int(owner_of(r).task.split("-")[1]), r.seq): r for r in records}
    assert len(committed) == len(records), "a mix number published twice"
    assert len(read_all(bootstrap, mix_topic)) > len(records), "no mix record was aborted: the test proves nothing"
    checkpoints = replicas(args, partitions, committed=True)
    for p in range(partitions):
        mine = of_partition(events, p)
        published, learner = _replay_mixing(mine, p, lambda r, p=p: r.positions[(input_topic, p)], committed)
        for offset, (e, (y_pred, score, mistake, model)) in enumerate(zip(mine, published)):
            [value] = by_source[(p, offset)]  # once, for a read_committed reader
            got = json.loads(value)
            assert (got["id"], got["y_pred"], got["score"], got["mistake"], got["model"]) == (
                e["id"],
                y_pred,
                score,
                mistake,
                model,
            ), (p, offset)
        assert checkpoints[p].positions == {(input_topic, p): len(mine)}
        assert checkpoints[p].model == learner.to_state(), f"partition {p}: not its replay"
    assert len(by_source) == len(events)
    assert any(q != p for (p, _), r in committed.items() for q, _, _ in r.task["mix"]["inputs"]), "nothing mixed"


def test_exactly_once_with_the_local_store_is_refused_at_start_up(apache_kafka, topics, tmp_path):
    log_path = tmp_path / "serve.log"
    args = settings_args(apache_kafka, topics, tmp_path, **EXACTLY_ONCE)
    assert exit_code(args, log_path) == 2, tail(log_path)  # a bad setting (docs/reference/cli.md)
    assert "--processing-guarantee exactly-once needs --state-store kafka (it is local)" in log_path.read_text()


def test_exactly_once_on_the_embedded_broker_is_refused_at_start_up(broker, topics, tmp_path):
    log_path = tmp_path / "serve.log"
    args = settings_args(broker, topics, tmp_path, **EXACTLY_ONCE, **store_args("kafka", topics))
    assert exit_code(args, log_path) == 2, tail(log_path)  # a bad setting, found by the broker's cluster id
    assert "invalid setting processing_guarantee (--processing-guarantee" in log_path.read_text()
    assert "--processing-guarantee exactly-once cannot hold on the embedded broker" in log_path.read_text()
