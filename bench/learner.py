"""How fast is the learning core?  Events per second, against river, in the same run.

    python3 bench/learner.py                 # the table of bench/README.md
    python3 bench/learner.py --events 5000 --repeats 3 --json bench/results/learner.json

For d = 2, 10, 100 and a clean or 5%-label-noise stream (labels from a fixed
random separator with a bias), it times on the very same events:

- river: ``river.linear_model.Perceptron`` ``predict_one`` + ``learn_one``
  (dicts, bool labels: river's only interface);
- ours p+l: :class:`Perceptron` ``predict_one`` + ``learn_one`` (dicts);
- step: the service's hot path :meth:`Perceptron.step` on dense lists, and on
  dicts (the ``features`` form of the wire format);
- averaged / pocket: ``step`` on lists, as a cost relative to plain.

Every run is a fresh model (w = 0, so the early updates count) over the whole
stream.  In each of ``--repeats`` rounds every contender runs once, in a
shuffled order, timed in process CPU time.  Rates are the best round; ratios
are the median over rounds of the same-round ratio, which cancels the load
changes of a shared machine.  No timing is asserted anywhere in tests.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import river
from perceptron_stream.learning import Perceptron
from rich.console import Console
from rich.table import Table
from river import linear_model


def make_stream(d: int, n: int, noise: float, seed: int = 42) -> tuple[list[list[float]], list[int]]:
    """n points in [-1, 1]^d labelled by a random hyperplane; a fraction ``noise`` of labels flipped."""
    rng = random.Random(seed * 1000 + d)
    w = [rng.gauss(0, 1) for _ in range(d)]
    b = rng.gauss(0, 0.3)
    X = [[rng.uniform(-1, 1) for _ in range(d)] for _ in range(n)]
    y = [1 if sum(wi * xi for wi, xi in zip(w, x)) + b > 0 else -1 for x in X]
    y = [-v if rng.random() < noise else v for v in y]
    return X, y


def timed_rounds(runs: Mapping[str, Callable[[], object]], repeats: int, seed: int = 0) -> list[dict[str, float]]:
    """``repeats`` rounds; in each, every run once, in a shuffled order: CPU seconds per run.

    Taking turns exposes all contenders to the same machine load, and the clock
    is this process's CPU time (time.process_time), not wall time.
    """
    rng = random.Random(seed)
    rounds = []
    for _ in range(repeats):
        names = list(runs)
        rng.shuffle(names)
        times = {}
        for name in names:
            t0 = time.process_time()
            runs[name]()
            times[name] = time.process_time() - t0
        rounds.append(times)
    return rounds


def summarize(rounds: list[dict[str, float]], n: int) -> tuple[dict[str, float], dict[str, float]]:
    """(best events/s of each run, median over rounds of each same-round time ratio).

    Ratios: river's time / ours (speed-up) and averaged or pocket / plain step
    (cost).  Same-round ratios cancel the load changes between rounds.
    """
    rates = {k: n / min(r[k] for r in rounds) for k in rounds[0]}
    pairs = {
        "ours_pl": ("river", "ours_pl"),
        "step_list": ("river", "step_list"),
        "step_dict": ("river", "step_dict"),
        "averaged": ("averaged", "step_list"),
        "pocket": ("pocket", "step_list"),
    }
    ratios = {k: statistics.median(r[a] / r[b] for r in rounds) for k, (a, b) in pairs.items()}
    return rates, ratios


def measure(d: int, noise: float, n: int, repeats: int) -> dict:
    X, y = make_stream(d, n, noise)
    D: list[dict] = [dict(enumerate(x)) for x in X]  # river types x as dict[Hashable, Any] (invariant)
    B = [v == 1 for v in y]

    def river_pl() -> None:
        m = linear_model.Perceptron()
        for x, t in zip(D, B):
            m.predict_one(x)
            m.learn_one(x, t)

    def ours_pl() -> None:
        m = Perceptron()
        for x, t in zip(D, y):
            m.predict_one(x)
            m.learn_one(x, t)

    def stepper(variant: str, rows: list) -> Callable[[], None]:
        def run() -> None:
            step = Perceptron(variant).step
            for x, t in zip(rows, y):
                step(x, t)

        return run

    runs = {
        "river": river_pl,
        "ours_pl": ours_pl,
        "step_list": stepper("plain", X),
        "step_dict": stepper("plain", D),
        "averaged": stepper("averaged", X),
        "pocket": stepper("pocket", X),
    }
    rates, ratios = summarize(timed_rounds(runs, repeats), n)
    m = Perceptron()
    for x, t in zip(X, y):
        m.step(x, t)
    return {"d": d, "noise": noise, "events": n, "mistakes": m.mistakes, "rates": rates, "ratios": ratios}


def table(rows: list[dict]) -> Table:
    t = Table(
        title="events/s (best round); in brackets, the median same-round ratio: speed-up over river, or cost against a plain step"
    )
    for col in ("d", "noise", "mistakes", "river p+l", "ours p+l", "step list", "step dict", "averaged", "pocket"):
        t.add_column(col, justify="right")
    for r in rows:
        q, k = r["rates"], r["ratios"]
        t.add_row(
            str(r["d"]),
            f"{r['noise']:.0%}",
            f"{r['mistakes']:,}",
            f"{q['river']:,.0f}",
            *(f"{q[c]:,.0f} ({k[c]:.1f}×)" for c in ("ours_pl", "step_list", "step_dict")),
            *(f"{q[c]:,.0f} (cost {k[c]:.2f}×)" for c in ("averaged", "pocket")),
        )
    return t


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=20_000, help="events per stream (default 20000)")
    ap.add_argument("--repeats", type=int, default=9, help="rounds (default 9)")
    ap.add_argument("--dims", type=int, nargs="+", default=[2, 10, 100])
    ap.add_argument("--json", type=Path, help="also write the figures to this file")
    args = ap.parse_args(argv)
    rows = [measure(d, noise, args.events, args.repeats) for d in args.dims for noise in (0.0, 0.05)]
    console = Console(width=150)
    console.print(table(rows))
    console.print(
        f"Python {platform.python_version()}, river {river.__version__}, {platform.machine()}, "
        f"{args.events} events, {args.repeats} rounds, CPU time; load average {os.getloadavg()[0]:.2f}"
    )
    if args.json:
        args.json.write_text(
            json.dumps({"python": platform.python_version(), "river": river.__version__, "rows": rows}, indent=2)
        )


if __name__ == "__main__":
    main()
