"""A SIGKILL in the middle of a checkpoint write (issue 38): the restart restores exactly.

A checkpoint is written in steps, and a crash may come between any two of them. With delayed labels on, the
pending points are made durable first (:meth:`~perceptron_stream.pipeline.labels.Joiner.before_save`), then the
checkpoint is written, then its positions are committed:

- the local store commits the pending tables (SQLite, beside the checkpoints), then writes the checkpoint into a
  temporary file (created, encoded into, fsynced) and renames it into place;
- the Kafka store writes the epoch's changes to the pending changelog (acknowledged), then the checkpoint record.

Each test here kills the service (a real process, SIGKILL) inside that sequence, at a place the test sees from
outside and checks after the kill: the local store's temporary file of the checkpoint, left behind with no
checkpoint of its sequence number; the Kafka store's changelog records of a checkpoint whose record never came.
The kill lands in the label phase, points pending and labels joined; the model is wide (each point has features of
its own: 100,000 and more once labeled), so that each checkpoint takes tens of milliseconds to write and the
kill, polled for every half millisecond, lands inside it. The restart restores the checkpoint before, the pending
tables as it had them (the changes after it undone), and every label is learned once: the model at the end is the
offline replay's, to the last bit.
"""

from __future__ import annotations

import json
import random
import signal
import time

import orjson
import pytest
from perceptron_stream.config import ServeSettings, load
from perceptron_stream.state.local import LocalStore

from tests.support.labels import label_topics, replay_labels, send_labels
from tests.support.launch import settings_args, start_service_process
from tests.support.service import (
    OutputWatcher,
    final_checkpoint,
    has_traceback,
    label_offset,
    stop_process,
    store_args,
    tail,
    wait_assigned,
)
from tests.support.topics import produce, read_all
from tests.support.waiting import wait_until

#: Points, each with WIDTH features of its own and SHARED features common to all.
POINTS, WIDTH, SHARED = 4000, 100, 5


def _wide_points(seed: int) -> list[dict]:
    """Points ``w-<i>``, named features: ``s0``..``s4`` shared (the label is their weighted sum's sign) and WIDTH of
    their own; the label aside in ``_y``."""
    rng = random.Random(seed)
    truth = [rng.uniform(-1, 1) for _ in range(SHARED)]
    points = []
    for i in range(POINTS):
        shared = [rng.uniform(-1, 1) for _ in range(SHARED)]
        x = {f"s{j}": v for j, v in enumerate(shared)} | {f"w{i}-{j}": rng.uniform(-1, 1) for j in range(WIDTH)}
        y = 1 if sum(t * v for t, v in zip(truth, shared)) > 0 else -1
        points.append({"id": f"w-{i}", "x": x, "_y": y})
    return points


def _kill_when(process, seen, what: str, timeout: float = 120.0) -> None:
    """SIGKILL ``process`` as soon as ``seen()`` is true (polled every half millisecond)."""
    deadline = time.monotonic() + timeout
    while not seen():
        assert process.poll() is None, f"the service exited with {process.returncode} before {what}"
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f} s waiting for {what}"
        time.sleep(0.0005)
    process.send_signal(signal.SIGKILL)
    process.wait()


class _EndOffsets:
    """The end offsets of partition 0 of some topics, asked of the brokers by one consumer (a request each time)."""

    def __init__(self, bootstrap: str, *topics: str):
        from kafka import KafkaConsumer, TopicPartition

        self.consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
        self.tps = [TopicPartition(topic, 0) for topic in topics]

    def __call__(self) -> list[int]:
        ends = self.consumer.end_offsets(self.tps)
        return [ends[tp] for tp in self.tps]

    def close(self) -> None:
        self.consumer.close()


@pytest.mark.parametrize(("store", "client"), [("local", "kafka-python"), ("kafka", "confluent")])
def test_a_sigkill_in_the_middle_of_a_checkpoint_write_restores_exactly(apache_kafka, topics, tmp_path, store, client):
    bootstrap = apache_kafka.bootstrap_servers
    names = label_topics(apache_kafka, topics)
    points = _wide_points(seed=38)
    labels = [(p["id"], p["_y"]) for p in points]
    random.Random(38).shuffle(labels)
    extra = store_args(store, topics, pending=True)
    args = settings_args(
        apache_kafka,
        names,
        tmp_path,
        kafka_client=client,
        batch_size=100,
        max_model_features=0,  # no cap: the model holds every feature labeled, 400,000 at the end
        checkpoint_interval_events=1000,
        checkpoint_interval_seconds=3600.0,  # by the count of events alone: none while the test waits
        **extra,
    )
    logs: list = []

    def started(name: str):
        logs.append(tmp_path / f"serve-{name}.log")
        process = start_service_process(args, logs[-1])
        wait_assigned(process, logs[-1], names["input_topic"])  # restored (group scope): the changelog repaired too
        return process

    state = LocalStore(load(ServeSettings, args).state_dir, topics["group_id"])
    ends = _EndOffsets(bootstrap, extra["pending_topic"], extra["checkpoint_topic"]) if store == "kafka" else None
    predictions = OutputWatcher(bootstrap, names["output_topic"]).start()
    outcomes = None
    process = None
    landed, missed = "", []
    try:
        process = started("1")
        produce(
            bootstrap,
            names["input_topic"],
            [{"id": p["id"], "features": p["x"]} for p in points],
            keys=[p["id"].encode() for p in points],
        )
        wait_until(
            lambda: predictions.distinct() >= POINTS or process.poll() is not None, 120, what="every point predicted"
        )
        # Nothing is written until labels come (the time interval is longer than the test). The first kill is aimed
        # at the label phase's second checkpoint: 1,000 labels joined at least, points pending. A kill that came
        # too late (the write over before it: a test process held up on a loaded machine) is a miss, no failure of
        # the service's: the run is started again and the next checkpoint is aimed at.
        for attempt in range(4):
            newest = final_checkpoint(args, store)
            target = (0 if newest is None else newest.seq) + (2 if attempt == 0 else 1)
            if ends is None:
                temp = state.task_dir("model") / f"checkpoint-{target:012d}.tmp"
                seen = temp.exists
            else:
                changelog_0, checkpoints_0 = ends()
                # the first aim: checkpoint seq + 1's record came (after its changelog), then the changelog moves
                # again: checkpoint seq + 2's changes, written before its record; after a miss, the changelog's
                # next move (the restore's repairs were written before the assignment)
                moved: list[int] = [] if attempt == 0 else [changelog_0]

                def seen(moved=moved, checkpoints_0=checkpoints_0) -> bool:
                    changelog, checkpoints = ends()
                    if not moved and checkpoints > checkpoints_0:
                        moved.append(changelog)
                    return bool(moved) and changelog > moved[0]

            if attempt == 0:
                send_labels(apache_kafka, names["label_topic"], labels)
            _kill_when(process, seen, f"the write of checkpoint {target}")
            landed = _inside_the_write(args, store, state, target, extra)
            if landed:
                break
            missed.append(target)
            process = started(str(attempt + 2))
        assert landed, f"no kill landed inside the write of checkpoint {missed}"
        outcomes = OutputWatcher(bootstrap, names["outcome_topic"], by=label_offset).start()
        killed_at = outcomes.settle()
        assert 0 < killed_at < len(labels), killed_at  # labels joined, points pending
        process = started("final")
        wait_until(
            lambda: outcomes.distinct() >= len(labels) or process.poll() is not None, 120, what="every label joined"
        )
        assert stop_process(process, logs[-1]) == 0, tail(logs[-1])
        outcomes.settle()
    finally:
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()
        predictions.stop()
        if outcomes is not None:
            outcomes.stop()
        if ends is not None:
            ends.close()
    for log_path in logs:  # a killed run's log may end mid-line: no matter
        assert not has_traceback(log_path.read_text(errors="replace")), f"{log_path.name}:\n{tail(log_path)}"
    _, expected, _, learner = replay_labels(points, labels, max_features=None)
    first = {offset: json.loads(values[0]) for offset, values in outcomes.by_source.items()}
    assert sorted(first) == list(range(len(labels)))
    assert [(first[i]["id"], first[i]["y"], first[i]["y_pred"], first[i]["score"]) for i in range(len(labels))] == [
        e[:4] for e in expected
    ]
    checkpoint = final_checkpoint(args, store)
    counters = checkpoint.model["counters"]
    assert (counters["seen"], counters["labeled"]) == (
        POINTS,
        len(labels),
    )  # each point seen once, each label learned once
    assert checkpoint.model == learner.to_state()  # the offline replay's model, to the last bit of every weight
    assert checkpoint.task["labels"]["pending"] == {"0": 0} and checkpoint.task["labels"]["early"] == {"0": 0}
    letters = " ".join(m.value.decode() for m in read_all(bootstrap, names["dlq_topic"]))
    assert "unknown_id" not in letters and "duplicate" not in letters
    if store == "local":  # the restart wrote checkpoint target again, over the temporary file the kill left
        assert not list(state.task_dir("model").glob("*.tmp")) and state.files("model")[0].name > temp.name
    features = len(learner.to_state()["features"])
    print(f"{store}: killed in checkpoint {target}, {landed}, after {killed_at} labels joined (missed: {missed}); "
          f"{features} features at the end")  # fmt: skip


def _inside_the_write(args, store: str, state: LocalStore, target: int, extra: dict) -> str:
    """Whether the kill came inside the write of checkpoint ``target`` (what it had written, said), or after it
    (""). Local: its temporary file is there, not renamed, and the newest checkpoint is the one before. Kafka: the
    pending changelog holds changes of its epoch, and the topic no record of it (the newest is the one before)."""
    if store == "local":
        temp = state.task_dir("model") / f"checkpoint-{target:012d}.tmp"
        newest = state.files("model")
        if not temp.exists() or not newest or newest[0].name != f"checkpoint-{target - 1:012d}.json":
            return ""
        return f"{temp.stat().st_size} bytes of its temporary file written"
    written = final_checkpoint(args, store)
    if written is None or written.seq != target - 1:
        return ""
    epochs = [
        orjson.loads(m.value)["epoch"]
        for m in read_all(load(ServeSettings, args).bootstrap_servers, extra["pending_topic"])
        if m.value
    ]
    assert max(epochs) == target, (sorted(set(epochs)), target)  # nothing of a later epoch: none was begun
    return f"{epochs.count(target)} changelog records of its epoch written"
