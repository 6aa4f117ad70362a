"""The service's own work per event, without Kafka: decode, step, challengers, pending join, output encoding, book-keeping.

    python3 bench/own_work.py                          # this tree, every configuration
    python3 bench/own_work.py --tree /tmp/old          # another tree (e.g. git archive c769d4d | tar -x -C /tmp/old)
    python3 bench/own_work.py --only plain --rounds 9  # one configuration (A/B of a small change: alternate the trees)
    python3 bench/own_work.py --only plain --only "+ model" --only "+ explain"   # the model history, reason codes

What the poll loop does with a batch once the client handed it over, with
the client's part left out (the outputs go to a no-op ``send``): 100,000
events of d = 10 (5% label noise), in batches of 1,000, as the service's
task processes them (``Task.process``, with the pending tables' checkpoint
every ``--checkpoint-interval-events`` as the service takes it; on a tree from before the task,
``Application._process`` over a stream whose sends do nothing). CPU time of
the process, the best of ``--rounds``; every configuration in turn per round.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class NullStream:
    """What the old Application used of its stream, doing nothing."""

    def send(self, topic, key, value):
        pass

    def flush(self, timeout_s):
        return []


def records(count: int, labeled: bool = True, topic: str = "points"):
    """``count`` events of d = 10 as the client hands them over: with or without ``y`` on ``topic``; on the label
    topic (``topic="labels"``) the labels of the same events, ``{"id", "y"}``, in the same order."""
    from perceptron_stream.streams import separable

    try:
        from perceptron_stream.kafka.contract import Record
    except ImportError:  # before service/kafka/contract.py
        from perceptron_stream.kafka.types import Record  # type: ignore[import-not-found, no-redef]  # that tree's module
    out = []
    for i, (e, _) in enumerate(zip(separable(dimensions=10, noise=0.05, seed=1), range(count))):
        if topic == "labels":
            e = {"id": e["id"], "y": e["y"]}
        elif not labeled:
            e = {"id": e["id"], "x": e["x"]}
        out.append(
            tuple.__new__(
                Record,
                (topic, 0, i, e["id"].encode(), json.dumps(e, separators=(",", ":")).encode(), 1_700_000_000_000 + i),
            )
        )
    return out


def runner(args: list[str], recs, tmp: Path, labels=None, free_table: bool = False):
    """A function that processes ``recs`` once through the service's own path, in batches of 1,000 (with
    ``labels``: after each batch of points, the labels of the batch before it, a lag of 1,000 as bench/e2e.py's)."""
    from perceptron_stream.app import Application
    from perceptron_stream.config import ServeSettings, load

    app = Application(
        load(ServeSettings, ["--metrics-port", "0", "--state-store", "none", "--state-dir", str(tmp), *args])
    )
    try:
        from perceptron_stream.pipeline.task import Tally
    except ImportError:  # the old Application: its own _process, over a stream that does nothing
        app.io = NullStream()  # type: ignore[attr-defined]  # that Application's stream
        return lambda: [app._process(recs[i : i + 1000]) for i in range(0, len(recs), 1000)]  # type: ignore[attr-defined]  # that Application's _process (one batch)
    if app.settings.label_topic is not None and not hasattr(app, "factory"):  # before the task factory (which makes
        import tempfile  # its own cache directory), the app did

        app._cache_dir = tempfile.TemporaryDirectory()  # type: ignore[attr-defined]  # that Application's
    task = app.tasks.group
    assert task is not None  # group scope
    if free_table:  # the least any table can cost (bench/free_table.py)
        from bench.free_table import FreeTable

        task.joiner.open_table = lambda partition: FreeTable()
    batches = [recs[i : i + 1000] for i in range(0, len(recs), 1000)]
    if labels is not None:
        from itertools import chain

        later = [labels[i : i + 1000] for i in range(0, len(labels), 1000)]
        batches = [*chain.from_iterable(zip(batches, [[], *later[:-1]])), later[-1]]

    every = app.settings.checkpoint_interval_events
    seq = 0

    def run():
        nonlocal seq
        since = 0
        for batch in batches:
            if not batch:
                continue
            tally = Tally()
            task.process(batch, lambda t, k, v: None, tally)
            if task.joiner is not None:
                task.joiner.commit(tally)
                since += len(batch)
                if since >= every:  # the pending tables' part of a checkpoint, when the service takes one
                    seq, since = seq + 1, 0
                    started = time.perf_counter()
                    task.joiner.saved(seq)  # in the loop's turn, as the service takes it with a label topic
                    run.checkpoint_s.append(time.perf_counter() - started)  # type: ignore[attr-defined]
            app.metrics.observe_tally(tally, 0.001)

    run.checkpoint_s = []  # type: ignore[attr-defined]  # the wall time of each of its pending tables' checkpoints
    if task.joiner is not None:  # before each round, untimed: the tables emptied, so the same ids are new points again

        def reset():
            nonlocal seq
            task.joiner.restore(0, {}, [0])
            seq = 0

        run.reset = reset  # type: ignore[attr-defined]  # best_cpu calls a run's reset, if it has one, untimed
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tree", type=Path, default=ROOT, help="source tree whose service is measured")
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="PREFIX",
        help="only the configurations whose name starts with PREFIX (e.g. plain); repeatable",
    )
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from bench.trees import use_tree

    use_tree(args.tree)  # the tree's own perceptron_stream, not the installed one
    import tempfile

    configs: dict[str, tuple[list[str], bool | str]] = {"plain": ([], True)}
    if (args.tree / "service" / "pipeline").is_dir():  # a tree with challengers and delayed labels
        configs["+ challengers averaged,pocket"] = (["--challengers", "averaged,pocket"], True)
        configs["+ label topic (points kept pending)"] = (["--label-topic", "labels"], False)
        configs["+ both"] = (["--challengers", "averaged,pocket", "--label-topic", "labels"], False)
        configs["+ both, labels joined (an event: point + label)"] = (
            ["--challengers", "averaged,pocket", "--label-topic", "labels"],
            "joined",
        )
        configs["+ both, labels joined, a dict for a table (bench/free_table.py)"] = (
            ["--challengers", "averaged,pocket", "--label-topic", "labels"],
            "free",
        )
    if (args.tree / "service" / "pipeline" / "history.py").is_file():  # the model history, reason codes (issue 37)
        configs["+ model history"] = (["--model-history-topic", "history"], True)
        configs["+ explain 3"] = (["--explain", "3"], True)
        configs["+ model history, explain 3"] = (["--model-history-topic", "history", "--explain", "3"], True)
    if args.only:
        configs = {name: config for name, config in configs.items() if name.startswith(tuple(args.only))}
    with tempfile.TemporaryDirectory() as tmp:
        recs = {labeled: records(args.events, labeled) for labeled in (True, False)}
        labels = records(args.events, topic="labels")
        runs = {
            name: runner(
                flags,
                recs[labeled is True],
                Path(tmp) / str(i),
                labels if labeled in ("joined", "free") else None,
                free_table=labeled == "free",
            )
            for i, (name, (flags, labeled)) in enumerate(configs.items())
        }
        gc.collect()
        gc.freeze()  # as the service does after start-up
        report(args.tree, args.events, args.rounds, best_cpu(runs, args.rounds))
        for name, run in runs.items():
            if getattr(run, "checkpoint_s", None):
                ms = sorted(1000 * s for s in run.checkpoint_s)
                print(
                    f"# {name}: its pending tables' checkpoints, {len(ms)} in {args.rounds} rounds, ms of the loop's turn:"
                    f" median {statistics.median(ms):.1f}, longest {ms[-1]:.1f}"
                )


def best_cpu(runs: dict, rounds: int) -> dict[str, float]:
    """The least CPU seconds of each run over ``rounds``, the runs in turn each round (a run's ``reset``, untimed)."""
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(rounds):
        for name, run in runs.items():
            if hasattr(run, "reset"):
                run.reset()
            started = time.process_time()
            run()
            best[name] = min(best[name], time.process_time() - started)
    return best


def report(tree: Path, events: int, rounds: int, best: dict[str, float]) -> None:
    import perceptron_stream

    print(f"# {tree}: {events:,} events of d = 10, CPU µs an event (best of {rounds})")
    print(f"# perceptron_stream from {Path(perceptron_stream.__file__ or '').resolve().parent}")
    for name, seconds in best.items():
        print(f"{name:40s} {seconds / events * 1e6:6.2f}")


if __name__ == "__main__":
    main()
