"""--processing-guarantee exactly-once without a broker: the start-up refusals, the transactional id, the
transaction's room (perceptron_stream.runtime.transaction, as the checkpointer drives it) and the Kafka store's
transactional record and committed-only load. On Apache Kafka: tests/integration/test_exactly_once.py."""

from __future__ import annotations

import re

import pytest
from perceptron_stream.config import ConfigError, ServeSettings, load
from perceptron_stream.kafka import Aborted, Fenced, Refused
from perceptron_stream.metrics import ServiceMetrics
from perceptron_stream.runtime.checkpointer import Checkpointer
from perceptron_stream.runtime.factory import TaskFactory
from perceptron_stream.runtime.health import Health
from perceptron_stream.runtime.retry import Retry, StartupError
from perceptron_stream.runtime.startup import (
    EMBEDDED_BROKER_CLUSTER_ID,
    refuse_exactly_once_on,
    transactional_id,
)
from perceptron_stream.state.checkpoint import GROUP_TASK, Owner
from perceptron_stream.state.kafka_store import KafkaStore


def _settings(*args: str) -> ServeSettings:
    return load(ServeSettings, ["--metrics-port", "0", *args])


EXACTLY_ONCE = ("--processing-guarantee", "exactly-once", "--state-store", "kafka")


# start-up ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("store", ["local", "none"])
def test_exactly_once_without_the_kafka_store_is_a_bad_setting_naming_both(store):
    """Refused when the settings are read (ConfigError: exit 2), before anything connects."""
    with pytest.raises(ConfigError) as refused:
        _settings("--processing-guarantee", "exactly-once", "--state-store", store)
    assert "--processing-guarantee exactly-once needs --state-store kafka" in str(refused.value)
    assert f"(it is {store})" in str(refused.value)


def test_exactly_once_takes_delayed_labels_and_mixing():
    assert _settings(*EXACTLY_ONCE, "--label-topic", "labels").processing_guarantee == "exactly-once"
    assert _settings(*EXACTLY_ONCE, "--model-scope", "partition", "--mix-every", "1000").mix_every == 1000
    with pytest.raises(ConfigError, match="needs --state-store kafka"):  # still the Kafka store, whatever else
        _settings("--processing-guarantee", "exactly-once", "--label-topic", "labels")


def test_at_least_once_and_exactly_once_with_the_kafka_store_start():
    assert _settings("--state-store", "local").processing_guarantee == "at-least-once"
    assert _settings("--label-topic", "labels").state_store == "local"
    assert _settings(*EXACTLY_ONCE).state_store == "kafka"


def test_exactly_once_on_the_embedded_broker_is_a_bad_setting_found_by_its_cluster_id():
    with pytest.raises(ConfigError) as refused:
        refuse_exactly_once_on(_settings(*EXACTLY_ONCE), EMBEDDED_BROKER_CLUSTER_ID)
    assert str(refused.value).startswith("invalid setting processing_guarantee (--processing-guarantee, ")
    assert "--processing-guarantee exactly-once cannot hold on the embedded broker" in str(refused.value)
    refuse_exactly_once_on(_settings(*EXACTLY_ONCE), "MkU3OEVBNTcwNTJENDM2Qg")  # an Apache Kafka cluster's id
    refuse_exactly_once_on(_settings("--state-store", "kafka"), EMBEDDED_BROKER_CLUSTER_ID)  # at-least-once


def test_one_new_transactional_id_per_instance_under_exactly_once_only():
    s = _settings(*EXACTLY_ONCE, "--group-id", "scorers")
    first, second = transactional_id(s), transactional_id(s)
    assert first is not None and second is not None
    assert first.startswith("scorers-") and second.startswith("scorers-") and first != second
    assert transactional_id(_settings("--group-id", "scorers")) is None


# the checkpointer's transactions ----------------------------------------------------------------------------------
class Topic:
    """The compacted topic behind a KafkaStore, in memory: ``read_latest`` sees every record put (committed or not,
    as the kafka-python reader does)."""

    topic = "perceptron-stream.checkpoints"

    def __init__(self):
        self.records: dict[bytes, bytes] = {}

    def put(self, key, value):
        self.records[key] = value

    def read_latest(self, wanted):
        return {k: v for k, v in self.records.items() if k in wanted}


class TransactionalStream:
    """A stream opened with a transactional id: what was sent, and each commit's positions; ``fails`` raised by
    the next commit."""

    def __init__(self, fails: Exception | None = None, refuses: bool = False):
        self.sent: list[tuple[str, bytes | None, bytes]] = []
        self.commits: list[dict] = []
        self.aborts, self.fails, self.refuses = 0, fails, refuses

    def send(self, topic, key, value):
        self.sent.append((topic, key, value))

    def send_to(self, topic, partition, key, value):
        self.sent.append((topic, key, value))

    def flush(self, timeout_s):
        self.flushes = getattr(self, "flushes", 0) + 1
        return []

    def commit_transaction(self, positions, timeout_s):
        if self.fails is not None:
            raise self.fails
        self.commits.append(positions)
        return [Refused(*self.sent[-1], ValueError("too large"))] if self.refuses else []

    def abort(self):
        self.aborts += 1


def _checkpointer(*args: str):
    s = _settings(*EXACTLY_ONCE, "--commit-interval-ms", "100", *args)
    health = Health(60.0)
    metrics = ServiceMetrics(window=10, version="test", variant=s.variant, scope=s.model_scope, challengers=[])
    store = KafkaStore(Topic(), s.group_id)
    task = TaskFactory(s, Owner(s.group_id, s.input_topic, GROUP_TASK)).new_task(None)
    task.positions[(s.input_topic, 0)] = 7
    task.unsaved = 7  # seven events processed since the last commit
    return Checkpointer(s, store, metrics, health, Retry(health, lambda: False)), store, task, metrics


def _transactions(metrics, result: str) -> float:
    return metrics.registry.get_sample_value("perceptron_transactions_total", {"result": result})


def test_a_commit_sends_the_checkpoint_into_the_transaction_and_commits_it_with_its_positions():
    checkpointer, store, task, metrics = _checkpointer()
    stream = TransactionalStream()
    checkpointer.maybe([task], stream, final=True)
    assert stream.commits == [{("points", 0): 7}]
    [(topic, key, _value)] = stream.sent
    assert (topic, key) == ("perceptron-stream.checkpoints", store.slot_keys(GROUP_TASK)[1])
    assert store.topic.records == {}  # written by the transaction only, never by the store's own producer
    assert task.seq == 1 and task.unsaved == 0
    assert _transactions(metrics, "committed") == 1 and _transactions(metrics, "aborted") == 0
    assert metrics.registry.get_sample_value("perceptron_transaction_commit_seconds_count") == 1


def test_a_transaction_is_committed_every_commit_interval_and_only_when_something_changed():
    checkpointer, _, task, _ = _checkpointer("--commit-interval-ms", "5000")
    stream = TransactionalStream()
    checkpointer.maybe([task], stream)
    assert stream.commits == []  # not due yet (an hour of checkpoint interval would not matter)
    checkpointer, _, task, _ = _checkpointer("--commit-interval-ms", "1")
    checkpointer.transaction.commit([task], stream)
    checkpointer.maybe([task], stream)  # nothing changed since
    assert stream.commits == [{("points", 0): 7}]


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (Fenced("the group's generation moved on"), "fenced: a newer owner has this instance's partitions"),
        (Aborted("transaction aborted: no answer"), "transaction aborted: no answer: nothing of it is visible"),
    ],
)
def test_a_failed_transaction_stops_the_service_counted_as_aborted_and_nothing_is_saved(error, says):
    checkpointer, _, task, metrics = _checkpointer()
    stream = TransactionalStream(fails=error)
    with pytest.raises(StartupError) as stopped:
        checkpointer.maybe([task], stream, final=True)
    assert says in str(stopped.value) and "nothing of" in str(stopped.value)
    assert task.seq == 0 and task.unsaved == 7
    assert _transactions(metrics, "aborted") == 1 and _transactions(metrics, "committed") == 0
    checkpointer.final([task], stream, batch_open=False)  # the exit's final checkpoint tries nothing more
    assert checkpointer.checkpoint([task], stream) is False  # nor a revocation as the consumer closes
    assert _transactions(metrics, "aborted") == 1


def test_a_checkpoint_record_refused_for_good_stops_the_service():
    checkpointer, _, task, _ = _checkpointer()
    with pytest.raises(StartupError, match=re.escape("refused a checkpoint record on perceptron-stream.checkpoints")):
        checkpointer.maybe([task], TransactionalStream(refuses=True), final=True)


def test_a_stop_inside_a_batch_aborts_the_open_transaction():
    checkpointer, _, task, metrics = _checkpointer()
    stream = TransactionalStream()
    checkpointer.final([task], stream, batch_open=True)
    assert stream.aborts == 1 and stream.commits == [] and _transactions(metrics, "aborted") == 1


class Changelog:
    """The pending changelog's topic (a PartitionedLog) behind a task's joiner: it is only read under exactly-once."""

    topic = "perceptron-stream.pending"

    def read(self, partition):
        return []

    def send(self, partition, key, value):
        raise AssertionError("a changelog record written outside the transaction")

    def flush(self):
        raise AssertionError("the changelog's own producer flushed under exactly-once")


def test_with_delayed_labels_the_spans_changelog_records_go_into_its_transaction_before_its_checkpoint():
    s = _settings(*EXACTLY_ONCE, "--label-topic", "labels")
    health = Health(60.0)
    metrics = ServiceMetrics(window=10, version="test", variant=s.variant, scope=s.model_scope, challengers=[])
    store = KafkaStore(Topic(), s.group_id)
    factory = TaskFactory(s, Owner(s.group_id, s.input_topic, GROUP_TASK), store=store, changelog=Changelog())
    task = factory.new_task(None)
    try:
        task.joiner.table(0).add("c-1", {"x": [1.0]}, now=1.0)  # a point kept for its label
        task.positions[(s.input_topic, 0)] = 1
        task.unsaved = 1
        stream = TransactionalStream()
        transaction = Checkpointer(s, store, metrics, health, Retry(health, lambda: False)).transaction
        assert transaction is not None  # exactly-once
        transaction.commit([task], stream)
        assert [(topic, key) for topic, key, _ in stream.sent] == [
            ("perceptron-stream.pending", b"perceptron-stream/0/s:c-1"),
            ("perceptron-stream.checkpoints", store.slot_keys(GROUP_TASK)[1]),
        ]
        assert stream.commits == [{("points", 0): 1}] and task.seq == 1
    finally:
        task.joiner.close()
        factory.close()


# the Kafka store ------------------------------------------------------------------------------------------------
def test_the_transactional_record_is_what_save_writes_and_load_takes_only_committed_positions():
    _, store, task, _ = _checkpointer()
    committed = task.snapshot()
    store.save(committed)
    topic, key, value = store.record(committed)
    assert store.topic.records == {key: value} and topic == store.topic.topic
    task.saved(committed)
    task.positions[("points", 0)] = 9
    aborted = task.snapshot()  # in the log, its transaction aborted
    store.save(aborted)
    assert store.load(GROUP_TASK).seq == 2  # at-least-once: the newest
    assert store.load(GROUP_TASK, committed={("points", 0): 7}).seq == 1
    assert store.load(GROUP_TASK, committed={}) is None


def test_an_evicted_instance_aborts_its_open_transaction_commits_nothing_more_and_stops_naming_the_fencing():
    """The group removed the instance (its session expired) and took its partitions: nothing it holds may be
    committed; the abort is counted once."""
    checkpointer, _, task, metrics = _checkpointer()
    stream = TransactionalStream()
    stopped = checkpointer.transaction.evicted(stream, [("points", 0)])
    assert isinstance(stopped, StartupError) and "fenced: a newer owner has this instance's partitions" in str(stopped)
    assert "the group removed this instance and took its 1 partition(s) away" in str(stopped)
    assert stream.aborts == 1 and _transactions(metrics, "aborted") == 1
    assert checkpointer.checkpoint([task], stream) is False  # the revocation as the consumer closes commits nothing
    checkpointer.final([task], stream, batch_open=False)
    assert stream.commits == [] and task.unsaved == 7
