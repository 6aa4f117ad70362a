"""The checkpoint written off the loop (perceptron_stream.runtime.checkpointer): the loop copies, a thread writes, a
later turn commits; turns of the loop (:meth:`Loop.turn`) over a stream with no broker behind it, and a store whose
write the test holds."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from perceptron_stream.app import Application
from perceptron_stream.config import ServeSettings, load
from perceptron_stream.runtime.startup import Opened
from perceptron_stream.state.checkpoint import Owner
from perceptron_stream.state.local import LocalStore

from tests.support.streams import ScriptedStream, scripted_records

P0 = ("points", 0)


class HeldStore(LocalStore):
    """A local store whose writes wait until the test lets them go (``release``), or fail with ``error``."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.release = threading.Event()
        self.started = threading.Event()
        self.error: BaseException | None = None
        self.writers: list[str] = []

    def save(self, cp):
        self.writers.append(threading.current_thread().name)
        self.started.set()
        assert self.release.wait(30), "the test never let the write go"
        if self.error is not None:
            raise self.error
        super().save(cp)


def _app(tmp_path, *flags):
    app = Application(
        load(
            ServeSettings,
            ["--metrics-port", "0", "--state-dir", str(tmp_path), "--checkpoint-interval-events", "30", *flags],
        )
    )
    s = app.settings
    store = HeldStore(tmp_path, s.group_id)
    app.wire(Opened(Owner(s.group_id, s.input_topic), store=store))
    return app, store


def _loop(app, stream):
    loop = app.attach(stream)  # a stand-in with what a turn uses
    app.assignments.guard.passed = True  # no other member: the loop may process at once
    return loop


def _turn_until(loop, done, turns: int = 1000) -> None:
    for _ in range(turns):
        if done():
            return
        time.sleep(0.01)
        loop.turn()
    raise AssertionError("not within 1000 turns")


def test_the_loop_goes_on_while_a_checkpoint_is_written_and_commits_its_positions_once_it_is(tmp_path):
    app, store = _app(tmp_path)
    stream = ScriptedStream([scripted_records(0, 40), scripted_records(40, 20)])
    loop = _loop(app, stream)
    loop.turn()  # 40 events: a checkpoint due, its copy taken, the write held
    assert store.started.wait(10)
    loop.turn()  # 20 more, processed while the write waits
    (task,) = app.tasks.all()
    assert stream.committed == [] and task.unsaved == 60  # nothing committed before its checkpoint is written
    assert len(stream.sent) == 60  # the loop went on: the second batch was predicted and published
    store.release.set()
    _turn_until(loop, lambda: stream.committed)
    assert stream.committed == [{P0: 40}]  # the checkpoint's positions, not the loop's
    assert task.seq == 1 and task.unsaved == 20  # the events since its copy stay unsaved
    assert [name.split("_")[0] for name in store.writers] == ["checkpoint-write"]  # (the pool's thread)
    saved = store.load(task.name)
    assert saved is not None and saved.seq == 1 and saved.positions == {P0: 40}
    app.checkpointer.final(app.tasks.all(), stream, batch_open=False)  # the rest, in the caller's thread
    assert stream.committed == [{P0: 40}, {P0: 60}] and task.unsaved == 0
    assert store.load(task.name).positions == {P0: 60}


def test_a_checkpoint_outside_the_turn_waits_for_the_one_being_written(tmp_path):
    """A revocation's (or the final) checkpoint is written after the one in flight: checkpoints in order."""
    app, store = _app(tmp_path)
    stream = ScriptedStream([scripted_records(0, 40), scripted_records(40, 10)])
    loop = _loop(app, stream)
    loop.turn()
    assert store.started.wait(10)
    loop.turn()
    threading.Timer(0.2, store.release.set).start()
    assert app.checkpointer.checkpoint(app.tasks.all(), stream)  # as on_revoked calls it
    (task,) = app.tasks.all()
    assert task.seq == 2 and task.unsaved == 0
    assert sorted(f.name for f in store.files(task.name)) == [
        "checkpoint-000000000001.json",
        "checkpoint-000000000002.json",
    ]
    assert store.load(task.name).positions == {P0: 50}
    app.checkpointer.commit(stream)
    assert stream.committed == [{P0: 50}]


def test_a_write_that_failed_is_logged_its_events_stay_unsaved_and_the_next_checkpoint_covers_them(tmp_path, caplog):
    app, store = _app(tmp_path)
    store.error = OSError("disk full")
    store.release.set()
    stream = ScriptedStream([scripted_records(0, 40)])
    loop = _loop(app, stream)
    with caplog.at_level(logging.ERROR, logger="perceptron_stream"):
        loop.turn()
        _turn_until(loop, lambda: "checkpoint 1 of model failed: disk full" in caplog.text)
    (task,) = app.tasks.all()
    assert stream.committed == [] and task.unsaved == 40 and task.seq == 0
    store.error = None
    app.checkpointer.final(app.tasks.all(), stream, batch_open=False)
    assert stream.committed == [{P0: 40}] and store.load(task.name).seq == 1


def test_an_unexpected_error_of_the_write_is_raised_on_the_loops_thread(tmp_path):
    app, store = _app(tmp_path)
    store.error = RuntimeError("a defect in the encoder")
    store.release.set()
    loop = _loop(app, ScriptedStream([scripted_records(0, 40)]))
    loop.turn()
    with pytest.raises(RuntimeError, match="a defect in the encoder"):
        _turn_until(loop, lambda: False)


def test_a_task_with_a_label_topic_writes_its_checkpoint_in_the_turn(tmp_path):
    """Its pending table's epoch closes with the checkpoint, on the loop's thread."""
    app, store = _app(tmp_path, "--label-topic", "labels")
    store.release.set()
    s = app.settings
    from perceptron_stream.runtime.factory import TaskFactory

    task = TaskFactory(s, Owner(s.group_id, s.input_topic)).new_task(None)
    try:
        task.positions[P0] = 40
        task.unsaved = 40
        assert app.checkpointer.maybe([task], ScriptedStream([])) == "checkpoint"
        assert task.seq == 1 and store.writers == [threading.current_thread().name]
    finally:
        if task.joiner is not None:
            task.joiner.close()
