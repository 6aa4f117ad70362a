"""End to end: the service against a bare Kafka client, on the same broker: Apache Kafka, or the embedded one.

    python3 bench/e2e.py                              # the table of bench/README.md (about 5 min), on Apache Kafka
    python3 bench/e2e.py --broker embedded            # the same on the embedded broker (Tansu)
    python3 bench/e2e.py --memory-events 1000000      # also resident memory from 100k to 1M events
    python3 bench/e2e.py --client confluent           # also the confluent-kafka ceiling
    python3 bench/e2e.py --client service-confluent   # also the service on confluent-kafka (--kafka-client confluent)
    python3 bench/e2e.py --client quix+river --client confluent+river   # also what a user would write instead (bench/peers)
    python3 bench/e2e.py --client service-labels      # also the service with delayed labels and two challengers
                                                      # (with service-confluent: on both clients)
    python3 bench/e2e.py --service-tree new=../other  # also the service of another source tree, side by side
    python3 bench/e2e.py --exactly-once               # also exactly-once at two commit intervals beside
                                                      # at-least-once, all on the Kafka store (EXACTLY_ONCE)
    python3 bench/e2e.py --explain 3                  # also the service with --explain 3 (reason codes)
    python3 bench/e2e.py --model-history              # also the service with the model history (its bytes per event)
    python3 bench/e2e.py --events 50000 --repeats 1 --latency-seconds 5   # a quick look
    python3 bench/e2e.py --sparse 1000:50 --client service-confluent   # 50 of 1,000 named features an event

One fresh broker per invocation: Apache Kafka (``--broker apache-kafka``, the
default: the version pinned in tests/apache_kafka/pom.xml, KRaft on loopback,
as the test suite runs it; Java and Maven needed) or the embedded broker
(``--broker embedded``, Tansu). N events (default 200,000;
d = 10, 5% label noise, JSON, ``perceptron_stream.streams.separable``) are pre-produced
to an input topic created with 1 and with 4 partitions. On each, the
contenders take turns (``--repeats`` rounds, the order reversed every other
round), each in a child process of its own, with a fresh group and output topic:

- ceiling kafka-python: a bare pass-through, as tight as the client allows: a
  consumer in a group polls a batch (1000), the producer sends one message per
  input (the value's bytes as they came, the key passed through), flush, check
  every send was acknowledged, commit. The service's client settings (acks=all,
  group timings) except where the ceiling can do better: linger until the flush,
  fetch_max_wait_ms 20 (see CEILING_PRODUCER, CEILING_CONSUMER);
- ceiling confluent (``--client confluent``): the same loop on confluent-kafka;
  ``--client confluent+service-path``: that loop also doing the service's
  work as its batch form does it (decode_many, step_many, the predictions built
  at once, drift detection, metrics): the floor of the batched design;
- service: ``python -m perceptron_stream.cli serve`` with its defaults (local checkpoint
  store with fsync, metrics endpoint); ``--service-tree NAME=DIR`` adds the
  service of another source tree (a proposed change), measured the same way,
  in each configuration asked for (each client, plain and with labels);
  ``--client service-confluent`` adds the service with ``--kafka-client confluent``;
- ``--client service-labels``: the service with a label topic and two
  challengers (``--challengers averaged,pocket``), on the same events split in
  two: each point without its ``y`` on a points topic, its label
  ``{"id", "y"}`` on a label topic, sent LABEL_LAG events after its point into
  the same partition. Done: every label joined (``perceptron_labels_total
  {outcome="joined"}`` reaches N); its span runs from the first prediction to
  the last outcome, and its CPU time is per point with its label;
- peers (``--client quix+river``, ``--client confluent+river``): what a user
  would write instead of the service, river's Perceptron behind a Kafka library,
  each the way its library's documentation shows (bench/peers; the bench extra);
- ``--exactly-once``: the service with the Kafka state store at-least-once, and
  exactly-once at two commit intervals (:data:`EXACTLY_ONCE`), on kafka-python
  and, with ``--client service-confluent``, on confluent-kafka. Throughput from
  the output CreateTimes as for every contender: a transaction's outputs are
  stamped as they are sent, so the span is the processing, commits included.
  Latency is measured where a consumer of exactly-once outputs sees them (they
  become visible at their transaction's commit, not at their CreateTime): on
  arrival at a read_committed reader (:class:`VisibleReader`), arrival − input
  CreateTime, for all at half the kafka-python at-least-once one's rate.

Throughput, the same for all, from the data: N / (CreateTime of the last
output − CreateTime of the first), read back from the output topic once every
output was acknowledged (a ceiling's or a peer's committed offsets reach N; a
service's /metrics count N events, polled every 0.5 s: the service commits at
its checkpoints only, up to 30 s later). Start-up and group join are not
counted; neither is the acknowledgement of the last batch (a few ms, for all
alike). CPU time an event: from the first progress seen to N, where progress
is what completion is read from. Except for the Quix peer: it commits every 5 s
(its default), and stamps each output with its input's CreateTime (so the
outputs' CreateTimes are those of the pre-produced inputs); it prints
"processed N T" lines (T its clock, when its N-th output was produced), from
which the runner takes its progress for the CPU time, and its span.

Latency (``--latency-seconds``, per partition count): on a fresh topic, once the
contender is assigned, events are produced at half the service's measured rate
(each service contender: half its own) with a key of their own; latency =
output CreateTime − input CreateTime (both stamped by the producers at send),
matched by key; the first second is dropped. After each service, the bare loop
of its own client (the kafka-python ceiling; the confluent one for the service
on confluent-kafka, when ``--client confluent`` is asked for) runs at that
service's rate, as the reference of what the broker and client give; the
report gives the ratio of the two p99s.

Memory (``--memory-events``): the service consumes a topic that a producer
feeds continuously; VmRSS (/proc/<pid>/status) is sampled each time its
acknowledged events pass another 100k. With delayed labels, also the most
points pending so far (``perceptron_pending_labels``, read from the same
/metrics scrapes as the progress): they hold the memory when the service falls
behind its feeder.

The machine has 2 cores shared with other work: read the ratios, taken within
a round, and the medians. Results: bench/results/e2e-<time>.json (gitignored).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import itertools
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import orjson  # noqa: E402

from bench.trees import import_root  # noqa: E402

# the client settings of the service (perceptron_stream.kafka)
GROUP_TIMINGS = {"max_poll_interval_ms": 300_000, "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}
PRODUCER = {"acks": "all", "linger_ms": 5, "batch_size": 256 * 1024, "max_request_size": 4 * 1024 * 1024, "retries": 5}
# The ceiling as tight as the client allows:
# - it flushes every batch, so its records may wait for the flush: one produce request per batch
#   instead of one per 5 ms costs kafka-python's sender thread far less (about 10 µs an event);
# - the embedded broker answers a fetch it holds (no data yet) late, up to fetch_max_wait_ms (500):
#   a short one cuts the latency tail and costs nothing while data flows.
CEILING_PRODUCER = {**PRODUCER, "linger_ms": 1000}
CEILING_CONSUMER = {**GROUP_TIMINGS, "fetch_max_wait_ms": 20}
#: ``--exactly-once``: (name, serve's flags) of the services compared, at-least-once first (the reference).
EXACTLY_ONCE = (
    ("service kafka-store", ("--state-store", "kafka")),
    ("service exactly-once 100ms", ("--state-store", "kafka", "--processing-guarantee", "exactly-once")),
    (
        "service exactly-once 1000ms",
        ("--state-store", "kafka", "--processing-guarantee", "exactly-once", "--commit-interval-ms", "1000"),
    ),
)
#: What a service contender's name says of its client.
CLIENT_TAG = {"kafka-python": "", "confluent": " confluent"}
#: ``--model-history``: the service's flags (the topic keyed by each run's group: one topic serves every run).
HISTORY_FLAGS = ("--model-history-topic", "bench.model-history")

#: ``--client service-labels``: its flags, and how many points ahead of its label each point is sent.
LABEL_FLAGS = ["--challengers", "averaged,pocket"]
LABEL_LAG = 1000
#: The outcomes of a label: joined, or dead-lettered (what a run counts as done).
LABELS_SETTLED = ("joined", "unknown_id", "duplicate")


# --------------------------------------------------------------------------- ceilings (child processes)
def ceiling_kafka_python(
    bootstrap: str, input_topic: str, output_topic: str, group: str, events: int, batch: int
) -> None:
    """consume with a group → produce one message per input → flush → commit, per batch."""
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.consumer.subscription_state import ConsumerRebalanceListener
    from kafka.structs import OffsetAndMetadata

    class Announce(ConsumerRebalanceListener):
        def on_partitions_assigned(self, assigned):
            print("assigned", len(assigned), flush=True)

        def on_partitions_revoked(self, revoked):
            pass

    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=batch,
        **CEILING_CONSUMER,
    )
    # kafka-python 3.0.12 can leave a first join on a new Apache Kafka cluster unapplied (no partition, ever: the
    # run timed out at "assigned 0"); the service mends that, so does its ceiling (service/kafka/kp_mends.py)
    from perceptron_stream.kafka.kp_mends import _joins_finished_between_polls_are_completed

    _joins_finished_between_polls_are_completed(consumer)
    consumer.subscribe([input_topic], listener=Announce())
    producer = KafkaProducer(bootstrap_servers=bootstrap, **CEILING_PRODUCER)
    send, poll, flush, commit = producer.send, consumer.poll, producer.flush, consumer.commit
    done = 0
    while done < events:
        batches = poll(timeout_ms=200, max_records=batch)
        if not batches:
            continue
        offsets: dict = {}
        futures: list = []
        keep = futures.append
        for tp, messages in batches.items():
            for m in messages:
                keep(send(output_topic, value=m.value, key=m.key))
            offsets[tp] = OffsetAndMetadata(messages[-1].offset + 1, "", -1)
            done += len(messages)
        flush()  # waits for every request, but a failed send is seen on its future only
        if not all(f.succeeded() for f in futures):
            raise RuntimeError("a message was not acknowledged: nothing committed")
        commit(offsets)
    wait_for_stop()
    producer.close()
    consumer.close(autocommit=False)


def wait_for_stop() -> None:
    """A ceiling stays up until SIGTERM, as a service does, so the runner reads its CPU time after the last event."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(0.1):
        pass


def _partition(message) -> int:
    """A consumed record's partition. confluent-kafka types it ``int | None``: None only on an error event, which the
    loops raise before they ask."""
    partition = message.partition()
    assert partition is not None
    return partition


def _offset(message) -> int:
    """A consumed record's offset (``int | None`` to confluent-kafka, as ``_partition``)."""
    offset = message.offset()
    assert offset is not None
    return offset


def ceiling_confluent(
    bootstrap: str, input_topic: str, output_topic: str, group: str, events: int, batch: int, work: bool = False
) -> None:
    """The same loop on confluent-kafka (librdkafka): errors only are reported back to Python.

    ``work``: also the service's work, as its batch form does it (decode_many, step_many, the predictions built
    at once, drift detection, the metrics once a batch): the floor of the service on this client
    (``--client confluent+service-path``).
    """
    from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition

    failed = []
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            "max.poll.interval.ms": 300_000,
            "fetch.wait.max.ms": 20,
            "broker.address.family": "v4",
        }
    )
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "linger.ms": 1000,
            "batch.size": 1024 * 1024,
            "broker.address.family": "v4",
            "delivery.report.only.error": True,
            "on_delivery": lambda err, msg: failed.append(err),
        }
    )
    consumer.subscribe([input_topic], on_assign=lambda c, partitions: print("assigned", len(partitions), flush=True))
    consume, produce, flush = consumer.consume, producer.produce, producer.flush
    if work:
        from perceptron_stream.learning import make_learner
        from perceptron_stream.metrics import ServiceMetrics
        from perceptron_stream.pipeline.models import DriftWatch
        from perceptron_stream.wire.inputs import Decoder
        from perceptron_stream.wire.outputs import predictions

        decode_many, learner = Decoder(1024 * 1024, 10_000).decode_many, make_learner("plain", 0.0, False)
        metrics = ServiceMetrics(window=1000, version="bench", variant="plain")
        drift = DriftWatch()
        value_of, key_of = Message.value, Message.key
    done = 0
    while done < events:
        messages = consume(num_messages=batch, timeout=0.2)
        if not messages:
            continue
        positions: dict[int, int] = {}  # partition → the last offset of this poll
        if work:  # the service's batched work (Task.process's batch form), per partition as its poll groups them
            started, flags = time.perf_counter(), []
            by_partition: dict[int, list] = {}
            for m in messages:
                if m.error():
                    raise KafkaException(m.error())
                by_partition.setdefault(_partition(m), []).append(m)
            for partition, ms in by_partition.items():
                keys, offsets = list(map(key_of, ms)), list(map(_offset, ms))
                decoded = decode_many(list(map(value_of, ms)), keys)
                if decoded.rejected:
                    raise RuntimeError(decoded.rejected[0][1].error)
                steps = learner.step_many(decoded.xs, decoded.ys)
                flags += steps.flags()
                for key, value in zip(
                    keys,
                    predictions(
                        decoded.ids,
                        input_topic,
                        partition,
                        offsets,
                        steps.y_pred,
                        steps.score,
                        decoded.ys,
                        steps.mistake,
                        steps.updates,
                        steps.seen,
                        steps.mistakes,
                    ),
                ):
                    produce(output_topic, value, key)
                positions[partition] = offsets[-1]
            drift.update(flags)
        else:
            for m in messages:
                if m.error():
                    raise KafkaException(m.error())
                produce(output_topic, m.value(), m.key())
                positions[_partition(m)] = _offset(m)
        if flush(30) or failed:
            raise RuntimeError(f"not acknowledged: {failed[:3]}")
        if work:
            metrics.observe_batch(
                labeled=len(flags), unlabeled=0, mistake_flags=flags, updates=0, latency_s=time.perf_counter() - started
            )
        consumer.commit(
            offsets=[TopicPartition(input_topic, p, o + 1) for p, o in positions.items()], asynchronous=False
        )
        done += len(messages)
    wait_for_stop()
    consumer.close()


CEILINGS: dict[str, Callable[..., None]] = {
    "kafka-python": ceiling_kafka_python,
    "confluent": ceiling_confluent,
    "confluent+service-path": functools.partial(ceiling_confluent, work=True),
}

# What a user would write instead (bench/peers): the module, and the package it needs beyond ours.
# Imported in the worker only, so this file runs without them unless such a contender is asked for.
PEERS = {"quix+river": ("quix_river", "quixstreams"), "confluent+river": ("confluent_river", "confluent_kafka")}


def run_peer(name: str, *args) -> None:
    importlib.import_module(f"bench.peers.{PEERS[name][0]}").run(*args)  # until SIGTERM


# --------------------------------------------------------------------------- broker helpers
class Kafka:
    """Admin, producing and reading helpers on one broker (kafka-python)."""

    def __init__(self, bootstrap: str):
        from kafka import KafkaAdminClient

        self.bootstrap = bootstrap
        self.admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)

    def create(self, name: str, partitions: int) -> None:
        from kafka.admin import NewTopic

        self.admin.create_topics([NewTopic(name, partitions, 1)])

    def committed(self, group: str) -> int:
        try:
            offsets = self.admin.list_group_offsets(group).get(group, {})
        except Exception:  # the group does not exist yet
            return 0
        return sum(max(0, o.offset) for o in offsets.values())

    def producer(self, **overrides):
        from kafka import KafkaProducer

        return KafkaProducer(bootstrap_servers=self.bootstrap, **{**PRODUCER, **overrides})

    def produce(self, topic: str, payloads: list[tuple[bytes, bytes]], partitions: int) -> None:
        """Write every payload, round robin over the partitions, and wait for the acks."""
        producer = self.producer(linger_ms=20, batch_size=1024 * 1024)
        send = producer.send
        for i, (key, value) in enumerate(payloads):
            send(topic, value=value, key=key, partition=i % partitions)
        producer.flush()
        producer.close()

    def produce_split(self, topic: str, split: list[tuple[bytes, bytes, bytes]], partitions: int) -> None:
        """Points to ``topic``.points and labels to ``topic``.labels (see :func:`split_labels`), point i and its
        label in partition i mod ``partitions``, each label sent LABEL_LAG points after its own (later CreateTime)."""
        producer = self.producer(linger_ms=20, batch_size=1024 * 1024)
        for kind, n, key, value in labels_behind(split):
            producer.send(f"{topic}.{kind}", value=value, key=key, partition=n % partitions)
        producer.flush()
        producer.close()

    def read(self, topic: str, count: int, timeout: float = 120.0) -> list:
        """``count`` records from the start of every partition of ``topic``."""
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            group_id=None,
            fetch_max_bytes=64 * 1024 * 1024,
            max_partition_fetch_bytes=16 * 1024 * 1024,
        )
        try:
            tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
            consumer.assign(tps)
            consumer.seek_to_beginning(*tps)
            out: list = []
            deadline = time.monotonic() + timeout
            while len(out) < count and time.monotonic() < deadline:
                for messages in consumer.poll(timeout_ms=200, max_records=100_000).values():
                    out.extend(messages)
            return out
        finally:
            consumer.close()

    def timestamp_span_ms(self, topic: str) -> tuple[int, int]:
        """The smallest and the largest CreateTime of the records of ``topic`` (its first and last records).

        One partition assigned at a time, no pause and resume: kafka-python 3.0.12 never fetches again a
        partition resumed while another one's batch waits in line (service/kafka/kp_mends.py,
        _resumed_partitions_fetch_again), and the last timestamp was then the last partition's alone.
        """
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            enable_auto_commit=False,
            group_id=None,
            max_partition_fetch_bytes=1024 * 1024,
        )
        try:
            tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
            firsts, lasts = [], []
            for tp in tps:
                consumer.assign([tp])
                consumer.seek_to_beginning(tp)
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    messages = consumer.poll(timeout_ms=300, max_records=1).get(tp)
                    if messages:
                        firsts.append(messages[0].timestamp)
                        break
                end = consumer.end_offsets([tp])[tp]  # may read short on the embedded broker: read on to the end
                consumer.seek(tp, max(0, end - 10))  # (exactly-once: a transaction's commit marker is the last)
                last, quiet = 0, 0
                while quiet < 3:
                    got = consumer.poll(timeout_ms=300, max_records=100_000)
                    quiet = 0 if got else quiet + 1
                    for messages in got.values():
                        last = max(last, max(m.timestamp for m in messages))
                lasts.append(last)
            return min(firsts), max(lasts)
        finally:
            consumer.close()

    def close(self) -> None:
        self.admin.close()


# --------------------------------------------------------------------------- runs
class Contender(NamedTuple):
    name: str
    kind: str  # "ceiling", "peer" (bench/peers) or "service"
    client: str
    tree: Path  # where the service's code is (ROOT, or a tree given with --service-tree)
    labels: bool = (
        False  # a service with delayed labels (--client service-labels): points and labels on topics of their own
    )
    flags: tuple[str, ...] = ()  # more flags of serve (--exactly-once's contenders)
    visible: bool = False  # latency on arrival at a read_committed reader (--exactly-once's contenders)


def _label_samples(outcomes) -> tuple[str, ...]:
    """The /metrics sample names of these label outcomes."""
    return tuple(f'perceptron_labels_total{{outcome="{o}"}}' for o in outcomes)


def fail_on_dead_letters(c: Contender, dead_lettered: int | None, log: Path) -> None:
    """A label that joined no point: the service lost what it should have joined, so the run is no figure."""
    if dead_lettered:
        raise RuntimeError(f"{c.name}: {dead_lettered} labels dead-lettered; see {log}")


def split_labels(event: dict) -> tuple[bytes, bytes, bytes]:
    """(key, point, label) of an event: the point without its ``y``, the label ``{"id", "y"}``.

    >>> split_labels({"id": "e-1", "x": [0.5], "y": -1})
    (b'e-1', b'{"id":"e-1","x":[0.5]}', b'{"id":"e-1","y":-1}')
    """
    point = {k: v for k, v in event.items() if k != "y"}
    return event["id"].encode(), orjson.dumps(point), orjson.dumps({"id": event["id"], "y": event["y"]})


def sparse(names: int, active: int, noise: float = 0.05, seed: int = 42):
    """Events of ``active`` named features out of ``names`` (``{"features": {"f0042": v, ...}}``, the names in a
    random order of their own), labelled by a fixed random hyperplane with a bias, ``noise`` of the labels flipped:
    the wide sparse case (``--sparse 1000:50``).

    >>> e = next(sparse(1000, 50)); len(e["features"]), e["y"] in (-1, 1), e["id"]
    (50, True, 's-0')
    """
    import random

    rng = random.Random(seed)
    every = [f"f{i:04d}" for i in range(names)]
    w = {name: rng.uniform(-1, 1) for name in every}
    bias = rng.uniform(-0.2, 0.2)
    for n in itertools.count():
        features = {name: rng.uniform(-1, 1) for name in rng.sample(every, active)}
        y = 1 if sum(w[k] * v for k, v in features.items()) + bias > 0 else -1
        if rng.random() < noise:
            y = -y
        yield {"id": f"s-{n}", "features": features, "y": y}


def labels_behind(split, lag: int = LABEL_LAG):
    """(``"points"`` or ``"labels"``, event number, key, value) in sending order: point n, then the label of point
    n - ``lag``; the last labels after the last point. ``split``: (key, point, label) per event, in order.

    >>> [(kind, n) for kind, n, _, _ in labels_behind([(b"a", b"pa", b"la"), (b"b", b"pb", b"lb")], lag=1)]
    [('points', 0), ('points', 1), ('labels', 0), ('labels', 1)]
    """
    waiting: deque = deque()
    for n, (key, point, label) in enumerate(split):
        yield "points", n, key, point
        waiting.append((n, key, label))
        if len(waiting) > lag:
            yield "labels", *waiting.popleft()
    while waiting:
        yield "labels", *waiting.popleft()


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far, all its threads (/proc/<pid>/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


class Service:
    """``python -m perceptron_stream.cli serve`` (from ``tree``) as a child process."""

    def __init__(
        self,
        tree: Path,
        bootstrap: str,
        input_topic: str,
        output_topic: str,
        group: str,
        partitions: int,
        log_path: Path,
        extra: Sequence[str] = (),
        labels: bool = False,
    ):
        from perceptron_stream.broker import free_port

        self.labels = labels  # done: labels joined, not events
        self.pending: float | None = None  # points waiting for their label, at the last progress read (labels only)

        self.state = tempfile.TemporaryDirectory(prefix="e2e-state-")
        self.port = free_port()
        args = [
            "--bootstrap-servers",
            bootstrap,
            "--input-topic",
            input_topic,
            "--output-topic",
            output_topic,
            "--dlq-topic",
            output_topic + ".dlq",
            "--group-id",
            group,
            "--state-dir",
            self.state.name,
            "--metrics-port",
            str(self.port),
            "--topic-partitions",
            str(partitions),
            *extra,
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PERCEPTRON_STREAM_")}
        env["PYTHONPATH"] = str(import_root(tree))  # the tree's own perceptron_stream (bench/trees.py)
        self.log = open(log_path, "ab")  # noqa: SIM115 — the service's log for its life: stop() closes it
        self.process = subprocess.Popen(
            [sys.executable, "-m", "perceptron_stream.cli", "serve", *args],
            cwd=tree,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the service exited with {self.process.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"the service was not ready after {timeout:.0f} s; see {self.log.name}")

    def processed(self) -> int:
        """Events whose outputs the brokers acknowledged (valid and rejected), from /metrics; with delayed
        labels, the labels settled (joined: a point predicted, then learned and scored; or dead-lettered)."""
        counted = (
            _label_samples(LABELS_SETTLED)
            if self.labels
            else ("perceptron_events_total{", "perceptron_rejected_events_total{")
        )
        samples = self.samples(counted + (("perceptron_pending_labels",) if self.labels else ()))
        self.pending = samples.pop("perceptron_pending_labels", None)  # read by the same scrape: the memory run's
        return int(sum(samples.values()))

    def samples(self, prefixes: tuple[str, ...]) -> dict[str, float]:
        """The /metrics samples whose names (with labels) start with one of ``prefixes``."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return {}
        return {
            name: float(value)
            for name, _, value in (line.rpartition(" ") for line in text.splitlines())
            if name.startswith(prefixes)
        }

    def dead_lettered_labels(self) -> int:
        """Labels that joined no point (unknown_id, duplicate): none is expected in these runs."""
        return int(sum(self.samples(_label_samples(LABELS_SETTLED[1:])).values()))

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        self.state.cleanup()
        return self.process.returncode


class Ceiling:
    """A ceiling loop or a peer (this file, ``--worker``) as a child process."""

    def __init__(
        self,
        client: str,
        bootstrap: str,
        input_topic: str,
        output_topic: str,
        group: str,
        events: int,
        batch: int,
        log_path: Path,
    ):
        self.log_path = log_path
        self.log = open(log_path, "ab")  # noqa: SIM115 — the producer's log for its life: stop() closes it
        self.process = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--worker",
                client,
                "--bootstrap",
                bootstrap,
                "--worker-topics",
                input_topic,
                output_topic,
                group,
                "--events",
                str(events),
                "--batch-size",
                str(batch),
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until the worker says its partitions are assigned."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the worker exited with {self.process.returncode}; see {self.log_path}")
            if b"assigned" in self.log_path.read_bytes():
                return
            time.sleep(0.05)
        raise RuntimeError(f"the worker was not assigned partitions in {timeout:.0f} s; see {self.log_path}")

    def logged(self) -> dict[int, float]:
        """The worker's "processed N T" lines, if it prints them (the Quix peer): N → its clock (ms) when N were done."""
        lines = re.findall(rb"^processed (\d+) ([\d.]+)\n", self.log_path.read_bytes(), re.MULTILINE)
        return {int(n): float(t) for n, t in lines}

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()
        return self.process.returncode


def start(
    c: Contender,
    kafka: Kafka,
    input_topic: str,
    output_topic: str,
    group: str,
    partitions: int,
    events: int,
    batch: int,
    log_path: Path,
):
    for name in (output_topic, output_topic + ".dlq") + ((output_topic + ".outcomes",) if c.labels else ()):
        kafka.create(name, partitions)
    if c.kind in ("ceiling", "peer"):
        return Ceiling(c.client, kafka.bootstrap, input_topic, output_topic, group, events, batch, log_path)
    client = ["--kafka-client", c.client] if c.client != "kafka-python" else []  # the default: also for older trees
    if c.labels:  # input_topic names the pair written by Kafka.produce_split
        return Service(
            c.tree,
            kafka.bootstrap,
            f"{input_topic}.points",
            output_topic,
            group,
            partitions,
            log_path,
            [
                "--batch-size",
                str(batch),
                *client,
                "--label-topic",
                f"{input_topic}.labels",
                "--outcome-topic",
                f"{output_topic}.outcomes",
                *LABEL_FLAGS,
            ],
            labels=True,
        )
    return Service(
        c.tree,
        kafka.bootstrap,
        input_topic,
        output_topic,
        group,
        partitions,
        log_path,
        ["--batch-size", str(batch), *client, *c.flags],
    )


class VisibleReader:
    """What a read_committed consumer of ``topic`` (from its start) sees, and when: the wall-clock ms of the first
    and last arrival and of each key's first. Exactly-once outputs become visible at their transaction's commit,
    not at their CreateTime. confluent-kafka, whose consumer takes the shared cores far less CPU than kafka-python's."""

    def __init__(self, bootstrap: str, topic: str, partitions: int):
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"visible-{topic}",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "fetch.wait.max.ms": 10,
                "broker.address.family": "v4",
            }
        )
        self.consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        self.arrivals: dict[bytes, float] = {}
        self.count = 0
        self.first: float | None = None  # wall-clock ms of the first arrival, and of the last
        self.last: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            messages = [m for m in self.consumer.consume(10_000, 0.05) if m.error() is None]
            if not messages:
                continue
            now = time.time() * 1000
            self.first = self.first or now
            self.last, self.count = now, self.count + len(messages)
            for m in messages:
                if (key := m.key()) is not None:  # every message the bench sends has a key
                    self.arrivals.setdefault(key, now)

    def wait(self, count: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.count < count:
            if time.monotonic() > deadline:
                raise RuntimeError(f"a read_committed reader saw {self.count} of {count} outputs in {timeout:.0f} s")
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()


def wait_done(
    kafka: Kafka, worker, group: str, target: int, timeout: float, interval: float = 0.2, on_progress=None
) -> None:
    """Until ``target`` events are done: a ceiling's or a peer's committed offsets; a service's
    acknowledged events from /metrics (it commits at its checkpoints, up to 30 s later)."""
    deadline = time.monotonic() + timeout
    count = worker.processed if isinstance(worker, Service) else lambda: kafka.committed(group)
    while time.monotonic() < deadline:
        done = count()
        if on_progress is not None:
            on_progress(done)
        if done >= target:
            return
        if worker.process.poll() is not None:
            raise RuntimeError(f"{worker.process.args[:5]} exited with {worker.process.returncode} at {done} done")
        time.sleep(interval)
    raise RuntimeError(f"{target} not done after {timeout:.0f} s")


def throughput_run(
    kafka: Kafka, c: Contender, input_topic: str, partitions: int, events: int, batch: int, tag: str, logs: Path
) -> dict:
    """From the first output's CreateTime to the last one's, once every output was acknowledged.

    Also the CPU time per event of the contender's process (all its threads), from its first
    acknowledged batch to its last: steadier than events/s on a shared machine.

    The Quix peer commits every 5 s (its default) and stamps each output with its input's CreateTime:
    its "processed N T" lines give its progress for the CPU time and the span (see bench/peers/quix_river.py).
    """
    output_topic, group = f"out-{tag}", f"g-{tag}"
    worker = start(c, kafka, input_topic, output_topic, group, partitions, events, batch, logs / f"{tag}.log")
    samples: list[tuple[int, float]] = []
    logged: Callable[[], dict[int, float]] = worker.logged if c.kind == "peer" else dict

    def sample(done: int) -> None:
        said = logged()
        done = max(said) if said else done
        if done and (not samples or (done >= events and samples[-1][0] < events)):
            samples.append((done, cpu_seconds(worker.process.pid)))

    try:
        # a service's progress is read from its /metrics: a scrape costs it ~1.5 ms of CPU, so not
        # too often (Prometheus scrapes every 15 s); the throughput comes from CreateTimes anyway
        wait_done(
            kafka,
            worker,
            group,
            events,
            timeout=900,
            interval=0.5 if isinstance(worker, Service) else 0.1,
            on_progress=sample,
        )
        dead_lettered = worker.dead_lettered_labels() if c.labels else None
        history = worker.samples(("perceptron_history_",)) if "--model-history-topic" in c.flags else {}
    finally:
        worker.stop()
    fail_on_dead_letters(c, dead_lettered, logs / f"{tag}.log")
    said = logged()
    if said:
        if not {1, events} <= said.keys():
            raise RuntimeError(f"{c.name}: no 'processed' line for the first or the last event; see {worker.log_path}")
        first, last, span = said[1], said[events], "the peer's own clock at its first and last output"
    elif c.labels:  # from the first prediction to the last outcome
        first, last = kafka.timestamp_span_ms(output_topic)[0], kafka.timestamp_span_ms(output_topic + ".outcomes")[1]
        span = "the first prediction's CreateTime to the last outcome's"
    else:
        (first, last), span = kafka.timestamp_span_ms(output_topic), "output CreateTimes"
    seconds = (last - first) / 1000
    (done0, cpu0), (done1, cpu1) = samples[0], samples[-1]
    return {
        "name": c.name,
        "partitions": partitions,
        "events": events,
        "seconds": round(seconds, 3),
        "span": span,
        "events_per_s": round(events / seconds, 1),
        **({"dead_lettered_labels": dead_lettered} if c.labels else {}),
        **(
            {
                "history_records": int(history.get("perceptron_history_records_total", 0)),
                "history_bytes_per_event": round(history.get("perceptron_history_bytes_total", 0) / events, 1),
            }
            if history
            else {}
        ),
        "cpu_us_per_event": round((cpu1 - cpu0) / (done1 - done0) * 1e6, 1) if done1 > done0 else None,
    }


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))]


def _rate_sender(
    kafka: Kafka, topic: str
) -> tuple[Callable[[bytes, bytes, int], object], Callable[[], object], Callable[[], None], str]:
    """``rate_producer``'s client: ``send(key, value, partition)``, ``pump()`` between sends, ``finish()`` (all
    acknowledged, or an error), and its name. confluent-kafka when it is installed, else kafka-python."""
    if importlib.util.find_spec("confluent_kafka") is None:
        plain = kafka.producer(linger_ms=1)

        def close() -> None:
            plain.flush()
            plain.close()

        return (
            lambda key, value, partition: plain.send(topic, value=value, key=key, partition=partition),
            lambda: None,
            close,
            "kafka-python",
        )
    from confluent_kafka import Producer

    fast = Producer(
        {"bootstrap.servers": kafka.bootstrap, "linger.ms": 1, "acks": "all", "broker.address.family": "v4"}
    )

    def flush() -> None:
        if fast.flush(30):
            raise RuntimeError("the rate producer's messages were not all acknowledged")

    return (
        lambda key, value, partition: fast.produce(topic, value, key, partition=partition),
        lambda: fast.poll(0),
        flush,
        "confluent-kafka",
    )


def rate_producer(kafka: Kafka, topic: str, payloads, rate: float, seconds: float, partitions: int) -> tuple[int, str]:
    """Send at ``rate`` events/s for ``seconds`` (a schedule checked every 0.5 ms); returns how many were sent, and with what.

    Each message gets a key of its own (its number), by which its output is found. confluent-kafka
    when it is installed: its sends cost the 2-core machine far less CPU than kafka-python's, CPU that
    the service under test would miss (a kafka-python producer at 6,000 events/s takes a good part of a core).
    """
    total = int(rate * seconds)
    source = itertools.cycle(payloads)
    send, pump, finish, client = _rate_sender(kafka, topic)
    sent = 0
    began = time.perf_counter()
    while sent < total:
        due = min(total, int((time.perf_counter() - began) * rate) + 1)
        while sent < due:
            send(b"%d" % sent, next(source)[1], sent % partitions)
            sent += 1
        pump()
        time.sleep(0.0005)
    finish()
    return sent, client


def latency_run(
    kafka: Kafka, c: Contender, payloads, partitions: int, rate: float, seconds: float, batch: int, tag: str, logs: Path
) -> dict:
    """``c`` runs, assigned, while events arrive at ``rate``; latency = output CreateTime − input CreateTime."""
    input_topic, output_topic, group = f"lat-in-{tag}", f"lat-out-{tag}", f"g-lat-{tag}"
    kafka.create(input_topic, partitions)
    total = int(rate * seconds)
    worker = start(c, kafka, input_topic, output_topic, group, partitions, total, batch, logs / f"{tag}.log")
    reader = VisibleReader(kafka.bootstrap, output_topic, partitions) if c.visible else None
    try:
        worker.wait_ready()
        time.sleep(0.5)
        began = time.time()
        sent, producer = rate_producer(kafka, input_topic, payloads, rate, seconds, partitions)
        achieved = sent / (time.time() - began)
        wait_done(kafka, worker, group, sent, timeout=600)
        if reader is not None:
            reader.wait(sent)
        turns = (
            turn_times(worker.samples(("perceptron_poll_loop_turn_seconds_", "perceptron_poll_loop_flush_seconds_")))
            if c.kind == "service"
            else {}
        )
    finally:
        worker.stop()
        if reader is not None:
            reader.stop()
    inputs = {m.key: m.timestamp for m in kafka.read(input_topic, sent)}
    warm_until = min(inputs.values()) + 1000
    if reader is not None:  # arrival at a read_committed reader, not the output's CreateTime
        outputs = [(key, at) for key, at in reader.arrivals.items()]
    else:
        outputs = [(m.key, m.timestamp) for m in kafka.read(output_topic, sent)]
    latencies = sorted(at - inputs[key] for key, at in outputs if inputs[key] >= warm_until)
    return {
        "name": c.name,
        "partitions": partitions,
        "target_rate": round(rate, 1),
        "achieved_rate": round(achieved, 1),
        "producer": producer,
        "sent": sent,
        "outputs": len(outputs),
        "measured": len(latencies),
        "to": "arrival at a read_committed reader" if reader is not None else "output CreateTime",
        "p50_ms": percentile(latencies, 0.50),
        "p99_ms": percentile(latencies, 0.99),
        "max_ms": latencies[-1] if latencies else None,
        **({"turns": turns} if turns else {}),
    }


def said_turns(run: dict) -> str:
    """A latency run's turn times in a line: each kind's turns, mean and the bound under which 99% ended.

    >>> said_turns({"turns": {"batch": {"turns": 90, "mean_ms": 1.5, "p99_under_ms": 5.0, "over_10ms": 0}}})
    '; turns: batch 90 x 1.5 ms (99% under 5.0 ms, 0 over 10 ms)'
    """
    turns = run.get("turns") or {}
    return "".join(
        ("; turns: " if i == 0 else ", ")
        + f"{did} {t['turns']} x {t['mean_ms']} ms (99% under {t['p99_under_ms']} ms, {t['over_10ms']} over 10 ms)"
        for i, (did, t) in enumerate(sorted(turns.items(), key=lambda kv: -kv[1]["mean_ms"] * kv[1]["turns"]))
    )


def turn_times(samples: dict[str, float]) -> dict[str, dict]:
    """The service's turn times by what each turn did (``perceptron_poll_loop_turn_seconds{did}``, scraped at the
    end of a run), and the batches' waits for their acknowledgements within them
    (``perceptron_poll_loop_flush_seconds``, as "(of which the flush)"): per kind, the turns, their mean, and the bucket bound under which 99% of them ended (``le`` of
    the histogram, "+Inf" past the last); where a latency tail comes from (a turn's time delays every output of
    the events that wait behind it)."""
    buckets: dict[str, list[tuple[float, float]]] = {}
    sums: dict[str, float] = {}
    for name, value in samples.items():
        if name.startswith("perceptron_poll_loop_flush_seconds"):  # the batches' waits for acknowledgements
            did, family = "(of which the flush)", name.removeprefix("perceptron_poll_loop_flush_seconds")
        elif 'did="' in name:
            did, family = (
                name.split('did="', 1)[1].split('"', 1)[0],
                name.removeprefix("perceptron_poll_loop_turn_seconds"),
            )
        else:
            continue
        if family.startswith("_bucket"):
            le = name.split('le="', 1)[1].split('"', 1)[0]
            buckets.setdefault(did, []).append((float(le), value))
        elif family.startswith("_sum"):
            sums[did] = value
    out = {}
    for did, bounds in buckets.items():
        bounds.sort()
        count = bounds[-1][1] if bounds else 0
        if not count:
            continue
        p99 = next(le for le, cumulative in bounds if cumulative >= 0.99 * count)
        out[did] = {
            "turns": int(count),
            "mean_ms": round(1000 * sums.get(did, 0.0) / count, 2),
            "p99_under_ms": "+Inf" if p99 == float("inf") else round(1000 * p99, 1),
            "over_10ms": int(count - next((cum for le, cum in bounds if le >= 0.01), count)),
        }
    return out


def latency_pairs(runs: list[dict]) -> list[tuple[dict, dict]]:
    """Each service's latency run with its bare client's at the same rate in the same round, whichever ran first.

    >>> runs = [{"name": "service", "rate_of": "service", "p99_ms": 90, "partitions": 1, "repeat": 0},
    ...         {"name": "ceiling kafka-python", "rate_of": "service", "p99_ms": 80, "partitions": 1, "repeat": 0},
    ...         {"name": "ceiling kafka-python", "rate_of": "service", "p99_ms": 70, "partitions": 1, "repeat": 1},
    ...         {"name": "service", "rate_of": "service", "p99_ms": 60, "partitions": 1, "repeat": 1}]
    >>> [(s["p99_ms"], r["p99_ms"]) for s, r in latency_pairs(runs)]
    [(90, 80), (60, 70)]
    """
    pairs = []
    for a, b in itertools.pairwise(runs):
        if a.get("rate_of") is None or (a["partitions"], a.get("repeat"), a["rate_of"]) != (
            b["partitions"],
            b.get("repeat"),
            b.get("rate_of"),
        ):
            continue
        s, r = (a, b) if a["name"] == a["rate_of"] else (b, a)
        if s["name"] == s["rate_of"] != r["name"] and s["p99_ms"] is not None and r["p99_ms"]:
            pairs.append((s, r))
    return pairs


def p99_ratios(runs: list[dict]) -> dict[tuple[str, int], list[float]]:
    """Each service's p99 / its bare loop's at the same rate, by (service, partitions), round by round.

    >>> runs = [{"name": "s", "rate_of": "s", "p99_ms": 90, "partitions": 1, "repeat": 0},
    ...         {"name": "bare", "rate_of": "s", "p99_ms": 60, "partitions": 1, "repeat": 0},
    ...         {"name": "bare", "rate_of": "s", "p99_ms": 50, "partitions": 1, "repeat": 1},
    ...         {"name": "s", "rate_of": "s", "p99_ms": 40, "partitions": 1, "repeat": 1}]
    >>> p99_ratios(runs)
    {('s', 1): [1.5, 0.8]}
    """
    out: dict[tuple[str, int], list[float]] = {}
    for s, r in latency_pairs(runs):
        out.setdefault((s["name"], s["partitions"]), []).append(round(s["p99_ms"] / r["p99_ms"], 2))
    return out


def memory_run(
    kafka: Kafka, c: Contender, records: list[dict], events: int, batch: int, tag: str, logs: Path, every: int = 100_000
) -> dict:
    """VmRSS of the service each time its acknowledged events pass another ``every``, while a producer feeds it."""
    input_topic, output_topic, group = f"mem-in-{tag}", f"mem-out-{tag}", f"g-mem-{tag}"
    for name in (f"{input_topic}.points", f"{input_topic}.labels") if c.labels else (input_topic,):
        kafka.create(name, 1)
    service = start(c, kafka, input_topic, output_topic, group, 1, events, batch, logs / f"{tag}.log")
    samples: dict[int, int] = {}
    stop = threading.Event()
    payloads = [(e["id"].encode(), orjson.dumps(e)) for e in records]

    def feed():  # continuously, as fast as it goes, until ``events`` were written
        producer = kafka.producer(linger_ms=20, batch_size=1024 * 1024)
        source = itertools.cycle(payloads)
        for _ in range(events):
            if stop.is_set():
                break
            key, value = next(source)
            producer.send(input_topic, value=value, key=key)
        producer.flush()
        producer.close()

    def feed_split():  # points, and each label LABEL_LAG points later; ids made unique on every pass over ``records``
        producer = kafka.producer(linger_ms=20, batch_size=1024 * 1024)
        n = len(records)
        laps = ({**records[i % n], "id": f"{records[i % n]['id']}~{i // n}"} for i in range(events))
        for kind, _, key, value in labels_behind(split_labels(e) for e in laps):
            if stop.is_set():
                break
            producer.send(f"{input_topic}.{kind}", value=value, key=key)
        producer.flush()
        producer.close()

    pending: dict[int, int] = {}  # with labels: the most points pending seen up to each mark (they hold the memory)

    def progress(done: int) -> None:
        mark = done // every * every
        if service.labels and service.pending is not None:
            pending[mark + every] = max(pending.get(mark + every, 0), int(service.pending))
        if mark and mark not in samples:
            samples[mark] = rss_kib(service.pid)

    feeder = threading.Thread(target=feed_split if c.labels else feed, daemon=True)
    try:
        service.wait_ready()
        began, cpu_before = time.time(), cpu_seconds(service.pid)
        feeder.start()
        wait_done(kafka, service, group, events, timeout=3600, interval=0.1, on_progress=progress)
        seconds, cpu = time.time() - began, cpu_seconds(service.pid) - cpu_before
        dead_lettered = service.dead_lettered_labels() if c.labels else None
        fail_on_dead_letters(c, dead_lettered, logs / f"{tag}.log")
    finally:
        stop.set()
        service.stop()
        feeder.join(30)
    first, last = samples[min(samples)], samples[max(samples)]
    # CPU while fed live (labels a moment after their points), beside the throughput runs' pre-produced backlog
    return {
        "name": c.name,
        "events": events,
        "seconds": round(seconds, 1),
        "cpu_us_per_event": round(cpu / events * 1e6, 1),
        **({"dead_lettered_labels": dead_lettered} if c.labels else {}),
        "rss_kib": {str(k): v for k, v in sorted(samples.items())},
        **({"pending_max": {str(k): v for k, v in sorted(pending.items()) if k in samples}} if c.labels else {}),
        "rss_first_mib": round(first / 1024, 1),
        "rss_last_mib": round(last / 1024, 1),
        "growth": round(last / first - 1, 4),
    }


# --------------------------------------------------------------------------- main
def describe_tree(tree: Path) -> str:
    """The commit of a git tree, with '+changes' when its working copy differs from it."""
    try:
        head = subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no", "service"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        return head + ("+changes" if dirty else "")
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "not a git tree"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--broker",
        choices=["apache-kafka", "embedded"],
        default="apache-kafka",
        help="the broker the runs share (default apache-kafka: what users run)",
    )
    parser.add_argument("--events", type=int, default=200_000, help="events per throughput run (default 200000)")
    parser.add_argument("--partitions", default="1,4", help="partition counts, comma-separated (default 1,4)")
    parser.add_argument(
        "--repeats", type=int, default=2, help="runs of each contender per partition count; medians are reported"
    )
    parser.add_argument("--batch-size", type=int, default=1000, help="records per poll, ceiling and service alike")
    parser.add_argument(
        "--sparse",
        metavar="NAMES:ACTIVE",
        help="a sparse stream instead of dense d = 10: events of ACTIVE named features out of NAMES (e.g. 1000:50)",
    )
    parser.add_argument(
        "--client",
        choices=["confluent", "confluent+service-path", "service-confluent", "service-labels", *PEERS],
        action="append",
        default=[],
        help="also the ceiling on confluent-kafka; confluent+service-path: that loop doing the "
        "service's per-event work too (what the service could do on that client); "
        "service-confluent: the service itself on confluent-kafka; quix+river, confluent+river: "
        "what a user would write instead (bench/peers, the bench extra)",
    )
    parser.add_argument(
        "--service-tree",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="also the service from another source tree (e.g. a proposed change), side by side",
    )
    parser.add_argument(
        "--exactly-once",
        action="store_true",
        help="also the service on the Kafka store at-least-once and exactly-once at two commit intervals, timed at a "
        "read_committed reader",
    )
    parser.add_argument(
        "--latency-seconds", type=float, default=10.0, help="length of each fixed-rate latency run (0: skip)"
    )
    parser.add_argument(
        "--latency-repeats",
        type=int,
        default=1,
        help="latency runs of each service and its bare loop per partition count, which goes first alternating "
        "(a run after another has the shorter tail: bench/README.md, 'The checkpoint off the loop'); the median "
        "of the p99 ratios is reported",
    )
    parser.add_argument(
        "--memory-events", type=int, default=0, help="events of the resident-memory run (0: skip; e.g. 1000000)"
    )
    parser.add_argument(
        "--no-throughput",
        action="store_true",
        help="skip the throughput runs (and with them the latency runs): a memory run alone",
    )
    parser.add_argument(
        "--explain",
        type=int,
        default=0,
        help="also the service with --explain K (reason codes in each prediction), on each service client (0: not)",
    )
    parser.add_argument(
        "--model-history",
        action="store_true",
        help="also the service with --model-history-topic (the model history), on each service client, with its bytes "
        "per event (and with --explain K, both on)",
    )
    parser.add_argument("--json", type=Path, help="where to write the results (default bench/results/e2e-<time>.json)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--worker-topics", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        work = CEILINGS[args.worker] if args.worker in CEILINGS else lambda *a: run_peer(args.worker, *a)
        work(args.bootstrap, *args.worker_topics, args.events, args.batch_size)
        return 0

    from perceptron_stream.streams import separable
    from rich.console import Console

    for client in dict.fromkeys(args.client):
        if client in PEERS and importlib.util.find_spec(PEERS[client][1]) is None:
            parser.error(f"--client {client} needs {PEERS[client][1]}: pip install -e '.[bench]'")
        if importlib.util.find_spec("confluent_kafka") is None:  # every other choice runs on it too
            parser.error(f"--client {client} needs confluent-kafka: pip install -e '.[confluent]' (or '.[bench]')")
    if args.exactly_once and importlib.util.find_spec("confluent_kafka") is None:  # its read_committed reader's
        parser.error("--exactly-once needs confluent-kafka: pip install -e '.[confluent]' (or '.[bench]')")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the broker and the children on the way out
    console = Console(width=max(120, Console().width))
    contenders = [Contender("ceiling kafka-python", "ceiling", "kafka-python", ROOT)]
    contenders += [Contender(f"ceiling {c}", "ceiling", c, ROOT) for c in dict.fromkeys(args.client) if c in CEILINGS]
    contenders += [Contender(f"peer {c}", "peer", c, ROOT) for c in dict.fromkeys(args.client) if c in PEERS]

    def service_contenders(tag: str, tree: Path) -> list[Contender]:
        """The service of ``tree`` in each configuration asked for (each client; plain, and with labels)."""
        clients = ["kafka-python"] + (["confluent"] if "service-confluent" in args.client else [])
        return [
            Contender(
                f"service{tag}" + CLIENT_TAG[client] + (" labels+challengers" if labels else ""),
                "service",
                client,
                tree,
                labels=labels,
            )
            for labels in [False] + ([True] if "service-labels" in args.client else [])
            for client in clients
        ]

    trees = [("", ROOT)]
    for spec in args.service_tree:  # another tree, in the same configurations
        name, _, tree = spec.partition("=")
        if not tree or not (Path(tree) / "service" / "cli.py").is_file():
            parser.error(f"--service-tree {spec}: want NAME=DIR, DIR holding service/cli.py")
        trees.append((f"@{name}", Path(tree).resolve()))
    services = [c for tag, tree in trees for c in service_contenders(tag, tree)]
    contenders += services
    # on each client asked for: kafka-python's transactional producer checks the transaction's state under its
    # locks at every send (TransactionManager.maybe_add_partition_to_transaction), librdkafka in C
    eos = [  # (and each --service-tree's, side by side)
        Contender(name + tag + CLIENT_TAG[client], "service", client, tree, flags=f, visible=True)
        for tag, tree in trees
        for client in ["kafka-python"] + (["confluent"] if "service-confluent" in args.client else [])
        for name, f in EXACTLY_ONCE
    ]
    contenders += eos if args.exactly_once else []
    contenders += [  # beside the plain service of each client: what the reason codes cost
        Contender(
            f"service explain {args.explain}" + CLIENT_TAG[client],
            "service",
            client,
            ROOT,
            flags=("--explain", str(args.explain)),
        )
        for client in ["kafka-python"] + (["confluent"] if "service-confluent" in args.client else [])
        if args.explain
    ]
    contenders += [  # beside them: what the model history costs, alone and with the reason codes
        Contender(f"service {name}" + CLIENT_TAG[client], "service", client, ROOT, flags=flags)
        for client in ["kafka-python"] + (["confluent"] if "service-confluent" in args.client else [])
        for name, flags in [("history", HISTORY_FLAGS)]
        + (
            [(f"history+explain {args.explain}", (*HISTORY_FLAGS, "--explain", str(args.explain)))]
            if args.explain
            else []
        )
        if args.model_history
    ]
    bare = {c.client: c for c in contenders if c.kind == "ceiling" and c.client in ("kafka-python", "confluent")}
    partitions = [int(p) for p in args.partitions.split(",")]
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix=f"e2e-{stamp}-"))
    results: dict = {
        "command": " ".join(["python3", "bench/e2e.py", *sys.argv[1:]]),
        "started": stamp,
        "broker": args.broker,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "loadavg_at_start": os.getloadavg()},
        "trees": {c.name: {"path": str(c.tree), "commit": describe_tree(c.tree)} for c in services},
        "events": args.events,
        "dimensions": 10,
        "batch_size": args.batch_size,
        "repeats": args.repeats,
        "throughput": [],
        "latency": [],
        "memory": [],
        "logs": str(logs),
    }

    if args.sparse:
        names, active = (int(n) for n in args.sparse.split(":"))
        results["dimensions"], results["sparse"] = names, {"names": names, "active": active}
        console.print(f"generating {args.events:,} events ({active} of {names} named features, noise 0.05) ...")
        events = list(itertools.islice(sparse(names, active), args.events))
    else:
        console.print(f"generating {args.events:,} events (d=10, noise 0.05) ...")
        events = list(itertools.islice(separable(dimensions=10, noise=0.05), args.events))
    payloads = [(e["id"].encode(), orjson.dumps(e)) for e in events]

    with new_broker(args.broker, logs) as broker:
        console.print(f"broker: {args.broker} at {broker.bootstrap_servers}")
        kafka = Kafka(broker.bootstrap_servers)
        try:
            for p in partitions if not args.no_throughput else ():
                topic = f"in-{p}"
                kafka.create(topic, p)
                t0 = time.monotonic()
                kafka.produce(topic, payloads, p)
                if any(c.labels for c in contenders):
                    for name in (f"{topic}.points", f"{topic}.labels"):
                        kafka.create(name, p)
                    kafka.produce_split(topic, [split_labels(e) for e in events], p)
                console.print(
                    f"pre-produced {args.events:,} events to {topic} ({p} partition(s)) in {time.monotonic() - t0:.1f} s"
                )
                runs = []
                for r in range(args.repeats):
                    for i, c in enumerate(contenders if r % 2 == 0 else contenders[::-1]):
                        run = throughput_run(kafka, c, topic, p, args.events, args.batch_size, f"p{p}-r{r}-{i}", logs)
                        run["repeat"] = r
                        runs.append(run)
                        console.print(
                            f"  p={p} repeat {r}: {c.name:24s} {run['events_per_s']:>10,.0f} events/s ({run['seconds']:.2f} s), "
                            f"{run['cpu_us_per_event']} µs CPU an event"
                            + (f", {run['dead_lettered_labels']} labels dead-lettered" if c.labels else "")
                        )
                results["throughput"].append(summarise(runs, contenders, p))
            for p in partitions if args.latency_seconds and not args.no_throughput else ():
                for c in [c for c in services if not c.labels]:  # points with inline labels
                    rate = service_rate(results, c.name, p) / 2
                    # the service and the bare loop of its own client at the same rate (the reference of its p99),
                    # the service first in even rounds, the bare loop in odd ones
                    pair = [runner for runner in (c, bare.get(c.client)) if runner is not None]
                    for repeat, runner in (
                        (r, runner)
                        for r in range(args.latency_repeats)
                        for runner in (pair if r % 2 == 0 else pair[::-1])
                    ):
                        console.print(
                            f"latency: {runner.name}, {p} partition(s), {rate:,.0f} events/s for {args.latency_seconds:.0f} s ..."
                        )
                        run = latency_run(
                            kafka,
                            runner,
                            payloads,
                            p,
                            rate,
                            args.latency_seconds,
                            args.batch_size,
                            f"p{p}-{len(results['latency'])}",
                            logs,
                        )
                        run["rate_of"], run["repeat"] = c.name, repeat
                        console.print(
                            f"  p50 {run['p50_ms']:.0f} ms, p99 {run['p99_ms']:.0f} ms, max {run['max_ms']:.0f} ms"
                            + said_turns(run)
                        )
                        results["latency"].append(run)
            for p in partitions if args.exactly_once and args.latency_seconds and not args.no_throughput else ():
                rate = service_rate(results, eos[0].name, p) / 2  # all at kafka-python at-least-once's half rate
                for i, c in enumerate(eos):
                    console.print(f"latency: {c.name}, {p} partition(s), {rate:,.0f} events/s, read_committed ...")
                    run = latency_run(
                        kafka,
                        c,
                        payloads,
                        p,
                        rate,
                        args.latency_seconds,
                        args.batch_size,
                        f"p{p}-eos-{i}",
                        logs,
                    )
                    run["rate_of"] = f"{eos[0].name} (read_committed)"  # not paired with a bare loop
                    console.print(
                        f"  p50 {run['p50_ms']:.0f} ms, p99 {run['p99_ms']:.0f} ms, max {run['max_ms']:.0f} ms"
                        + said_turns(run)
                    )
                    results["latency"].append(run)
            for i, c in enumerate((services + (eos if args.exactly_once else [])) if args.memory_events else ()):
                console.print(f"memory: {c.name}, {args.memory_events:,} events fed continuously ...")
                results["memory"].append(
                    memory_run(kafka, c, events, args.memory_events, args.batch_size, f"m{i}", logs)
                )
        finally:
            kafka.close()

    path = args.json or out_dir / f"e2e-{stamp}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")  # first: a report that fails loses nothing
    report(console, results, contenders)
    console.print(f"results: {path}  (logs: {logs})")
    return 0


def _stream_name(results: dict) -> str:
    sparse = results.get("sparse")
    return "d=10" if sparse is None else f"{sparse['active']} of {sparse['names']} named features"


def new_broker(kind: str, logs: Path):
    """A fresh broker of ``kind`` for the whole invocation (a context manager): the test suite's Apache Kafka launcher
    (the pinned jars, fetched by Maven once) or the embedded broker."""
    if kind == "apache-kafka":
        sys.path.insert(0, str(ROOT))
        from tests.support.apache_kafka import ApacheKafka

        return ApacheKafka(logs / "apache-kafka", heap="1g")
    from perceptron_stream.broker import EmbeddedBroker

    return EmbeddedBroker(log_path=logs / "broker.log")


def summarise(runs: list[dict], contenders: list[Contender], partitions: int) -> dict:
    """Median events/s of each contender; each service's ratio to the kafka-python ceiling, median over repeats."""
    medians = {c.name: statistics.median(r["events_per_s"] for r in runs if r["name"] == c.name) for c in contenders}
    cpu_runs = {
        c.name: [r["cpu_us_per_event"] for r in runs if r["name"] == c.name and r["cpu_us_per_event"] is not None]
        for c in contenders
    }
    cpu = {name: statistics.median(v) if v else None for name, v in cpu_runs.items()}
    by_repeat: dict[int, dict] = {}
    for r in runs:
        by_repeat.setdefault(r["repeat"], {})[r["name"]] = r["events_per_s"]
    ratios = {
        c.name: [round(rep[c.name] / rep["ceiling kafka-python"], 3) for rep in by_repeat.values()]
        for c in contenders
        if c.name != "ceiling kafka-python"
    }
    # every other service (another client, delayed labels, another tree) against the plain service, same round
    to_service = {
        c.name: [round(rep[c.name] / rep["service"], 3) for rep in by_repeat.values()]
        for c in contenders
        if c.kind == "service" and c.name != "service"
    }
    return {
        "partitions": partitions,
        "runs": runs,
        "events_per_s": medians,
        "cpu_us_per_event": cpu,
        "ratio_to_kafka_python_ceiling": {name: statistics.median(v) for name, v in ratios.items()},
        "ratios_by_repeat": ratios,
        "ratio_to_service": {name: statistics.median(v) for name, v in to_service.items()},
        "ratios_to_service_by_repeat": to_service,
    }


def service_rate(results: dict, name: str, partitions: int) -> float:
    for t in results["throughput"]:
        if t["partitions"] == partitions:
            return t["events_per_s"][name]
    raise SystemExit(f"no throughput figure for {name} with {partitions} partition(s): the latency run needs one")


def report(console, results: dict, contenders: list[Contender]) -> None:
    from rich.table import Table

    if results["throughput"]:
        table = Table(
            title=f"end to end on {results.get('broker', 'embedded')}, {results['events']:,} events, {_stream_name(results)}, batch {results['batch_size']}, "
            f"median of {results['repeats']} (× = median same-round ratio to the kafka-python ceiling)"
        )
        table.add_column("contender")
        for t in results["throughput"]:
            table.add_column(f"{t['partitions']} partition(s)\nevents/s", justify="right")
            table.add_column("×", justify="right")
            table.add_column("CPU µs\nan event", justify="right")
        for c in contenders:
            cells = []
            for t in results["throughput"]:
                ratio = t["ratio_to_kafka_python_ceiling"].get(c.name)
                cpu = t["cpu_us_per_event"][c.name]  # None: a run too short for two progress samples
                cells += [
                    f"{t['events_per_s'][c.name]:,.0f}",
                    "1" if ratio is None else f"{ratio:.2f}",
                    "-" if cpu is None else f"{cpu:.0f}",
                ]
            table.add_row(c.name, *cells)
        console.print(table)
        for t in results["throughput"]:
            runs = t["runs"]
            for (name, _), tag in itertools.product(EXACTLY_ONCE[1:], CLIENT_TAG.values()):
                name, baseline = name + tag, EXACTLY_ONCE[0][0] + tag
                pairs = [
                    (r, q)
                    for r in runs
                    if r["name"] == name
                    for q in runs
                    if q["name"] == baseline and q["repeat"] == r["repeat"]
                ]
                if pairs:
                    console.print(
                        f"{t['partitions']} partition(s): {name} / {baseline}, events/s in the same round: "
                        + ", ".join(f"{r['events_per_s'] / q['events_per_s']:.2f}" for r, q in pairs)
                    )
            for name, ratios in t.get("ratios_to_service_by_repeat", {}).items():
                console.print(
                    f"{t['partitions']} partition(s): {name} / service, events/s in the same round: "
                    + ", ".join(f"{r:.2f}" for r in ratios)
                )
    if results["latency"]:
        lat = Table(title="latency, input CreateTime → output CreateTime, at half the service's max rate")
        for name in ("contender", "at the rate of", "partitions", "events/s", "events", "p50 ms", "p99 ms", "max ms"):
            lat.add_column(name, justify="right")
        for r in results["latency"]:
            lat.add_row(
                r["name"],
                r.get("rate_of", ""),
                str(r["partitions"]),
                f"{r['achieved_rate']:,.0f}",
                f"{r['measured']:,}",
                f"{r['p50_ms']:.0f}",
                f"{r['p99_ms']:.0f}",
                f"{r['max_ms']:.0f}",
            )
        console.print(lat)
        for (name, partitions), ratios in p99_ratios(results["latency"]).items():
            console.print(
                f"{partitions} partition(s): {name} p99 / its bare loop's p99 at the same rate, round by round: "
                + ", ".join(f"{r:.2f}" for r in ratios)
                + f"; median {statistics.median(ratios):.2f}"
            )
    for m in results["memory"]:
        mem = Table(title=f"{m['name']}: resident memory (VmRSS), {m['events']:,} events fed continuously")
        mem.add_column("events done", justify="right")
        mem.add_column("VmRSS MiB", justify="right")
        if "pending_max" in m:
            mem.add_column("most points pending so far", justify="right")
        for k, v in m["rss_kib"].items():
            mem.add_row(
                f"{int(k):,}",
                f"{v / 1024:.1f}",
                *(
                    [f"{max((n for j, n in m['pending_max'].items() if int(j) <= int(k)), default=0):,}"]
                    if m.get("pending_max")
                    else []
                ),
            )
        mem.add_row("growth, first → last", f"{m['growth'] * 100:+.1f}%")
        if "cpu_us_per_event" in m:
            mem.add_row("CPU µs an event (or decision), fed live", f"{m['cpu_us_per_event']:.1f}")
        if "dead_lettered_labels" in m:
            mem.add_row("labels dead-lettered", f"{m['dead_lettered_labels']:,}")
        console.print(mem)


if __name__ == "__main__":
    sys.exit(main())
