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
    tail,
    wait_assigned,
)
from tests.support.topics import produce, read_all
from tests.support.waiting import wait_until

#: Points, each with WIDTH features of its own and SHARED features common to all.
POINTS, WIDTH, SHARED = 3000, 100, 5


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
    extra = (
        {
            "state_store": "kafka",
            "checkpoint_topic": f"ckpt-{topics['group_id']}",
            "pending_topic": f"pending-{topics['group_id']}",
        }
        if store == "kafka"
        else {}
    )
    args = settings_args(
        apache_kafka,
        names,
        tmp_path,
        kafka_client=client,
        batch_size=100,
        max_model_features=0,  # no cap: the model holds every feature labeled, 300,000 at the end
        checkpoint_interval_events=1000,
        checkpoint_interval_seconds=3600.0,  # by the count of events alone: none while the test waits
        **extra,
    )
    logs = [tmp_path / "serve-1.log", tmp_path / "serve-2.log"]
    predictions = OutputWatcher(bootstrap, names["output_topic"])
    outcomes = OutputWatcher(bootstrap, names["outcome_topic"], by=label_offset)
    predictions.start()
    outcomes.start()
    ends = None
    process = start_service_process(args, logs[0])
    try:
        wait_assigned(process, logs[0], names["input_topic"])
        produce(
            bootstrap,
            names["input_topic"],
            [{"id": p["id"], "features": p["x"]} for p in points],
            keys=[p["id"].encode() for p in points],
        )
        wait_until(
            lambda: predictions.distinct() >= POINTS or process.poll() is not None, 120, what="every point predicted"
        )
        predictions.settle()
        # nothing is written until labels come (the time interval is longer than the test): the checkpoint now is
        # the last of the points; the kill comes in the second checkpoint of the label phase, after 1,000 labels
        # joined at least and before the last (3,000 events of labels, at most 999 points unsaved before them)
        before = final_checkpoint(args, store)
        seq = 0 if before is None else before.seq
        target = seq + 2
        if store == "local":
            task_dir = LocalStore(load(ServeSettings, args).state_dir, topics["group_id"]).task_dir("model")
            temp = task_dir / f"checkpoint-{target:012d}.tmp"
            send_labels(apache_kafka, names["label_topic"], labels)
            _kill_when(process, temp.exists, f"the temporary file of checkpoint {target}")
            # in the middle of the write: its temporary file is there, not renamed; the newest checkpoint the one before
            assert temp.exists(), f"no temporary file of checkpoint {target} after the kill:\n{tail(logs[0])}"
            left = temp.stat().st_size
            newest = LocalStore(load(ServeSettings, args).state_dir, topics["group_id"]).files("model")[0]
            assert newest.name == f"checkpoint-{target - 1:012d}.json", newest
        else:
            ends = _EndOffsets(bootstrap, extra["pending_topic"], extra["checkpoint_topic"])
            _, checkpoints_0 = ends()
            send_labels(apache_kafka, names["label_topic"], labels)
            # checkpoint seq + 1's record came (after its changelog); the changelog moving again is checkpoint
            # seq + 2's changes, written before its record
            moved: list[int] = []

            def second_changelog() -> bool:
                changelog, checkpoints = ends()
                if not moved and checkpoints > checkpoints_0:
                    moved.append(changelog)
                return bool(moved) and changelog > moved[0]

            _kill_when(process, second_changelog, f"the pending changelog of checkpoint {target}")
            # in the middle of the write: the changelog holds checkpoint target's changes, the topic no record of it
            written = final_checkpoint(args, store)
            assert written is not None and written.seq == target - 1, (written and written.seq, target)
            epochs = [orjson.loads(m.value)["epoch"] for m in read_all(bootstrap, extra["pending_topic"]) if m.value]
            left = sum(epoch == target for epoch in epochs)
            assert left > 0 and max(epochs) == target, (sorted(set(epochs)), target)
        killed_at = outcomes.distinct()
        assert 0 < killed_at < len(labels), killed_at  # labels joined, points pending
        process = start_service_process(args, logs[1])
        wait_assigned(process, logs[1], names["input_topic"])
        wait_until(
            lambda: outcomes.distinct() >= len(labels) or process.poll() is not None, 120, what="every label joined"
        )
        assert stop_process(process, logs[1]) == 0, tail(logs[1])
        outcomes.settle()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        predictions.stop()
        outcomes.stop()
        if ends is not None:
            ends.close()
    assert not has_traceback(logs[1].read_text()), tail(logs[1])
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
        assert not temp.exists() and (task_dir / f"checkpoint-{target:012d}.json").exists()
    features = len(learner.to_state()["features"])
    print(f"{store}: killed in checkpoint {target} ({left} {'bytes' if store == 'local' else 'changelog records'} "
          f"written), {killed_at} labels joined; {features} features at the end")  # fmt: skip
