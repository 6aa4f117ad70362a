"""The checkpoint document and both stores, without a broker.

The Kafka store is exercised over an in-memory stand-in for its compacted
topic (put / read_latest / close); the real topic is covered by the integration
tests (tests/integration/test_state.py, test_crash.py).
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.learning import learner_from_state, make_learner
from service.state.checkpoint import Checkpoint, CheckpointError, decode_checkpoint, encode_checkpoint
from service.state.kafka_store import KafkaStore
from service.state.local import LocalStore, StateLockedError
from service.streams import separable

ROOT = Path(__file__).resolve().parent.parent


def _checkpoint(seq: int = 1, variant: str = "plain", standardize: bool = False, events: int = 200) -> Checkpoint:
    learner = make_learner(variant, 0.1 if variant == "margin" else 0.0, standardize)
    for e, _ in zip(separable(dimensions=4, noise=0.1, seed=seq), range(events)):
        learner.step(e["x"], e["y"])
    return Checkpoint(seq=seq, positions={("points", 0): 100 * seq, ("points", 1): 7 * seq}, model=learner.to_state(),
                      dimension=4, meta={"variant": variant, "standardize": standardize}, created=1_700_000_000.5 + seq)


# the document ---------------------------------------------------------------
@pytest.mark.parametrize("variant", ["plain", "averaged", "pocket", "margin"])
@pytest.mark.parametrize("standardize", [False, True])
def test_round_trip_is_exact_for_every_model(variant, standardize):
    cp = _checkpoint(3, variant, standardize)
    again = decode_checkpoint(encode_checkpoint(cp))
    assert again == cp
    assert learner_from_state(again.model).to_state() == cp.model  # the learner rebuilt bit for bit


@given(st.dictionaries(st.tuples(st.text(min_size=1, max_size=20), st.integers(0, 1000)), st.integers(0, 2**62), max_size=8),
       st.integers(0, 2**62), st.one_of(st.none(), st.integers(1, 10_000)),
       st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=20))
def test_round_trip_of_any_positions_and_floats(positions, seq, dimension, weights):
    cp = Checkpoint(seq=seq, positions=positions, model={"weights": weights}, dimension=dimension, meta={"v": "plain"})
    assert decode_checkpoint(encode_checkpoint(cp)) == cp


def test_every_truncation_is_refused():
    data = encode_checkpoint(_checkpoint(events=20))
    for n in range(len(data)):
        with pytest.raises(CheckpointError):
            decode_checkpoint(data[:n])


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_damaged_byte_is_refused_or_changes_nothing(data):
    """Any single byte changed: a CheckpointError, or (e.g. 1e-05 → 1E-05) the very same checkpoint."""
    cp = _checkpoint(events=20)
    raw = bytearray(encode_checkpoint(cp))
    i = data.draw(st.integers(0, len(raw) - 1))
    raw[i] = data.draw(st.integers(0, 255).filter(lambda b: b != raw[i]))
    try:
        again = decode_checkpoint(bytes(raw))
    except CheckpointError:
        return
    assert again == cp


@pytest.mark.parametrize("data, message", [
    (b"", "not valid JSON"),
    (b"\xff\xfe{}", "not valid JSON"),
    (b"[1, 2]", "not a perceptron-stream checkpoint"),
    (b'{"kind": "something else"}', "not a perceptron-stream checkpoint"),
    (b'{"kind": "perceptron-stream.checkpoint", "format": 99}', "format 99 is not supported"),
    (b'{"kind": "perceptron-stream.checkpoint", "format": 1}', "checksum does not match"),
])
def test_what_is_not_a_checkpoint_is_refused_with_a_reason(data, message):
    with pytest.raises(CheckpointError, match=message):
        decode_checkpoint(data)


def test_a_checksummed_document_with_a_missing_field_is_refused():
    body = json.loads(encode_checkpoint(_checkpoint()))
    del body["sha256"], body["positions"]
    from service.state.checkpoint import _digest

    body["sha256"] = _digest(body)
    with pytest.raises(CheckpointError, match="missing or has a malformed field"):
        decode_checkpoint(json.dumps(body).encode())


# the local store --------------------------------------------------------------
def test_local_round_trip_and_keep_the_last_three(tmp_path):
    store = LocalStore(tmp_path / "state")
    assert store.load() is None  # nothing yet: a new model
    saved = [_checkpoint(seq) for seq in range(1, 7)]
    for cp in saved:
        store.save(cp)
        assert store.load() == cp
    assert [p.name for p in store.files()] == [f"checkpoint-{n:012d}.json" for n in (6, 5, 4)]
    assert not list((tmp_path / "state").glob("*.tmp"))


def test_local_falls_back_to_the_newest_good_checkpoint(tmp_path, caplog):
    store = LocalStore(tmp_path)
    for seq in (1, 2, 3):
        store.save(_checkpoint(seq))
    newest, middle, oldest = store.files()
    newest.write_bytes(newest.read_bytes()[:100])  # cut short
    assert store.load().seq == 2
    assert f"checkpoint {newest.name} in {newest.parent} is unusable" in caplog.text and "truncated or corrupt" in caplog.text
    middle.unlink()
    middle.mkdir()  # unreadable: an OSError, not a crash
    assert store.load().seq == 1
    assert "restored checkpoint checkpoint-000000000001.json" in caplog.text


def test_local_refuses_to_start_from_zero_when_every_checkpoint_is_damaged(tmp_path):
    store = LocalStore(tmp_path)
    for seq in (1, 2):
        store.save(_checkpoint(seq))
    for path in store.files():
        path.write_bytes(b"")
    with pytest.raises(CheckpointError) as info:
        store.load()
    message = str(info.value)
    assert f"no usable checkpoint in {tmp_path}" in message and "move them away to start from zero weights" in message
    assert "checkpoint-000000000002.json" in message and "checkpoint-000000000001.json" in message


def test_a_write_cut_short_leaves_the_previous_checkpoints_whole(tmp_path, monkeypatch):
    store = LocalStore(tmp_path)
    store.save(_checkpoint(1))

    def fail(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError):
        store.save(_checkpoint(2))
    monkeypatch.undo()
    assert [p.name for p in store.files()] == ["checkpoint-000000000001.json"]  # the temp file is never read
    assert store.load() == _checkpoint(1)
    store.save(_checkpoint(2))  # the leftover temp file is simply replaced
    assert store.load() == _checkpoint(2)


def test_the_lock_keeps_a_second_instance_out_and_dies_with_its_holder(tmp_path):
    first = LocalStore(tmp_path)
    first.lock()
    with pytest.raises(StateLockedError, match=f"state directory {tmp_path} is in use by pid {os.getpid()}"):
        LocalStore(tmp_path).lock()
    first.close()
    again = LocalStore(tmp_path)
    again.lock()  # released on close
    again.close()

    # a holder killed with SIGKILL leaves its LOCK file behind, but no lock
    code = f"from service.state.local import LocalStore; LocalStore({str(tmp_path)!r}).lock(); print('locked', flush=True); import time; time.sleep(60)"
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == b"locked"
        with pytest.raises(StateLockedError, match=f"in use by pid {holder.pid}"):
            LocalStore(tmp_path).lock()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    after_crash = LocalStore(tmp_path)
    after_crash.lock()
    assert (tmp_path / "LOCK").read_text() == str(os.getpid())
    after_crash.close()


# the kafka store --------------------------------------------------------------
class MemoryTopic:
    """What KafkaStore uses of CompactedTopic, in memory: an append-only log of (key, value)."""

    topic = "checkpoints"

    def __init__(self):
        self.records: list[tuple[bytes | None, bytes | None]] = []
        self.closed = False

    def put(self, key: bytes, value: bytes, timeout_s: float = 10.0) -> None:
        self.records.append((key, value))

    def read_latest(self, wanted, timeout_s: float = 30.0):
        return {k: v for k, v in self.records if k is not None and wanted(k)}

    def close(self) -> None:
        self.closed = True


def test_kafka_store_round_trip_in_slots(tmp_path):
    topic = MemoryTopic()
    store = KafkaStore(topic, "g")
    assert store.load() is None
    for seq in range(1, 8):
        cp = _checkpoint(seq)
        store.save(cp)
        assert store.load() == cp
    assert {k for k, _ in topic.records} == {b"g/0", b"g/1", b"g/2"}  # compaction keeps the last three
    store.close()
    assert topic.closed


def test_kafka_store_falls_back_and_ignores_other_groups(caplog):
    topic = MemoryTopic()
    mine, other, nested = KafkaStore(topic, "g"), KafkaStore(topic, "g2"), KafkaStore(topic, "g/1")
    for seq in (1, 2, 3):
        mine.save(_checkpoint(seq))
    other.save(_checkpoint(50))
    nested.save(_checkpoint(60))  # key "g/1/0": not one of group g's slots
    assert mine.load().seq == 3
    topic.put(b"g/0", encode_checkpoint(_checkpoint(3))[:-20])  # the newest (seq 3, slot 0), damaged
    assert mine.load().seq == 2
    assert "checkpoint g/0 in topic checkpoints is unusable" in caplog.text
    topic.put(b"g/2", None)  # a tombstone over seq 2
    assert mine.load().seq == 1
    topic.put(b"g/1", b"garbage")
    with pytest.raises(CheckpointError, match="no usable checkpoint in topic checkpoints"):
        mine.load()
    assert other.load().seq == 50 and nested.load().seq == 60


# no code from data ---------------------------------------------------------
UNSAFE = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "joblib", "jsonpickle"}


def test_no_module_of_the_service_can_unpickle():
    """A store that unpickles what it reads lets anyone who can write to it run code (DESIGN.md)."""
    found = []
    for path in sorted((ROOT / "service").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("__import__", "eval", "exec"):
                names = [node.func.id]
            found += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                      if n.split(".")[0] in UNSAFE or n in ("__import__", "eval", "exec")]
    assert not found, found


def test_checkpoints_are_plain_json_data(tmp_path):
    store = LocalStore(tmp_path)
    store.save(_checkpoint(1, "pocket", True))
    body = json.loads(store.files()[0].read_bytes())

    def plain(value):
        if isinstance(value, dict):
            return all(isinstance(k, str) and plain(v) for k, v in value.items())
        if isinstance(value, list):
            return all(plain(v) for v in value)
        return value is None or isinstance(value, (bool, int, float, str))

    assert plain(body) and body["kind"] == "perceptron-stream.checkpoint"

