"""The final checkpoint's rule (perceptron_stream.runtime.checkpointer.Checkpointer.final), a lost state topic, and a stop during start-up."""

from __future__ import annotations

import logging
import socket

import pytest
from perceptron_stream.app import Application
from perceptron_stream.config import ServeSettings, load
from perceptron_stream.kafka import KafkaUnavailable, RecordTooLarge
from perceptron_stream.metrics import ServiceMetrics
from perceptron_stream.runtime.checkpointer import Checkpointer
from perceptron_stream.runtime.factory import TaskFactory
from perceptron_stream.runtime.health import Health
from perceptron_stream.runtime.retry import Retry, StartupError
from perceptron_stream.runtime.state_topics import StateTopicError
from perceptron_stream.state.checkpoint import GROUP_TASK, Owner

NOT_ALL_ACKNOWLEDGED = (
    "stopped inside a batch whose outputs were not all acknowledged: no final checkpoint; "
    "the next start learns and publishes it again from the last checkpoint"
)


class Store:
    def __init__(self):
        self.saved = []

    def save(self, cp):
        self.saved.append(cp.seq)


class Stream:
    def __init__(self):
        self.commits = []

    def commit(self, positions, timeout_s):
        self.commits.append(positions)

    def assignment(self):
        return [("points", 0)]


def _checkpointer_and_task(tmp_path):
    s = load(ServeSettings, ["--metrics-port", "0", "--state-dir", str(tmp_path)])
    health = Health(60.0)
    metrics = ServiceMetrics(window=10, version="test", variant=s.variant, scope=s.model_scope, challengers=[])
    store = Store()
    task = TaskFactory(s, Owner(s.group_id, s.input_topic, GROUP_TASK)).new_task(None)
    task.positions[(s.input_topic, 0)] = 7
    task.unsaved = 7  # seven events processed since the last checkpoint
    return Checkpointer(s, store, metrics, health, Retry(health, lambda: False)), store, task


def test_a_stop_between_batches_checkpoints_and_commits(tmp_path, caplog):
    checkpointer, store, task = _checkpointer_and_task(tmp_path)
    stream = Stream()
    with caplog.at_level(logging.WARNING, "perceptron_stream"):
        checkpointer.final([task], stream, batch_open=False)
    assert store.saved == [1] and stream.commits == [{("points", 0): 7}]
    assert NOT_ALL_ACKNOWLEDGED not in caplog.text


def test_a_stop_inside_a_batch_writes_no_final_checkpoint_and_says_so(tmp_path, caplog):
    checkpointer, store, task = _checkpointer_and_task(tmp_path)
    stream = Stream()
    with caplog.at_level(logging.WARNING, "perceptron_stream"):
        checkpointer.final([task], stream, batch_open=True)
    assert store.saved == [] and stream.commits == [] and task.unsaved == 7
    assert NOT_ALL_ACKNOWLEDGED in caplog.text


class LostTopics:
    """The state topics' watch (runtime/state_topics.py) once the checkpoint topic is gone."""

    def __init__(self):
        self.checks = 0

    def maybe(self):
        self.checks += 1
        raise StateTopicError("the checkpoint topic ckpt (--checkpoint-topic) was deleted while the service ran")

    check = maybe


def test_a_lost_state_topic_stops_the_service_before_anything_more_is_written(tmp_path):
    """The watch's StateTopicError stops the loop at its turn; nothing is saved or committed after it, not even at
    the stop (the final checkpoint), and the topic is not asked about again."""
    checkpointer, store, task = _checkpointer_and_task(tmp_path)
    checkpointer.state_topics = topics = LostTopics()
    stream = Stream()
    with pytest.raises(StateTopicError, match="was deleted while the service ran"):
        checkpointer.maybe([task], stream, final=False)
    assert checkpointer.checkpoint([task], stream) is False  # a revocation while closing writes nothing either
    checkpointer.final([task], stream, batch_open=False)
    assert store.saved == [] and stream.commits == [] and task.unsaved == 7
    assert topics.checks == 1


def test_a_stop_during_start_up_closes_what_opened_and_returns_0(tmp_path):
    app = Application(
        load(ServeSettings, ["--metrics-port", "0", "--bootstrap-servers", "127.0.0.1:9", "--state-dir", str(tmp_path)])
    )
    app.stop()  # before the brokers (none at port 9) ever answered
    assert app.run(install_signal_handlers=False) == 0
    assert app.stream is None and app.store is None  # start-up opened neither
    assert app.http is not None
    with pytest.raises(OSError):  # the HTTP endpoints were closed on the way out
        socket.create_connection(("127.0.0.1", app.http.port), timeout=1).close()
    assert app.undone().endswith("left undone: nothing was read yet")


@pytest.mark.parametrize(
    "error",
    [KafkaUnavailable("no answer"), RecordTooLarge("a record of 2000000 bytes exceeds max.message.bytes", "raise it")],
)
def test_a_stop_whose_final_checkpoint_could_not_be_written_ends_in_an_error(tmp_path, error):
    """Work left undone (events learned and published since the last checkpoint, none saved) is no clean stop:
    exit 0 told the orchestrator all was well."""
    checkpointer, store, task = _checkpointer_and_task(tmp_path)

    def fail(cp):
        raise error

    store.save = fail
    with pytest.raises(StartupError, match=r"could not write checkpoint 1|stopped without the final checkpoint"):
        checkpointer.final([task], Stream(), batch_open=False)
    assert task.unsaved == 7
