"""How long a checkpoint stops the poll loop, without Kafka: the loop's turns timed by what they did.

    python3 bench/loop_turns.py                                   # this tree
    python3 bench/loop_turns.py --tree before=/tmp/old --tree after=.   # side by side, each in a process of its own

The service's loop (``Loop.turn``) over a stream that hands it batches of
``--batch`` events of d = 10 and takes its outputs and commits at once, with
the local state store (a checkpoint file written, fsynced and renamed, as in
the service) every ``--checkpoint-every`` events. Between turns the loop
sleeps ``--poll-wait-ms``, as it waits in a poll for the next fetch: where a
checkpoint written off the loop gets its thread's turn. Each turn is timed
without that wait (as ``perceptron_poll_loop_turn_seconds``), and put down as
the turn in which a checkpoint was due ("checkpoint"), the turn after it
("after": where a checkpoint written off the loop is taken in and its
positions committed), or a plain batch. What the e2e latency runs cannot
isolate on a shared machine: the network's and the brokers' times are left
out, so the difference is the checkpoint's own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.trees import import_root, use_tree  # noqa: E402


def batches(events: int, size: int) -> list:
    """``events`` labeled events of d = 10 on ("points", 0), in batches of ``size``."""
    from perceptron_stream.kafka import Record
    from perceptron_stream.streams import separable

    out, batch = [], []
    for i, (event, _) in enumerate(zip(separable(dimensions=10, noise=0.05, seed=1), range(events))):
        batch.append(Record("points", 0, i, None, json.dumps(event, separators=(",", ":")).encode(), 0))
        if len(batch) == size:
            out.append(batch)
            batch = []
    if batch:
        out.append(batch)
    return out


def worker(args) -> dict:
    """One tree's turns (imported from the tree this process was started on)."""
    from perceptron_stream.app import Application
    from perceptron_stream.config import ServeSettings, load
    from perceptron_stream.runtime.startup import Opened
    from perceptron_stream.state.checkpoint import Owner
    from perceptron_stream.state.local import LocalStore

    from tests.support.streams import ScriptedStream  # the tests' stand-in: hands over a batch a poll, takes all

    with tempfile.TemporaryDirectory(prefix="loop-turns-") as state:
        flags = [
            "--metrics-port",
            "0",
            "--state-dir",
            state,
            "--checkpoint-interval-events",
            str(args.checkpoint_every),
        ]
        app = Application(load(ServeSettings, flags))
        s = app.settings
        app.wire(Opened(Owner(s.group_id, s.input_topic), store=LocalStore(Path(state), s.group_id)))
        stream = ScriptedStream(batches(args.events, args.batch))
        loop = app.attach(stream)  # type: ignore[arg-type]  # a stand-in with what a turn uses
        app.assignments.guard.passed = True
        times: dict[str, list[float]] = {"plain": [], "checkpoint": [], "after": []}
        seen, due_at, after = 0, args.checkpoint_every, False
        while stream.batches:
            size = len(stream.batches[0])
            started = time.perf_counter()
            loop.turn()
            took = time.perf_counter() - started
            seen += size
            kind = "after" if after else "plain"
            after = False
            if seen >= due_at:
                kind, after, due_at = "checkpoint", True, due_at + args.checkpoint_every
            times[kind].append(took)
            time.sleep(args.poll_wait_ms / 1000)
        app.checkpointer.final(app.tasks.all(), stream, batch_open=False)
        close = getattr(app.checkpointer, "close", None)
        if close is not None:
            close()
    return {kind: summary(ts) for kind, ts in times.items() if ts}


def summary(times: list[float]) -> dict:
    ms = sorted(t * 1000 for t in times)
    return {
        "turns": len(ms),
        "median_ms": round(statistics.median(ms), 3),
        "p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 3),
        "max_ms": round(ms[-1], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tree", action="append", help="NAME=DIR: a source tree to measure (default: this one)")
    parser.add_argument("--events", type=int, default=500_000)
    parser.add_argument("--batch", type=int, default=500, help="events a turn (default 500)")
    parser.add_argument("--checkpoint-every", type=int, default=10_000, help="events (default 10000, the service's)")
    parser.add_argument("--poll-wait-ms", type=float, default=2.0, help="the wait between turns (default 2)")
    parser.add_argument("--rounds", type=int, default=2, help="each tree this often, alternating (default 2)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        use_tree(Path(args.worker))
        print(json.dumps(worker(args)))
        return
    trees = [t.split("=", 1) for t in (args.tree or [f"this={ROOT}"])]
    for round_ in range(args.rounds):
        for name, tree in trees:
            env = {**os.environ, "PYTHONPATH": str(import_root(Path(tree)))}
            out = subprocess.run(
                [sys.executable, __file__, "--worker", tree, *_passed(args)],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            result = json.loads(out.strip().splitlines()[-1])
            line = ", ".join(
                f"{kind} {r['turns']} x median {r['median_ms']:.2f} ms, p99 {r['p99_ms']:.2f}, max {r['max_ms']:.2f}"
                for kind, r in result.items()
            )
            print(f"round {round_ + 1}, {name}: {line}", flush=True)


def _passed(args) -> list[str]:
    return [
        "--events", str(args.events),
        "--batch", str(args.batch),
        "--checkpoint-every", str(args.checkpoint_every),
        "--poll-wait-ms", str(args.poll_wait_ms),
    ]  # fmt: skip


if __name__ == "__main__":
    main()
