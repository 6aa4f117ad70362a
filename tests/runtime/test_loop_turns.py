"""The poll loop's turn times, by what each turn did (``perceptron_poll_loop_turn_seconds{did}``): where a tail of
latency comes from. Turns of the loop (:meth:`Loop.turn`) over a stream with no broker behind it."""

from __future__ import annotations

import time

from perceptron_stream.app import Application
from perceptron_stream.config import ServeSettings, load
from prometheus_client import generate_latest

from tests.support.streams import ScriptedStream, scripted_records


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
    stream = ScriptedStream([scripted_records(0, 20), scripted_records(20, 20)])
    loop = app.attach(stream)  # type: ignore[arg-type]  # a stand-in with what a turn uses
    app.assignments.guard.passed = True  # no other member: the loop may process at once
    before = _turns(app)
    assert set(before) >= {"batch", "checkpoint", "commit", "probe"} and not any(before.values())  # zeros at start
    loop.turn()  # 20 events: a batch, no checkpoint due yet (30 events), a probe of the lag (the first is due)
    loop.turn()  # 20 more: a checkpoint (40 >= 30), written off the loop
    turns_after = 0
    while not stream.committed and turns_after < 1000:  # nothing came: idle turns, not counted (no probe for 5 s),
        time.sleep(0.01)
        loop.turn()  # until the one that finds the checkpoint written and commits its positions
        turns_after += 1
    turns = _turns(app)
    assert turns["checkpoint"] == 1 and turns["commit"] == 1, turns
    assert turns["batch"] == 1 and sum(turns.values()) == 3, turns  # (a batch before its probe)
    assert stream.committed == [{("points", 0): 40}]
    text = generate_latest(app.metrics.registry).decode()
    assert "perceptron_poll_loop_flush_seconds_count 2.0" in text  # each batch's wait for its acknowledgements
