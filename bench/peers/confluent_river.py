"""A confluent-kafka loop predicting and learning with river's Perceptron (``--client confluent+river``).

What a user would write instead of the service, the way confluent-kafka's
documentation shows a consume → transform → produce loop, at least once: a
consumer in a group with auto commit off; ``consume`` a batch; for each
message ``json.loads``, river's ``linear_model.Perceptron`` ``predict_one``
then ``learn_one`` (bool labels: y == 1), ``produce`` the prediction
(``json.dumps``) keyed like the input with a delivery report, ``poll(0)``; then
``flush`` and a synchronous ``commit``. Client defaults otherwise.

Standalone, on a broker of your own::

    python3 -m bench.peers.confluent_river --bootstrap localhost:9092 --input points --output predictions
"""

from __future__ import annotations

import json
import signal

from confluent_kafka import Consumer, KafkaException, Producer

from bench.peers.river_model import predictor, standalone_arguments


def run(bootstrap: str, input_topic: str, output_topic: str, group: str, events: int = 0, batch: int = 500) -> None:
    """Until SIGTERM. (``events`` is not used: the runner reads progress from the committed offsets.)"""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    producer = Producer({"bootstrap.servers": bootstrap})
    predict_and_learn = predictor()
    failed = []

    def delivery_report(err, msg):
        if err is not None:
            failed.append(err)

    running = True

    def shutdown(*_):
        nonlocal running
        running = False

    signal.signal(signal.SIGTERM, shutdown)
    consumer.subscribe([input_topic], on_assign=lambda c, partitions: print("assigned", len(partitions), flush=True))
    try:
        while running:
            messages = consumer.consume(num_messages=batch, timeout=1.0)
            if not messages:
                continue
            for msg in messages:
                if msg.error():
                    raise KafkaException(msg.error())
                prediction = predict_and_learn(json.loads(msg.value() or b"null"))  # a tombstone: an error
                producer.produce(output_topic, json.dumps(prediction).encode(), key=msg.key(), callback=delivery_report)
                producer.poll(0)
            producer.flush()
            if failed:
                raise KafkaException(failed[0])  # nothing of this batch committed: it is read again
            consumer.commit(asynchronous=False)
    finally:
        consumer.close()


def main() -> None:
    parser = standalone_arguments(__doc__, "confluent-river")
    parser.add_argument("--batch", type=int, default=500, help="messages per consume")
    args = parser.parse_args()
    run(args.bootstrap, args.input, args.output, args.group, batch=args.batch)


if __name__ == "__main__":
    main()
