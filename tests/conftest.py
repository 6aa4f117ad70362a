"""Fixtures shared by the suite: the brokers, topic names of a test's own, the service in a thread, Prometheus.

The helpers tests call (produce, consume, wait_until, settings_args, ...)
live in tests/support; test modules import them from there.

Two brokers serve the tests. Apache Kafka (``apache_kafka``), what users run:
one KRaft broker for the whole run, started by pytest-xdist's controller before
its workers (or by the first test that asks, without xdist), shared by tests
with topics and groups of their own. The embedded broker (``broker``), one per
worker: it needs no Java and serves the tests about the product rather than
the broker. ``kafka_broker`` runs a test on each, the broker's name in the
test id (``[apache-kafka]``, ``[embedded]``). Guarantees are proven on Apache
Kafka: a guarantee test takes ``kafka_broker`` parametrised with
``["apache-kafka"]`` (indirect), and both brokers only where the embedded
broker's run tests a workaround of ours for it (or the demo's case).
Tests of the embedded broker's own quirks carry the ``embedded_only`` marker.
"""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import tempfile
import uuid
from pathlib import Path

import pytest
from perceptron_stream.broker import EmbeddedBroker

from tests.support.apache_kafka import ApacheKafka, from_json, to_json, wait_ready
from tests.support.brokers import new_broker
from tests.support.launch import ServiceThread
from tests.support.prometheus_server import PrometheusServer

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
    """Each broker in turn (both have ``name`` and ``bootstrap_servers``); ``["apache-kafka"]`` alone, indirect, for a
    guarantee's test (the module docstring)."""
    return request.getfixturevalue("apache_kafka" if request.param == "apache-kafka" else "broker")


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


@pytest.fixture
def signal_handlers():
    """`produce` installs SIGINT/SIGTERM handlers (stop cleanly); give pytest its own back afterwards."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


@pytest.fixture
def prometheus_factory(tmp_path_factory):
    """``start(targets=(), **kwargs) -> PrometheusServer`` (tests/support/prometheus_server.py): started now,
    stopped at teardown."""
    servers: list[PrometheusServer] = []

    def start(targets=(), **kwargs) -> PrometheusServer:
        server = PrometheusServer(tmp_path_factory.mktemp("prometheus"), targets, **kwargs)
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    """A Prometheus server with no targets, shared by the module: enough to parse and evaluate PromQL."""
    with PrometheusServer(tmp_path_factory.mktemp("prometheus")) as server:
        yield server
