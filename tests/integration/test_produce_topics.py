"""`perceptron-stream produce` into a real broker: files replayed byte for byte, seeded streams the same twice,
points now and their labels later in the same partition number, the label topic made like the point topic.

Its checks that need no broker are tests/test_produce.py's.
"""

import json

from perceptron_stream.config import ProduceSettings, load
from perceptron_stream.produce import messages, paired_messages, produce

from tests.support.statistics import within_binomial
from tests.support.topics import consume, create_topic


def test_jsonl_replay_passes_malformed_lines_for_the_service_to_dead_letter(broker, topics, tmp_path):
    lines = [
        b'{"id": "a", "x": [1.0, 2.0], "y": 1}',
        b"not json",
        b"\xff\xfe not utf-8",
        b'{"x": [1, 2], "y": 2}',
        b'{"x": [NaN]}',
        b'{"features": {"age": 31}}',
    ]
    data = tmp_path / "d.jsonl"
    data.write_bytes(b"\n".join(lines) + b"\n\n")
    topic = topics["input_topic"]
    assert (
        produce(
            load(
                ProduceSettings,
                ["--bootstrap-servers", broker.bootstrap_servers, "--topic", topic, "--file", str(data)],
            )
        )
        == 6
    )
    records = consume(broker.bootstrap_servers, topic, len(lines))
    assert [r.value for r in records] == lines and {r.key for r in records} == {None}


def test_the_same_seed_writes_the_same_records(broker, topics):
    def run(topic):
        args = [
            "--bootstrap-servers",
            broker.bootstrap_servers,
            "--topic",
            topic,
            "--stream",
            "drift",
            "--count",
            "400",
            "--drift-every",
            "100",
            "--unlabeled",
            "0.1",
            "--seed",
            "5",
        ]
        assert produce(load(ProduceSettings, args)) == 400
        return [(r.key, r.value) for r in consume(broker.bootstrap_servers, topic, 400)], list(
            messages(load(ProduceSettings, args))
        )

    (first, expected), (second, _) = run(topics["input_topic"]), run(topics["output_topic"])
    assert first == second == expected


def test_points_now_and_their_labels_later_in_the_same_partition_number(broker, topics):
    point_topic, label_topic = topics["input_topic"], f"{topics['input_topic']}.labels"
    for topic in (point_topic, label_topic):
        create_topic(broker.bootstrap_servers, topic, partitions=2)
    args = [
        "--bootstrap-servers",
        broker.bootstrap_servers,
        "--topic",
        point_topic,
        "--label-topic",
        label_topic,
        "--stream",
        "credit",
        "--count",
        "200",
        "--rate",
        "500",
        "--label-delay-seconds",
        "0.2",
        "--label-missing",
        "0.1",
        "--seed",
        "14",
        "--no-progress",
    ]
    written = produce(load(ProduceSettings, args))
    expected = list(paired_messages(load(ProduceSettings, args)))
    n_labels = sum(label is not None for _, _, label in expected)
    assert (written.points, written.labels) == (200, n_labels)
    assert within_binomial(200 - n_labels, 200, 0.1), n_labels  # about 10% never labeled
    points = {r.key: r for r in consume(broker.bootstrap_servers, point_topic, 200)}
    labels = consume(broker.bootstrap_servers, label_topic, n_labels)
    assert len(points) == 200 and len(labels) == n_labels
    assert {r.key: r.value for r in points.values()} == {key: point for key, point, _ in expected}
    assert sorted(r.value for r in labels) == sorted(label for _, _, label in expected if label is not None)
    assert {r.partition for r in points.values()} == {
        0,
        1,
    }  # both partitions in use, so the check below means something
    for label in labels:
        point = points[label.key]  # the same key as its point ...
        assert json.loads(label.value)["id"].encode() == label.key and "y" not in json.loads(point.value)
        assert label.partition == point.partition  # ... so the same partition number
        assert label.timestamp - point.timestamp >= 150, (
            label.timestamp - point.timestamp
        )  # 0.2 s later (ms timestamps)


def test_the_label_topic_is_created_with_the_point_topics_partition_count(broker, topics):
    point_topic, label_topic = topics["input_topic"], f"{topics['input_topic']}.labels"
    create_topic(broker.bootstrap_servers, point_topic, partitions=3)
    args = [
        "--bootstrap-servers",
        broker.bootstrap_servers,
        "--topic",
        point_topic,
        "--label-topic",
        label_topic,
        "--count",
        "30",
        "--label-delay-seconds",
        "0",
        "--no-progress",
    ]
    assert produce(load(ProduceSettings, args)).labels == 30
    records = consume(broker.bootstrap_servers, label_topic, 30)
    from perceptron_stream.kafka import partition_counts

    settings = load(ProduceSettings, args)
    assert partition_counts(settings, [label_topic]) == {label_topic: 3}
    assert {r.partition for r in records} <= {0, 1, 2}
