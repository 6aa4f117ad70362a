"""Tasks made as the service makes them (the task factory, from command-line flags), and the records they take:
random input streams of every form with malformed messages among them, delayed labels, batch cuts."""

from __future__ import annotations

import json
import random

from perceptron_stream.config import ServeSettings, load
from perceptron_stream.kafka.contract import Record, RecordLimits
from perceptron_stream.pipeline.mixer import MixBoard
from perceptron_stream.runtime.factory import TaskFactory, model_meta
from perceptron_stream.state.checkpoint import GROUP_TASK, Owner

NAMES = ["age", "salary", "debt", "years", "score"]


class Sent(list):
    """A ``send`` keeping (topic, key, value) in order, the value's bytes as they were."""

    def __call__(self, topic, key, value):
        self.append((topic, key, value))


def make_task(tmp_path, flags: list[str], tag: str, limits: RecordLimits | None = None):
    """A fresh task of the factory made from ``flags`` (its state in ``tmp_path / tag``; ``limits``, its topics'
    record limits), and the factory."""
    s = load(
        ServeSettings,
        ["--metrics-port", "0", "--state-dir", str(tmp_path / tag), "--max-message-bytes", "1024", *flags],
    )
    owner = Owner(s.group_id, s.input_topic, GROUP_TASK, "cluster", "topic-id")
    board = MixBoard(owner, model_meta(s), 1) if s.model_scope == "partition" else None
    factory = TaskFactory(s, owner, board=board, limits=limits)
    task = factory.new_task(0 if s.model_scope == "partition" else None)
    task.fresh()
    return factory, task


def _value(rng: random.Random):
    return rng.choice([0.0, -0.0, 1.0, -2.0, 3, 1e-300, 7.5e5, rng.uniform(-1, 1), rng.uniform(-50, 50)])


def _message(rng: random.Random, form: str, d: int, ids: list) -> bytes | None:
    """One input message: mostly a valid event of the stream's form, sometimes one a rule rejects."""
    event: dict = {}
    if rng.random() < 0.8:
        event["id"] = rng.choice(ids)
    if form == "dense" or (form == "mixed" and rng.random() < 0.5):
        event["x"] = [_value(rng) for _ in range(d)]
    else:
        names = NAMES[:d] if form == "named" else rng.sample(NAMES, rng.randint(1, len(NAMES)))
        event["features"] = {name: _value(rng) for name in names}
    if rng.random() < 0.85:
        event["y"] = rng.choice([1, -1, 1, -1, 0, True, False, None])
    bad = rng.random()
    if bad < 0.03:
        return None  # a tombstone
    if bad < 0.06:
        return b'{"x": [1.0'  # not JSON
    if bad < 0.09:
        event["y"] = 2
    elif bad < 0.11:
        event["x"] = [1.0] * (d + 1)  # another dimension (or both x and features)
    elif bad < 0.13:
        event["id"] = rng.choice([2**70, 2**63])  # an id no prediction can carry; one the model's way takes
    elif bad < 0.15:
        event["extra"] = "x" * rng.choice([3, 1100])  # an unknown key (and too long for --max-message-bytes 1024)
    return json.dumps(event).encode()


def stream_records(seed: int, n: int, form: str, d: int, topic: str = "points") -> list[Record]:
    rng = random.Random(seed)
    ids = [f"p{i}" for i in range(n)] + [7, None, "p0"]
    out = []
    for offset in range(n):
        value = _message(rng, form, d, ids)
        key = None if rng.random() < 0.2 else f"k{offset % 7}".encode()
        out.append(Record(topic, 0, offset, key, value, 1_700_000_000_000 + 10 * offset))
    return out


def label_records(seed: int, n: int) -> list[Record]:
    """Labels for the points of :func:`_stream`: some before their point comes, some after, some twice, some for
    no point, a few malformed (dead letters all of those)."""
    rng = random.Random(seed + 1)
    out = []
    for offset in range(n):
        i = rng.randrange(n + 3)
        value = json.dumps({"id": f"p{i}", "y": rng.choice([1, -1, 0, True])}).encode()
        if rng.random() < 0.05:
            value = rng.choice([b"{", b'{"id": "p1", "y": 5}', b'{"y": 1}'])
        out.append(Record("labels", 0, offset, f"p{i}".encode(), value, 1_700_000_000_000 + 10 * i))
    return out


def cut(records: list, sizes: list[int]) -> list[list]:
    batches, i = [], 0
    for size in sizes:
        if i < len(records):
            batches.append(records[i : i + size])
            i += size
    if i < len(records):
        batches.append(records[i:])
    return batches
