"""The pieces of a plain event's own work, each timed alone, one event at a time and a batch at once.

    python3 bench/parts.py                      # this tree
    python3 bench/parts.py --tree /tmp/old      # another checkout (git archive <commit> service | tar -x -C /tmp/old)

100,000 events of d = 10 (5% label noise) as the client hands them over
(bench/own_work.py's records), each piece over all of them: decoding
(``Decoder.decode`` per message; ``Decoder.decode_many`` per batch of 1,000),
the step (the learner's ``step`` per event; ``step_many`` per batch), the
prediction's JSON (``prediction`` per event; ``predictions`` per batch) and
drift detection (DDM fed the mistake flags as the task feeds it). CPU time,
the best of ``--rounds``, the pieces in turn each round. A tree without the
batch form (before issue 26) times the per-event pieces only. With
bench/own_work.py (the whole task) this says where a plain event's
microseconds go (bench/README.md, "The floor").
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BATCH = 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--tree", type=Path, default=ROOT, help="source tree whose service is measured")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from bench.trees import use_tree

    use_tree(args.tree)  # the tree's own perceptron_stream, not the installed one
    from perceptron_stream.learning import make_learner
    from perceptron_stream.pipeline.models import DriftWatch
    from perceptron_stream.wire.inputs import Decoder
    from perceptron_stream.wire.messages import Event
    from perceptron_stream.wire.outputs import prediction

    from bench.own_work import best_cpu, records, report

    recs = records(args.events)
    decoded = [Decoder(1 << 20, 10_000).decode(r.value, r.key) for r in recs]
    events = [e for e in decoded if isinstance(e, Event)]  # every one: the records are valid events
    learner = make_learner("plain", 0.0, False)
    flags = [learner.step(e.x, e.y)[2] is True for e in events]  # labeled events: a bool each
    spans = range(0, len(recs), BATCH)

    def decode():
        d = Decoder(1 << 20, 10_000).decode  # a new decoder each round: the first event fixes its dimension
        for r in recs:
            d(r.value, r.key)

    def step():
        s = make_learner("plain", 0.0, False).step
        for e in events:
            s(e.x, e.y)

    def encode():
        for i, e in enumerate(events):
            prediction(e.id, "points", 0, i, 1, 0.5, e.y, False, 42, i, 7)

    def drift():
        DriftWatch().update(flags)

    pieces = {
        "decode and validate": decode,
        "step (predict, then learn)": step,
        "the prediction's JSON": encode,
        "drift detection (DDM)": drift,
    }
    if hasattr(Decoder, "decode_many"):  # the batch form (issue 26)
        from perceptron_stream.wire.outputs import predictions

        values, keys = [r.value for r in recs], [r.key for r in recs]
        ids, xs, ys = [e.id for e in events], [e.x for e in events], [e.y for e in events]
        steps = make_learner("plain", 0.0, False).step_many(xs, ys)

        def decode_many():
            d = Decoder(1 << 20, 10_000).decode_many
            for i in spans:
                d(values[i : i + BATCH], keys[i : i + BATCH])

        def step_many():
            s = make_learner("plain", 0.0, False).step_many
            for i in spans:
                s(xs[i : i + BATCH], ys[i : i + BATCH])

        def encode_many():
            for i in spans:
                j = i + BATCH
                predictions(
                    ids[i:j],
                    "points",
                    0,
                    list(range(i, j)),
                    steps.y_pred[i:j],
                    steps.score[i:j],
                    ys[i:j],
                    steps.mistake[i:j],
                    steps.updates[i:j],
                    steps.seen[i:j],
                    steps.mistakes[i:j],
                )

        pieces |= {
            "decode_many (batches of 1,000)": decode_many,
            "step_many (batches of 1,000)": step_many,
            "predictions (batches of 1,000)": encode_many,
        }
    gc.collect()
    gc.freeze()  # as the service does after start-up
    report(args.tree, args.events, args.rounds, best_cpu(pieces, args.rounds))


if __name__ == "__main__":
    main()
