"""The poll loop's turn times, by what each turn did (``perceptron_poll_loop_turn_seconds{did}``): where a tail of
latency comes from. Turns of the loop (:meth:`Loop.turn`) over a stream with no broker behind it."""

from __future__ import annotations

import json

from perceptron_stream.app import Application
from perceptron_stream.config import ServeSettings, load
from perceptron_stream.kafka import Record
from prometheus_client import generate_latest


class ScriptedStream:
    """Hands over the batches it was given, one a poll (then nothing), and takes what the loop writes."""

    def __init__(self, batches: list[list[Record]]):
        self.batches = list(batches)
        self.sent: list[tuple] = []
        self.committed: list[dict] = []

    def poll(self, timeout_ms, max_records):
        return [self.batches.pop(0)] if self.batches else []

    def send(self, topic, key, value):
        self.sent.append((topic, key, value))

    def flush(self, timeout_s):
        return []

    def commit(self, positions, timeout_s=None):
        self.committed.append(dict(positions))

    def lag(self, timeout_s=None, ask_broker=True):
        return {}

    def assignment(self):
        return [("points", 0)]

    def pause(self, partitions=None):
        pass

    def resume(self, partitions=None):
        pass


def _records(start: int, count: int) -> list[Record]:
    events = [
        {"id": f"e{i}", "x": [1.0, float(i % 3) - 1.0], "y": 1 if i % 2 else -1} for i in range(start, start + count)
    ]
    return [Record("points", 0, start + i, None, json.dumps(e).encode(), 0) for i, e in enumerate(events)]


def _turns(app) -> dict[str, float]:
    """did → the count of its turns, as /metrics says."""
    text = generate_latest(app.metrics.registry).decode()
    return {
        line.split('did="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("perceptron_poll_loop_turn_seconds_count{")
    }


def test_each_turn_is_timed_as_what_it_did_and_idle_turns_are_not(tmp_path):
    app = Application(
        load(
            ServeSettings,
            ["--metrics-port", "0", "--state-dir", str(tmp_path), "--checkpoint-interval-events", "30"],
        )
    )
    from perceptron_stream.runtime.startup import Opened
    from perceptron_stream.state.checkpoint import Owner
    from perceptron_stream.state.local import LocalStore

    s = app.settings
    app.wire(Opened(Owner(s.group_id, s.input_topic), store=LocalStore(tmp_path, s.group_id)))
    stream = ScriptedStream([_records(0, 20), _records(20, 20)])
    loop = app.attach(stream)  # type: ignore[arg-type]  # a stand-in with what a turn uses
    app.assignments.guard.passed = True  # no other member: the loop may process at once
    before = _turns(app)
    assert set(before) >= {"batch", "checkpoint", "commit", "probe"} and not any(before.values())  # zeros at start
    loop.turn()  # 20 events: a batch, no checkpoint due yet (30 events), a probe of the lag (the first is due)
    loop.turn()  # 20 more: a checkpoint (40 >= 30) and its commit
    loop.turn()  # nothing came: an idle turn, not counted (the probe is not due for 5 s)
    turns = _turns(app)
    assert turns["checkpoint"] == 1, turns
    assert turns["batch"] == 1 and sum(turns.values()) == 2, turns  # (a batch before its probe)
    assert stream.committed == [{("points", 0): 40}]
    text = generate_latest(app.metrics.registry).decode()
    assert "perceptron_poll_loop_flush_seconds_count 2.0" in text  # each batch's wait for its acknowledgements
