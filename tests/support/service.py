"""Running the service as a real process and checking what it did: the helpers the integration tests share.

The events a test feeds and what an uninterrupted run makes of them
(:func:`make_events`, :func:`offline`), a reader of the output topic
(:class:`OutputWatcher`) and the check every crash-style test ends with
(:func:`check_outputs`), the newest checkpoint (:func:`final_checkpoint`),
and the service's process and log (:func:`stop_process`,
:func:`run_to_the_end`, :func:`has_traceback`, ...).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

from perceptron_stream.config import ServeSettings, load
from perceptron_stream.kafka import CompactedTopic
from perceptron_stream.learning import make_learner
from perceptron_stream.state.kafka_store import KafkaStore
from perceptron_stream.state.local import LocalStore
from perceptron_stream.streams import separable

from tests.support.launch import start_service_process
from tests.support.topics import create_topic, end_offset
from tests.support.waiting import wait_until

DEFAULT_MAX_MODEL_FEATURES = ServeSettings.model_fields["max_model_features"].default


def make_events(count: int, seed: int, dimensions: int = 10, noise: float = 0.05) -> list[dict]:
    return [dict(e) for e, _ in zip(separable(dimensions=dimensions, noise=noise, seed=seed), range(count))]


def offline(events: list[dict], variant: str = "plain") -> tuple[list[dict], dict]:
    """What an uninterrupted run publishes for each event, and its final model state (the service's default cap)."""
    learner = make_learner(variant, max_features=DEFAULT_MAX_MODEL_FEATURES)
    expected = []
    for e in events:
        y_pred, score, mistake = learner.step(e["x"], e.get("y"))
        expected.append(
            {
                "id": e["id"],
                "y_pred": y_pred,
                "score": score,
                "y": e.get("y"),
                "mistake": mistake,
                "model": {"version": learner.updates, "seen": learner.seen, "mistakes": learner.mistakes},
            }
        )
    return expected, learner.to_state()


def source_offset(doc: dict) -> int:
    """An output's input offset: what :class:`OutputWatcher` files it under by default (a one-partition input)."""
    return doc["source"]["offset"]


def source_partition_offset(doc: dict) -> tuple[int, int]:
    """An output's input (partition, offset): for an input topic of several partitions."""
    return doc["source"]["partition"], doc["source"]["offset"]


def label_offset(doc: dict) -> int:
    """An outcome's label offset (``label_source``): each label's outcome, however often it was published."""
    return doc["label_source"]["offset"]


class OutputWatcher:
    """Reads a one-partition output topic from its start, in a thread, while the test runs (``read_committed``:
    only what committed transactions wrote, as a consumer of exactly-once outputs reads). Each output is filed under
    ``by`` of its JSON (its input offset by default)."""

    def __init__(self, bootstrap: str, topic: str, read_committed: bool = False, by=source_offset):
        from kafka import KafkaConsumer, TopicPartition

        create_topic(bootstrap, topic)  # one partition, before the service would create it
        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            group_id=None,
            request_timeout_ms=10_000,
            isolation_level="read_committed" if read_committed else "read_uncommitted",
        )
        tp = TopicPartition(topic, 0)
        self.consumer.assign([tp])
        self.consumer.seek_to_beginning(tp)
        self.bootstrap, self.tp, self.read_committed = bootstrap, tp, read_committed
        self.position = 0  # the watcher's read position: every record before it is filed
        self.by = by
        self.by_source: dict = {}  # input offset (``by``) -> every output value for it
        self.keys: dict = {}  # input offset (``by``) -> the Kafka key of each of those outputs
        self.records = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> OutputWatcher:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                batches = self.consumer.poll(timeout_ms=200)
            except Exception:  # the broker may be frozen on purpose; keep trying
                time.sleep(0.2)
                continue
            with self._lock:
                for messages in batches.values():
                    for m in messages:
                        offset = self.by(json.loads(m.value))
                        self.by_source.setdefault(offset, []).append(m.value)
                        self.keys.setdefault(offset, []).append(m.key)
                        self.records += 1
            try:
                self.position = self.consumer.position(self.tp, timeout_ms=1000) or self.position
            except Exception:  # as poll: the broker may be frozen on purpose
                pass

    def settle(self, quiet_s: float = 0.5, timeout: float = 60.0) -> int:
        """Wait until the topic is read to its end offset as it is now (its last stable offset when
        ``read_committed``), then until nothing new arrived for ``quiet_s``; the distinct count.

        The end offset, not quiet alone: a watcher behind a loaded broker or starved of CPU can go ``quiet_s``
        without a record while records wait for it (the embedded broker's end offset may read short by a batch:
        there the quiet covers the rest, as before)."""
        end = self._end_offset()
        last, since = -1, time.monotonic()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.records != last or self.position < end:
                last, since = self.records, time.monotonic()
            elif time.monotonic() - since >= quiet_s:
                return self.distinct()
            time.sleep(0.05)
        raise AssertionError(
            f"the output topic was not read to its end offset {end} (at {self.position}) or kept growing for "
            f"{timeout:.0f} s"
        )

    def _end_offset(self) -> int:
        return end_offset(self.bootstrap, self.tp.topic, self.tp.partition, self.read_committed)

    def distinct(self) -> int:
        with self._lock:
            return len(self.by_source)

    def seen(self, key) -> int:
        """How many outputs were filed under ``key`` so far. A restarted run is at the end of a one-partition stream
        once the output of its last offset was seen once more than before it started: the distinct count cannot
        say so when a killed or stopped run had published past the position the next one resumes at."""
        with self._lock:
            return len(self.by_source.get(key, ()))

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(30)
        self.consumer.close()
        return self.by_source


OUTPUT_FIELDS = ("id", "source", "y_pred", "score", "y", "mistake", "model")


class GroupHolder:
    """A member that joins a consumer group, takes its partitions, then stops polling: a rebalance it must join
    again is held for its whole ``max_poll_interval_ms`` (Apache Kafka's coordinator waits that long for every member
    to rejoin), so a service that starts meanwhile is inside its group join for as long as the holder is there,
    however long the start took. A kill "in the join" then lands there on a loaded machine too; a dead member's session
    (6 s) cannot promise that. :meth:`release` leaves the group.

    The hold counts from the holder's own last poll, its construction, not from the service's join: kafka-python's
    heartbeat thread leaves the group once ``max_poll_interval_ms`` has passed since the last poll. So ``hold_ms``
    must cover the whole start of the service it holds (the callers' waits for it), not only the join.
    """

    def __init__(self, bootstrap: str, topic: str, group_id: str, hold_ms: int = 60_000):
        from kafka import KafkaConsumer

        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group_id,
            enable_auto_commit=False,
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
            max_poll_interval_ms=hold_ms,
            request_timeout_ms=hold_ms + 5000,
        )
        self.consumer.subscribe([topic])
        wait_until(
            lambda: self.consumer.poll(timeout_ms=200, max_records=1) is not None and self.consumer.assignment(),
            60,
            what=f"a holder of group {group_id}",
        )

    def release(self) -> None:
        self.consumer.close()


def check_outputs(
    by_source: dict[int, list[bytes]],
    expected: list[dict],
    *,
    input_topic: str | None = None,
    keys: dict[int, list[bytes | None]] | None = None,
    input_keys: list[bytes | None] | None = None,
) -> int:
    """Every offset predicted, every copy identical and equal to the uninterrupted run; returns the repeats.

    Each output must have exactly the wire contract's fields, name its input
    (``source``: the input topic, partition 0 and the offset it is filed
    under) and match ``expected`` in value AND type (``true`` is not ``1``,
    ``1`` is not ``1.0``, ``-0.0`` is not ``0.0``). With ``keys`` (an
    OutputWatcher's), each output's Kafka key must be its input's
    (``input_keys``, None when the input had none).
    """
    missing = [o for o in range(len(expected)) if o not in by_source]
    assert not missing, f"{len(missing)} input offsets have no prediction, first {missing[:10]}"
    assert sorted(by_source) == list(range(len(expected))), "predictions for offsets that were never produced"
    topics = set()
    repeats = 0
    for offset, values in by_source.items():
        first = json.loads(values[0])
        for value in values[1:]:
            again = json.loads(value)
            for field in ("y_pred", "score", "mistake", "model"):
                assert json.dumps(again[field]) == json.dumps(first[field]), (offset, field, first, again)
            assert value == values[0], (offset, values[0], value)  # the whole message, byte for byte
        repeats += len(values) - 1
        assert sorted(first) == sorted(OUTPUT_FIELDS), (offset, "fields", sorted(first))
        source = first["source"]
        assert sorted(source) == ["offset", "partition", "topic"], (offset, source)
        assert source["partition"] == 0 and source["offset"] == offset, (offset, source)
        topics.add(source["topic"])
        got = {k: first[k] for k in OUTPUT_FIELDS if k != "source"}
        # json.dumps tells the types apart where == does not (True == 1 == 1.0, -0.0 == 0.0)
        assert json.dumps(got, sort_keys=True) == json.dumps(expected[offset], sort_keys=True), (
            offset,
            got,
            expected[offset],
        )
        if keys is not None:
            want = None if input_keys is None else input_keys[offset]
            assert keys[offset] == [want] * len(values), (offset, "keys", keys[offset], want)
    assert topics == ({input_topic} if input_topic else topics) and len(topics) == 1, f"source topics {topics}"
    return repeats


def final_checkpoint(args: list[str], store: str):
    settings = load(ServeSettings, args)
    if store == "local":
        return LocalStore(settings.state_dir, settings.group_id).load("model")
    kafka_store = KafkaStore(CompactedTopic(settings, settings.checkpoint_topic), settings.group_id)
    try:
        return kafka_store.load("model")
    finally:
        kafka_store.close()


def stop_process(process: subprocess.Popen, log_path: Path, timeout: float = 30.0) -> int:
    """SIGTERM and wait; the exit code (the log's tail in the failure message)."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise AssertionError(f"the service did not stop on SIGTERM:\n{tail(log_path)}") from None
    return process.returncode


#: Where a service starts closing its clients: SIGTERM, or its refusal to run as a second instance.
CLOSING = re.compile(r"stopping: finishing the batch in hand|consumer group \S+ still has \d+ other active member")
LOG_RECORD = re.compile(r"(?m)^(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} )")  # where each record of the log starts
KAFKA_PYTHON_RECORD = re.compile(r"\S+ \S+ [A-Z]+ +kafka\.")


def without_close_noise(log: str) -> str:
    """``log`` without what kafka-python's own loggers wrote once the service began to close its clients.

    kafka-python 3.0.12 races with itself closing connections and logs it as
    ERROR with a traceback, now and then (seen: kafka/net/transport.py
    ``_sock_recv`` after ``close()`` set ``_sock`` to None; kafka/net/selector.py
    ``register_event`` for a socket already closed). Not the service's; every
    other record stays, and the run must still end as it should.
    """
    closing = CLOSING.search(log)
    if closing is None:
        return log
    after = LOG_RECORD.split(log[closing.end() :])
    return log[: closing.end()] + "".join(r for r in after if not KAFKA_PYTHON_RECORD.match(r))


def has_traceback(log: str) -> bool:
    """Whether a service's ``log`` holds a traceback (see without_close_noise)."""
    return "Traceback" in without_close_noise(log)


def tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no log)"


def wait_assigned(process: subprocess.Popen, log_path: Path, topic: str, timeout: float = 120.0) -> None:
    """Until the service holds its partition (it logs "assigned <topic>[0]").

    In ``--model-scope group`` the model is restored at start-up, before the group join, so it is restored too. In
    ``--model-scope partition`` "assigned" is logged before the partition's replica is restored (the loop restores
    it at its next turn): a caller that needs the restore waits for its "restored checkpoint ... of partition-N" or
    "no checkpoint yet of partition-N" line.
    """
    wait_until(
        lambda: process.poll() is not None or f"assigned {topic}[0]" in log_path.read_text(errors="replace"),
        timeout,
        what="the service's assignment",
    )
    assert process.poll() is None, f"exited with {process.returncode}:\n{tail(log_path)}"


def store_args(store: str, topics: dict, pending: bool = False) -> dict:
    """The settings of ``store`` (kafka: its checkpoint topic, and with ``pending`` the delayed labels' changelog
    topic, each named after the test's group)."""
    if store == "kafka":
        topic = {"pending_topic": f"pending-{topics['group_id']}"} if pending else {}
        return {"state_store": "kafka", "checkpoint_topic": f"ckpt-{topics['group_id']}", **topic}
    return {}


def run_to_the_end(args, watcher, count, log_path, records: int = 0) -> None:
    """Start the service, wait for every offset (and ``records`` outputs in all), stop it with SIGTERM (exit 0)."""
    process = start_service_process(args, log_path)
    try:
        wait_assigned(process, log_path, load(ServeSettings, args).input_topic)
        wait_until(
            lambda: (watcher.distinct() >= count and watcher.records >= records) or process.poll() is not None,
            120,
            what=f"{count} offsets predicted",
        )
        assert process.poll() is None, f"exited with {process.returncode}:\n{tail(log_path)}"
    finally:
        code = stop_process(process, log_path)
    assert code == 0, tail(log_path)


def exit_code(args, log_path, timeout=60.0) -> int:
    """Run a service that must stop by itself; its exit code."""
    process = start_service_process(args, log_path)
    try:
        return process.wait(timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
