"""What mixing buys: S replicas, each on its share of a stream, with no, uniform or error-weighted mixing.

    python3 bench/mixing.py                       # the table of bench/README.md "Scale-out: mixing"
    python3 bench/mixing.py --events 40000 --mix-every 100

The learning core only (no Kafka): the stream is dealt round-robin to S
shards, as keyed events spread over partitions; every shard learns its
events in order and, every ``--mix-every`` events it learned, its weights
are mixed with the others' (perceptron_stream.learning.mixing.simulate: synchronous
rounds, the paper's Figure 3). For each stream, S and mixing it reports:

- mistake rate: mistakes of the published predictions over all events (the
  dashboard's figure), relative to the single model (S = 1) in brackets;
- final accuracy: the final model(s) on 5,000 fresh events of the stream's
  last concept (averaged over shards without mixing).

Streams: separable (d = 10, γ = 0.1), noisy (5% labels flipped), and the
credit stream of the demo (named features, river's StandardScaler in front,
2% noise, the bank's policy changes halfway).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from itertools import islice
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perceptron_stream.learning import Perceptron, make_learner
from perceptron_stream.learning.mixing import shard, simulate
from perceptron_stream.streams import credit, separable
from rich.console import Console
from rich.table import Table

SHARDS = (1, 2, 4, 8)
MIXINGS = ("none", "uniform", "error")


def streams(events: int, seed: int) -> dict[str, tuple[list, list, Callable[[], Any]]]:
    """name → (training events, fresh test events of the last concept, learner factory)."""

    def take(gen, n):
        return [(e["x"] if "x" in e else e["features"], e["y"]) for e in islice(gen, n)]

    out: dict[str, tuple[list, list, Callable[[], Any]]] = {}
    for name, noise in (("separable", 0.0), ("noisy", 0.05)):
        both = take(separable(dimensions=10, margin=0.1, noise=noise, seed=seed), events + 5000)
        out[name] = (both[:events], both[events:], Perceptron)
    drift = events // 2
    train = take(credit(noise=0.02, seed=seed, drift_every=drift), events)
    test = take(islice(credit(noise=0.0, seed=seed + 1, drift_every=0), 5000), 5000)  # the new policy from the start
    out["credit (drift)"] = (train, test, lambda: make_learner(standardize=True))
    return out


def accuracy(model, test: list) -> float:
    return sum(1 for x, y in test if model.predict_one(x if isinstance(x, dict) else dict(enumerate(x))) == y) / len(
        test
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--mix-every", type=int, default=1000, help="events a shard learns between mixes")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    console = Console()
    table = Table(title=f"{args.events:,} events, a mix every {args.mix_every:,} events a shard learns")
    for column in ("stream", "S", "mixing", "mistake rate", "final accuracy"):
        table.add_column(column, justify="right" if column != "stream" else "left")
    for name, (train, test, learner) in streams(args.events, args.seed).items():
        single = None
        for s in SHARDS:
            for mixing in MIXINGS if s > 1 else ("none",):
                sim = simulate(shard(train, s), round_events=args.mix_every, mixing=mixing, learner=learner)
                rate = sum(m.mistakes for m in sim.shards) / len(train)
                acc = sum(accuracy(m, test) for m in sim.shards) / len(sim.shards)
                single = rate if s == 1 else single
                relative = f" ({rate / single - 1:+.0%})" if s > 1 and single else ""
                table.add_row(
                    name if s == 1 else "", str(s), mixing if s > 1 else "—", f"{rate:.4f}{relative}", f"{acc:.4f}"
                )
        table.add_section()
    console.print(table)


if __name__ == "__main__":
    main()
