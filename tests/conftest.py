"""Fixtures shared by the suite: the brokers, and small helpers to produce,
consume and run the service against them over TCP.

Two brokers serve the tests. Apache Kafka (``apache_kafka``), what users run:
one KRaft broker for the whole run, started by pytest-xdist's controller before
its workers (or by the first test that asks, without xdist), shared by tests
with topics and groups of their own. The embedded broker (``broker``), one per
worker: it needs no Java and serves the tests about the product rather than
the broker. Tests of a guarantee take ``kafka_broker``, which runs them on
both, the broker's name in the test id (``[apache-kafka]``, ``[embedded]``).
Tests of the embedded broker's own quirks carry the ``embedded_only`` marker.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from service.broker import EmbeddedBroker
from tests.support.apache_kafka import ApacheKafka, from_json, to_json, wait_ready

ROOT = Path(__file__).resolve().parent.parent
#: how the xdist controller tells its workers where the run's Apache Kafka listens (JSON of BrokerAddresses)
APACHE_KAFKA_ENV = "PERCEPTRON_STREAM_TESTS_APACHE_KAFKA"
_run_broker = pytest.StashKey[ApacheKafka]()

# Settings from the developer's environment must not leak into the tests.
for name in list(os.environ):
    if name.startswith("PERCEPTRON_STREAM_") and name != APACHE_KAFKA_ENV:
        del os.environ[name]


def _xdist_controller(config) -> bool:
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", 0))


def pytest_configure(config):
    """The xdist controller launches the run's one Apache Kafka before the workers start; they wait for it."""
    if _xdist_controller(config) and APACHE_KAFKA_ENV not in os.environ:
        broker = ApacheKafka(Path(tempfile.mkdtemp(prefix="perceptron-stream-apache-kafka-"))).start(wait=False)
        config.stash[_run_broker] = broker
        os.environ[APACHE_KAFKA_ENV] = to_json(broker.info)


def pytest_unconfigure(config):
    broker = config.stash.get(_run_broker, None)
    if broker is not None:
        broker.stop()
        os.environ.pop(APACHE_KAFKA_ENV, None)
        shutil.rmtree(broker.root, ignore_errors=True)


@pytest.fixture(scope="session")
def apache_kafka(tmp_path_factory):
    """The run's Apache Kafka broker (its addresses, cluster id and certificates: BrokerAddresses)."""
    if APACHE_KAFKA_ENV in os.environ:
        info = from_json(os.environ[APACHE_KAFKA_ENV])
        wait_ready(info)
        yield info
    else:
        with ApacheKafka(tmp_path_factory.mktemp("apache-kafka")) as started:
            yield started.info


@pytest.fixture(params=["apache-kafka", "embedded"])
def kafka_broker(request):
    """Each broker in turn, for the tests of a guarantee (both have ``name`` and ``bootstrap_servers``)."""
    return request.getfixturevalue("apache_kafka" if request.param == "apache-kafka" else "broker")


def new_broker(kind: str, root: Path):
    """A broker of ``kind`` ("apache-kafka" or "embedded") of a test's own, files under ``root``; use it with ``with``."""
    root.mkdir(parents=True, exist_ok=True)
    if kind == "apache-kafka":
        return ApacheKafka(root / "apache-kafka", heap="256m")
    return EmbeddedBroker(log_path=root / "tansu.log")


@pytest.fixture(params=["apache-kafka", "embedded"])
def own_broker(request, tmp_path):
    """A broker of this test's own, of each kind in turn, for tests that freeze or stop it
    (``pause``/``resume``: SIGSTOP/SIGCONT) or need a cluster of their own; the run's shared brokers are never frozen."""
    with new_broker(request.param, tmp_path) as started:
        yield started


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    """A Tansu broker on a free port for the whole session (one per pytest-xdist worker)."""
    log_path = tmp_path_factory.mktemp("broker") / "tansu.log"
    with EmbeddedBroker(log_path=log_path) as b:
        yield b


_counter = itertools.count()


@pytest.fixture
def topics(request):
    """Unique topic and group names for one test (the broker is shared)."""
    tag = f"{request.node.name[:30].replace('[', '-').replace(']', '')}-{next(_counter)}-{uuid.uuid4().hex[:6]}"
    return {"input_topic": f"in-{tag}", "output_topic": f"out-{tag}", "dlq_topic": f"dlq-{tag}", "group_id": f"g-{tag}"}


def wait_until(predicate, timeout: float = 60.0, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def metrics_once(metrics_url: str, line: str, timeout: float = 30.0) -> str:
    """A service's /metrics once they show ``line``; after ``timeout``, as they are then (the caller's assertion
    says what they hold). A batch is counted just after its outputs are acknowledged, so a test that has read
    the outputs may be a moment ahead of the counts."""
    try:
        return wait_until(lambda: (text := http_get(metrics_url + "/metrics")[1]) and line in text and text, timeout, what=line)
    except AssertionError:
        return http_get(metrics_url + "/metrics")[1]


def create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])
    except TopicAlreadyExistsError:
        pass
    finally:
        admin.close()


def produce(bootstrap: str, topic: str, values, keys=None, partition=None) -> None:
    """Write raw values (bytes, or dicts turned into JSON) and wait for the acks.

    The topic is created with one partition when missing: the broker would
    auto-create it with four.
    """
    from kafka import KafkaProducer

    create_topic(bootstrap, topic)
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    try:
        keys = keys or itertools.repeat(None)
        for value, key in zip(values, keys):
            raw = value if isinstance(value, (bytes, type(None))) else json.dumps(value).encode()
            producer.send(topic, value=raw, key=key, partition=partition)
        producer.flush()
    finally:
        producer.close()


def consume(bootstrap: str, topic: str, count: int, timeout: float = 60.0):
    """Read ``count`` records from the start of every partition of ``topic``."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        wait_until(lambda: consumer.partitions_for_topic(topic), timeout, what=f"topic {topic}")
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            for messages in consumer.poll(timeout_ms=200).values():
                out.extend(messages)
        assert len(out) >= count, f"read {len(out)} of {count} records from {topic} in {timeout:.0f} s"
        return out
    finally:
        consumer.close()


def settings_args(broker, topics: dict, tmp_path: Path, **extra) -> list[str]:
    """Flags for `serve` against the test broker, with a metrics port of its own."""
    args = {"bootstrap_servers": broker.bootstrap_servers, **topics, "state_dir": str(tmp_path / "state"),
            "metrics_port": 0, "poll_timeout_ms": 100, "checkpoint_interval_seconds": 1.0, **extra}
    out = []
    for name, value in args.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else f"--no-{name.replace('_', '-')}")
        else:
            out += [flag, str(value)]
    return out


class ServiceThread:
    """The Application running in a thread of the test process."""

    def __init__(self, args: list[str]):
        from service.app import Application
        from service.config import ServeSettings, load

        self.app = Application(load(ServeSettings, args))
        self.result = None
        self.error = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        try:
            self.result = self.app.run(install_signal_handlers=False)
        except BaseException as exc:  # surfaced by stop()
            self.error = exc

    def start(self) -> "ServiceThread":
        self.thread.start()
        wait_until(lambda: self.app.http is not None or self.error, 30, what="the service's HTTP endpoints")
        return self

    def stop(self, timeout: float = 30.0):
        self.app.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the service did not stop"
        if self.error:
            raise self.error
        return self.result

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.app.http.port}"


@pytest.fixture
def service_thread():
    started = []

    def start(args):
        s = ServiceThread(args).start()
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()  # also re-raises an error the service died of, so a test never hides it behind a timeout


def start_service_process(args: list[str], log_path: Path, preexec_fn=None) -> subprocess.Popen:
    """`perceptron-stream serve` as a real child process (signals, crashes).

    ``preexec_fn`` runs in the child before the service starts (e.g. to lower
    its open-files limit)."""
    log = open(log_path, "ab")
    return subprocess.Popen([sys.executable, "-m", "service.cli", "serve", *args], stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                            preexec_fn=preexec_fn)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, ConnectionError):  # nothing listens (yet)
        return 0, ""
