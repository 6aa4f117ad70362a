"""A Quix Streams application predicting and learning with river's Perceptron (``--client quix+river``).

What a user would write instead of the service, the way the Quix Streams
documentation shows: an ``Application`` on the broker, JSON topics, a
``StreamingDataFrame`` that applies a function to every event and writes its
result to the output topic. The function is river's ``linear_model.Perceptron``:
``predict_one`` then ``learn_one`` (bool labels: y == 1). Quix's defaults
otherwise: at least once, a checkpoint (producer flush, then offset commit)
every 5 s (``commit_interval``), one message at a time.

Standalone, on a broker of your own::

    python3 -m bench.peers.quix_river --bootstrap localhost:9092 --input points --output predictions
"""

from __future__ import annotations

import tempfile
import time

from quixstreams import Application

from bench.peers.river_model import predictor, standalone_arguments


def application(bootstrap: str, input_topic: str, output_topic: str, group: str, **options) -> Application:
    app = Application(broker_address=bootstrap, consumer_group=group, auto_offset_reset="earliest", **options)
    points = app.topic(input_topic, value_deserializer="json")
    predictions = app.topic(output_topic, value_serializer="json")

    sdf = app.dataframe(points)
    sdf = sdf.apply(predictor())
    sdf.to_topic(predictions)  # keyed like the input
    return app


def run(bootstrap: str, input_topic: str, output_topic: str, group: str, events: int, batch: int) -> None:
    """For ``bench/e2e.py``: the application until SIGTERM (Quix's own handler stops it; it commits on the way out).

    Quix Streams has no public on-assign hook: "assigned" is printed when the first message is
    processed. ``on_message_processed`` (called once the message's output was produced) prints
    "processed N T" (T: the clock in ms) at the first message, every ``batch`` messages and at
    ``events``. The runner reads from those lines the CPU time per event (the offsets are committed
    every 5 s only) and the span from the first output to the last: Quix stamps an output with the
    timestamp of its input (``to_topic``), so the outputs' CreateTimes tell nothing of when they were
    made. That every output was acknowledged it reads from the committed offsets, as for the others.
    """
    done = 0

    def processed(topic: str, partition: int, offset: int) -> None:
        nonlocal done
        done += 1
        if done == 1:
            print("assigned (first message processed)", flush=True)
        if done == 1 or done % batch == 0 or done == events:
            print(f"processed {done} {time.time() * 1000:.1f}", flush=True)

    with tempfile.TemporaryDirectory(prefix="quix-state-") as state:  # stateless, but Quix makes ./state
        application(bootstrap, input_topic, output_topic, group, on_message_processed=processed, state_dir=state).run()


def main() -> None:
    parser = standalone_arguments(__doc__, "quix-river")
    args = parser.parse_args()
    application(args.bootstrap, args.input, args.output, args.group).run()


if __name__ == "__main__":
    main()
