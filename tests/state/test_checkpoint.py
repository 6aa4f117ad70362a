"""The checkpoint document and both stores, without a broker.

The Kafka store is exercised over an in-memory stand-in for its compacted
topic (put / read_latest / close); the real topic is covered by the integration
tests (tests/integration/test_state.py, test_crash.py).
"""

from __future__ import annotations

import ast
import json
import logging
import os
import signal
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from perceptron_stream.learning import learner_from_state, make_learner
from perceptron_stream.state.checkpoint import (
    Checkpoint,
    CheckpointError,
    ForeignStateError,
    KeyPolicyError,
    Owner,
    SignatureError,
    behind,
    decode_checkpoint,
    encode_checkpoint,
)
from perceptron_stream.state.kafka_store import CheckpointTooLargeError, KafkaStore
from perceptron_stream.state.local import LocalStore, StateLockedError
from perceptron_stream.streams import separable

from tests.support import ROOT
from tests.support.checkpoints import resealed

OWNER = Owner("g", "points", cluster_id="cluster-1", topic_id="topic-1")


def _seq(store: LocalStore | KafkaStore) -> int:
    """The seq of the checkpoint of OWNER's model that ``store`` restores (one must be there)."""
    cp = store.load("model", OWNER)
    assert cp is not None, "no usable checkpoint"
    return cp.seq


def _checkpoint(seq: int = 1, variant: str = "plain", standardize: bool = False, events: int = 200) -> Checkpoint:
    learner = make_learner(variant, 0.1 if variant == "margin" else 0.0, standardize)
    for e, _ in zip(separable(dimensions=4, noise=0.1, seed=seq), range(events)):
        learner.step(e["x"], e["y"])
    return Checkpoint(
        seq=seq,
        positions={("points", 0): 100 * seq, ("points", 1): 7 * seq},
        model=learner.to_state(),
        dimension=4,
        meta={"variant": variant, "standardize": standardize},
        created=1_700_000_000.5 + seq,
        owner=OWNER,
    )


# the document ---------------------------------------------------------------
@pytest.mark.parametrize("variant", ["plain", "averaged", "pocket", "margin"])
@pytest.mark.parametrize("standardize", [False, True])
def test_round_trip_is_exact_for_every_model(variant, standardize):
    cp = _checkpoint(3, variant, standardize)
    again = decode_checkpoint(encode_checkpoint(cp))
    assert again == cp
    assert learner_from_state(again.model).to_state() == cp.model  # the learner rebuilt bit for bit


@given(
    st.dictionaries(
        st.tuples(st.text(min_size=1, max_size=20), st.integers(0, 1000)), st.integers(0, 2**62), max_size=8
    ),
    st.integers(0, 2**62),
    st.one_of(st.none(), st.integers(1, 10_000)),
    st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=20),
)
def test_round_trip_of_any_positions_and_floats(positions, seq, dimension, weights):
    cp = Checkpoint(
        seq=seq, positions=positions, model={"weights": weights}, dimension=dimension, meta={"v": "plain"}, owner=OWNER
    )
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


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "not valid JSON"),
        (b"\xff\xfe{}", "not valid JSON"),
        (b"[1, 2]", "not a perceptron-stream checkpoint"),
        (b'{"kind": "something else"}', "not a perceptron-stream checkpoint"),
        (b'{"kind": "perceptron-stream.checkpoint", "format": 99}', "format 99 is not supported"),
        (b'{"kind": "perceptron-stream.checkpoint", "format": 1}', "checksum does not match"),
        (b'{"kind": "perceptron-stream.checkpoint", "format": 2}', "checksum does not match"),
    ],
)
def test_what_is_not_a_checkpoint_is_refused_with_a_reason(data, message):
    with pytest.raises(CheckpointError, match=message):
        decode_checkpoint(data)


def test_a_checksummed_document_with_a_missing_field_is_refused():
    body = json.loads(encode_checkpoint(_checkpoint()))
    del body["positions"]
    with pytest.raises(CheckpointError, match="missing or has a malformed field"):
        decode_checkpoint(resealed(body))


# hostile documents ----------------------------------------------------------
GARBAGE = [
    b"[" * 100_000,  # deeper than any parser should recurse
    b"{" * 100_000,
    b'{"a":' * 50_000,
    b"\x00" * 1000,
    b"1e400",
    b'"' + b"\\" * 10_000,
]


@pytest.mark.parametrize("data", GARBAGE, ids=range(len(GARBAGE)))
def test_garbage_is_damage_never_a_crash(data):
    with pytest.raises(CheckpointError):
        decode_checkpoint(data)


def _valid_body() -> dict:
    return json.loads(encode_checkpoint(_checkpoint(events=5)))


@pytest.mark.parametrize(
    "field, value",
    [
        ("positions", [["points", "Infinity", 3]]),
        ("positions", [["points", 1e300, 3]]),
        ("positions", [["points", 0, -1]]),
        ("positions", [["points", 0, 2**63]]),
        ("positions", [["points", 0, 1], ["points", 0, 2]]),
        ("positions", {"points": 1}),
        ("meta", ["variant", "plain"]),
        ("model", "perceptron"),
        ("seq", -1),
        ("seq", 1.5),
        ("seq", True),
        ("created", None),
        ("dimension", 0),
        ("owner", ["g"]),
        ("owner", {"group_id": "g", "input_topic": "points", "task": 3}),
        ("owner", {"group_id": "", "input_topic": "points", "task": "model"}),
    ],
)
def test_a_well_sealed_document_with_a_field_of_the_wrong_shape_is_damage(field, value):
    body = _valid_body()
    body[field] = value
    with pytest.raises(CheckpointError, match="malformed field"):
        decode_checkpoint(resealed(body))


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(["seq", "created", "owner", "positions", "dimension", "meta", "model", "kind", "format"]), JSON)
def test_fuzz_any_value_in_any_field_of_a_sealed_checkpoint(field, value):
    """What a forger who can write the store (but has no key) can send: damage, or a checkpoint of sane types."""
    body = _valid_body()
    body[field] = value
    try:
        cp = decode_checkpoint(resealed(body))
    except CheckpointError:
        return
    assert type(cp.seq) is int and cp.seq >= 0 and isinstance(cp.meta, dict) and isinstance(cp.model, dict)
    assert all(
        type(t) is str and type(p) is int and type(o) is int and p >= 0 and o >= 0 for (t, p), o in cp.positions.items()
    )
    assert cp.owner is not None and all(
        isinstance(v, str) for v in (cp.owner.group_id, cp.owner.input_topic, cp.owner.task)
    )


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300) | JSON.map(lambda v: json.dumps(v).encode()))
def test_fuzz_any_bytes_are_damage_or_a_checkpoint(data):
    try:
        decode_checkpoint(data)
    except CheckpointError:
        pass


# whose it is ------------------------------------------------------------------
KEY = b"a-secret-of-32-bytes-for-tests!!"


def test_with_a_key_only_checkpoints_signed_with_it_are_read():
    cp = _checkpoint()
    assert decode_checkpoint(encode_checkpoint(cp, KEY), KEY) == cp
    assert decode_checkpoint(encode_checkpoint(cp, KEY)) == cp  # without a key, the signature is not checked
    with pytest.raises(CheckpointError, match="not signed"):
        decode_checkpoint(encode_checkpoint(cp), KEY)
    with pytest.raises(CheckpointError, match="signature does not match"):
        decode_checkpoint(encode_checkpoint(cp, b"another key, also long enough"), KEY)
    forged = _valid_body()
    forged["model"]["weights"] = [-1000.0] * len(forged["model"]["weights"])
    with pytest.raises(CheckpointError, match="signature does not match"):  # resealed with a checksum, not the key
        decode_checkpoint(resealed(forged, b"the forger's own key, guessed"), KEY)


def test_a_signature_that_fails_says_whether_it_is_missing_and_the_seq_it_claims():
    cp = _checkpoint(seq=9)
    assert decode_checkpoint(encode_checkpoint(cp, KEY)).signed  # a reader without the key still sees it is signed
    assert not decode_checkpoint(encode_checkpoint(cp)).signed
    with pytest.raises(SignatureError) as unsigned:
        decode_checkpoint(encode_checkpoint(cp), KEY)
    assert (unsigned.value.unsigned, unsigned.value.seq) == (True, 9)
    with pytest.raises(SignatureError) as other:
        decode_checkpoint(encode_checkpoint(cp, b"another key, also long enough"), KEY)
    assert (other.value.unsigned, other.value.seq) == (False, 9)


@pytest.mark.parametrize("store_kind", ["local", "kafka"])
def test_a_store_whose_checkpoints_all_fail_the_key_is_a_key_policy_not_damage(tmp_path, store_kind):
    """Every checkpoint unsigned (the group runs without a key): KeyPolicyError with the highest seq claimed, for a
    new model to supersede; one signed checkpoint among them is restored; damage among them is damage."""
    store = LocalStore(tmp_path, "g") if store_kind == "local" else KafkaStore(MemoryTopic(), "g")
    for seq in (4, 5, 6):
        store.save(_checkpoint(seq))
    store.key = KEY
    with pytest.raises(KeyPolicyError, match="passes the --checkpoint-key check") as info:
        store.load("model", OWNER)
    assert (info.value.highest_seq, info.value.unsigned) == (6, True)
    store.save(_checkpoint(7))  # signed with KEY: the newest signed one is restored, the unsigned ones skipped
    assert _seq(store) == 7
    newest = store.load("model", OWNER)
    # local: the unsigned files are older, nothing skipped; kafka: slots hold unsigned 5 and 6, read first (a damaged
    # record's seq is unknown: any may have been the newest)
    assert newest is not None and len(newest.fell_back_from) == (0 if store_kind == "local" else 2)
    store.key = None
    store.save(_checkpoint(8))  # unsigned: skipped, and the one restored says it is a fallback (restorer's stale check)
    store.key = KEY
    fallback = store.load("model", OWNER)
    assert (
        fallback is not None
        and fallback.seq == 7
        and len(fallback.fell_back_from) == (1 if store_kind == "local" else 2)
    )
    assert "not signed" in fallback.fell_back_from[0]


def _junk_slot(store: LocalStore | KafkaStore, seq: int, value: bytes) -> None:
    """``value`` where checkpoint ``seq`` of OWNER's model goes: its file, or its slot's record."""
    if isinstance(store, LocalStore):
        path = store.task_dir("model")
        path.mkdir(parents=True, exist_ok=True)
        (path / f"checkpoint-{seq:012d}.json").write_bytes(value)
    else:
        store.topic.put(store.slot_keys("model")[seq % store.keep], value)


@pytest.mark.parametrize("store_kind", ["local", "kafka"])
def test_with_a_key_only_a_refused_signed_newer_checkpoint_makes_the_restored_one_a_fallback(tmp_path, store_kind):
    """Measured on 3125c7b: an old signed checkpoint beside one junk record came back as the fallback from a newer
    one (``fell_back_from``), which the restorer's stale check let through with a WARNING (issue 35's replay)."""
    store = LocalStore(tmp_path, "g") if store_kind == "local" else KafkaStore(MemoryTopic(), "g")
    store.key = KEY
    store.save(_checkpoint(3))
    _junk_slot(store, 4, b"junk, not a checkpoint")
    old = store.load("model", OWNER)
    assert old is not None and old.seq == 3 and len(old.fell_back_from) == 1 and old.newer_skipped == ()
    _junk_slot(store, 4, encode_checkpoint(_checkpoint(4)))  # unsigned, claiming a higher seq
    old = store.load("model", OWNER)
    assert old is not None and old.seq == 3 and "not signed" in old.fell_back_from[0] and old.newer_skipped == ()
    store.save(_checkpoint(4))  # signed and newer, but this version cannot use it: a genuine fallback
    fallback = store.load("model", OWNER, accept=lambda cp: cp.seq < 4 or _raise(CheckpointError("other settings")))
    assert fallback is not None and fallback.seq == 3 and fallback.newer_skipped == fallback.fell_back_from
    assert "other settings" in fallback.newer_skipped[0]


def _raise(exc: Exception):
    raise exc


@pytest.mark.parametrize("store_kind", ["local", "kafka"])
def test_without_a_key_a_damaged_record_skipped_may_have_been_the_newest(tmp_path, store_kind):
    """Nothing is vouched for without a key: a damaged record skipped counts as a newer checkpoint lost (the local
    store's files come newest first by name; a damaged Kafka record says no seq), the documented fallback."""
    store = LocalStore(tmp_path, "g") if store_kind == "local" else KafkaStore(MemoryTopic(), "g")
    store.save(_checkpoint(3))
    _junk_slot(store, 4, b"junk")
    restored = store.load("model", OWNER)
    assert restored is not None and restored.seq == 3 and restored.newer_skipped == restored.fell_back_from
    assert len(restored.newer_skipped) == 1 and "not valid JSON" in restored.newer_skipped[0]


def test_behind_names_each_position_before_the_committed_offset():
    positions = {("points", 0): 40, ("points", 1): 7, ("labels", 0): 3}
    assert behind(positions, {("points", 0): 40, ("points", 1): 7}) == []  # at them: the normal case
    assert behind(positions, {("points", 0): 39, ("points", 2): 500}) == []  # ahead, or a partition it never read
    assert behind(positions, {("points", 0): 200, ("labels", 0): 4}) == [
        "labels partition 0 at offset 3, the group committed 4",
        "points partition 0 at offset 40, the group committed 200",
    ]


@pytest.mark.parametrize(
    "other, phrase",
    [
        (Owner("g2", "points", cluster_id="cluster-1", topic_id="topic-1"), "consumer group 'g2', not 'g'"),
        (Owner("g", "events", cluster_id="cluster-1", topic_id="topic-1"), "input topic 'events', not 'points'"),
        (
            Owner("g", "points", cluster_id="cluster-2", topic_id="topic-1"),
            "cluster's id is cluster-2, this one's is cluster-1",
        ),
        (Owner("g", "points", cluster_id="cluster-1", topic_id="topic-0"), "had id topic-0 and now has id topic-1"),
    ],
)
def test_another_models_checkpoints_are_never_used(tmp_path, other, phrase):
    store = LocalStore(tmp_path, "g")
    store.save(Checkpoint(seq=7, positions={("points", 0): 5}, model={}, owner=other))
    with pytest.raises(ForeignStateError, match=phrase) as info:
        store.load("model", OWNER)
    assert info.value.highest_seq == 7
    store.save(_checkpoint(1))  # an older one of this model: used, the other one skipped
    assert _seq(store) == 1


# the local store --------------------------------------------------------------
def test_local_round_trip_and_keep_the_last_three(tmp_path):
    store = LocalStore(tmp_path / "state", "g")
    assert store.load("model", OWNER) is None  # nothing yet: a new model
    saved = [_checkpoint(seq) for seq in range(1, 7)]
    for cp in saved:
        store.save(cp)
        assert store.load("model", OWNER) == cp
    assert [p.name for p in store.files("model")] == [f"checkpoint-{n:012d}.json" for n in (6, 5, 4)]
    assert store.files("model")[0].parent == tmp_path / "state" / "g" / "model"
    assert not list((tmp_path / "state").rglob("*.tmp"))


def test_groups_sharing_a_state_dir_never_read_each_other(tmp_path):
    a, b = LocalStore(tmp_path, "a"), LocalStore(tmp_path, "a/../b")
    a.save(_checkpoint(1))
    assert b.load("model", Owner("a/../b", "points")) is None
    assert b.directory.parent == tmp_path and b.directory.name == "a%2F..%2Fb"


def test_local_falls_back_to_the_newest_good_checkpoint(tmp_path, caplog):
    store = LocalStore(tmp_path, "g")
    for seq in (1, 2, 3):
        store.save(_checkpoint(seq))
    newest, middle, _oldest = store.files("model")
    newest.write_bytes(newest.read_bytes()[:100])  # cut short
    assert _seq(store) == 2
    assert (
        f"checkpoint {newest.name} in {newest.parent} is unusable" in caplog.text
        and "truncated or corrupt" in caplog.text
    )
    middle.unlink()
    middle.mkdir()  # unreadable: an OSError, not a crash
    assert _seq(store) == 1
    assert "restored checkpoint checkpoint-000000000001.json" in caplog.text
    # each skipped one said once, in the WARNING of the one restored: no ERROR of its own before it
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def test_symlinks_and_fifos_are_refused_without_being_opened(tmp_path, caplog):
    store = LocalStore(tmp_path, "g")
    store.save(_checkpoint(1))
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(encode_checkpoint(_checkpoint(3)))
    (store.task_dir("model") / "checkpoint-000000000003.json").symlink_to(elsewhere)
    os.mkfifo(store.task_dir("model") / "checkpoint-000000000002.json")  # opened blocking, this would hang forever
    loaded: list[Checkpoint | None] = []
    import threading

    reader = threading.Thread(target=lambda: loaded.append(store.load("model", OWNER)), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "reading the state directory hung on a FIFO"
    assert [cp.seq if cp else None for cp in loaded] == [1]
    assert "symbolic link, refused" in caplog.text and "not a regular file" in caplog.text
    # a write never goes through a planted symlink either: the link is replaced, its target untouched
    target = tmp_path / "target"
    target.write_text("keep me")
    (store.task_dir("model") / "checkpoint-000000000004.tmp").symlink_to(target)
    store.save(_checkpoint(4))
    assert target.read_text() == "keep me" and _seq(store) == 4


def test_a_lock_file_that_is_not_a_regular_file_is_refused(tmp_path):
    store = LocalStore(tmp_path, "g")
    store.task_dir("model").mkdir(parents=True)
    os.mkfifo(store.task_dir("model") / "LOCK")
    with pytest.raises(StateLockedError, match="must be a regular file"):
        store.lock("model")


def test_version_0_1_checkpoints_are_found_and_moved_under_their_group(tmp_path):
    legacy = Checkpoint(seq=4, positions={("points", 0): 40}, model={}, meta={"variant": "plain"}, created=1.0)
    body = {
        "kind": "perceptron-stream.checkpoint",
        "format": 1,
        "seq": 4,
        "created": 1.0,
        "positions": [["points", 0, 40]],
        "dimension": None,
        "meta": {"variant": "plain"},
        "model": {},
    }
    import hashlib

    body["sha256"] = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    (tmp_path / "checkpoint-000000000004.json").write_text(json.dumps(body))
    store = LocalStore(tmp_path, "g")
    assert store.load("model", OWNER) is None  # not without asking for them
    assert store.load("model", OWNER, legacy=True) == legacy  # owner None: the caller must vouch for it
    store.adopt_legacy("model")
    assert [p.name for p in store.files("model")] == ["checkpoint-000000000004.json"] and not store.legacy_files()


def test_local_refuses_to_start_from_zero_when_every_checkpoint_is_damaged(tmp_path):
    store = LocalStore(tmp_path, "g")
    for seq in (1, 2):
        store.save(_checkpoint(seq))
    for path in store.files("model"):
        path.write_bytes(b"")
    with pytest.raises(CheckpointError) as info:
        store.load("model", OWNER)
    message = str(info.value)
    assert (
        f"no usable checkpoint in {store.task_dir('model')}" in message
        and "move them away to start from zero weights" in message
    )
    assert "checkpoint-000000000002.json" in message and "checkpoint-000000000001.json" in message


def test_a_write_cut_short_leaves_the_previous_checkpoints_whole(tmp_path, monkeypatch):
    store = LocalStore(tmp_path, "g")
    store.save(_checkpoint(1))

    def fail(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError):
        store.save(_checkpoint(2))
    monkeypatch.undo()
    assert [p.name for p in store.files("model")] == ["checkpoint-000000000001.json"]  # the temp file is never read
    assert store.load("model", OWNER) == _checkpoint(1)
    store.save(_checkpoint(2))  # the leftover temp file is simply replaced
    assert store.load("model", OWNER) == _checkpoint(2)


def test_the_lock_keeps_a_second_instance_out_and_dies_with_its_holder(tmp_path):
    first = LocalStore(tmp_path, "g")
    first.lock("model")
    directory = first.task_dir("model")
    with pytest.raises(StateLockedError, match=f"state directory {directory} is in use by pid {os.getpid()}") as locked:
        LocalStore(tmp_path, "g").lock("model")
    # the way out that works: another model is another --group-id (another --state-dir alone finds the group's
    # committed offsets and no checkpoint: the lost-state error)
    assert "run another model with another --group-id" in str(locked.value)
    LocalStore(tmp_path, "other-group").lock("model")  # another model's lock is another lock
    first.close()
    again = LocalStore(tmp_path, "g")
    again.lock("model")  # released on close
    again.close()

    # a holder killed with SIGKILL leaves its LOCK file behind, but no lock
    code = (
        f"from perceptron_stream.state.local import LocalStore; LocalStore({str(tmp_path)!r}, 'g').lock('model'); "
        "print('locked', flush=True); import time; time.sleep(60)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, cwd=ROOT)
    assert holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == b"locked"
        with pytest.raises(StateLockedError, match=f"in use by pid {holder.pid}"):
            LocalStore(tmp_path, "g").lock("model")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    after_crash = LocalStore(tmp_path, "g")
    after_crash.lock("model")
    assert (directory / "LOCK").read_text() == str(os.getpid())
    after_crash.close()


# the kafka store --------------------------------------------------------------
class MemoryTopic:
    """What KafkaStore uses of CompactedTopic, in memory: an append-only log of (key, value)."""

    topic = "checkpoints"

    def __init__(self):
        self.records: list[tuple[bytes | None, bytes | None]] = []
        self.closed = False
        self.asked: list[set] = []

    def put(self, key: bytes, value: bytes | None, timeout_s: float = 10.0) -> None:  # None: a tombstone
        self.records.append((key, value))

    def read_latest(self, wanted: set, timeout_s: float = 30.0):
        self.asked.append(set(wanted))
        return {k: v for k, v in self.records if k in wanted}

    def close(self) -> None:
        self.closed = True


def test_kafka_store_round_trip_in_slots(tmp_path):
    topic = MemoryTopic()
    store = KafkaStore(topic, "g")
    assert store.load("model", OWNER) is None
    for seq in range(1, 8):
        cp = _checkpoint(seq)
        store.save(cp)
        assert store.load("model", OWNER) == cp
    assert {k for k, _ in topic.records} == {b"g/0", b"g/1", b"g/2"}  # compaction keeps the last three
    assert topic.asked[-1] == {b"g/0", b"g/1", b"g/2"}  # only the slots it writes are read
    assert store.slot_keys("partition-3") == [b"g/partition-3/0", b"g/partition-3/1", b"g/partition-3/2"]
    store.close()
    assert topic.closed


def test_kafka_store_falls_back_and_reads_only_its_slots(caplog):
    topic = MemoryTopic()
    mine, other = KafkaStore(topic, "g"), KafkaStore(topic, "g2")
    for seq in (1, 2, 3):
        mine.save(_checkpoint(seq))
    other.save(_checkpoint(50))
    topic.put(b"g/7", encode_checkpoint(_checkpoint(99)))  # a slot the service never writes: compaction never drops it
    assert _seq(mine) == 3
    topic.put(b"g/0", encode_checkpoint(_checkpoint(3))[:-20])  # the newest (seq 3, slot 0), damaged
    assert _seq(mine) == 2
    assert "checkpoint g/0 in topic checkpoints is unusable" in caplog.text
    topic.put(b"g/2", None)  # a tombstone over seq 2
    assert _seq(mine) == 1
    topic.put(b"g/1", b"garbage")
    with pytest.raises(CheckpointError, match="no usable checkpoint in topic checkpoints"):
        mine.load("model", OWNER)
    assert _seq(other) == 50  # under g2's keys, but its owner is group g: read by g2's store


def test_kafka_store_with_a_key_refuses_a_forged_newest_and_falls_back():
    topic = MemoryTopic()
    store = KafkaStore(topic, "g")
    store.key = KEY
    store.save(_checkpoint(1))
    forged = _valid_body()
    forged["seq"] = 10**9
    topic.put(b"g/2", resealed(forged))
    assert _seq(store) == 1


def test_a_checkpoint_too_large_for_a_record_names_the_cause():
    topic = MemoryTopic()
    store = KafkaStore(topic, "g")
    names = [f"feature-number-{i:08d}" for i in range(600_000)]
    model = {"kind": "perceptron", "features": names, "weights": [0.123456789] * len(names)}
    with pytest.raises(CheckpointTooLargeError, match=r"600,000 features.*--max-model-features"):
        store.save(Checkpoint(seq=1, positions={}, model=model, owner=OWNER))
    assert not topic.records


# no code from data ---------------------------------------------------------
UNSAFE = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle", "joblib", "jsonpickle"}


def test_no_module_of_the_service_can_unpickle():
    """A store that unpickles what it reads lets anyone who can write to it run code (docs: how-to/security.md)."""
    found = []
    for path in sorted((ROOT / "service").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom, ast.Call)):
                continue
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("__import__", "eval", "exec")
            ):
                names = [node.func.id]
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno} {n}"
                for n in names
                if n.split(".")[0] in UNSAFE or n in ("__import__", "eval", "exec")
            ]
    assert not found, found


def test_checkpoints_are_plain_json_data(tmp_path):
    store = LocalStore(tmp_path, "g")
    store.save(_checkpoint(1, "pocket", True))
    body = json.loads(store.files("model")[0].read_bytes())

    def plain(value):
        if isinstance(value, dict):
            return all(isinstance(k, str) and plain(v) for k, v in value.items())
        if isinstance(value, list):
            return all(plain(v) for v in value)
        return value is None or isinstance(value, (bool, int, float, str))

    assert plain(body) and body["kind"] == "perceptron-stream.checkpoint"


def test_each_checkpoint_skipped_is_told_with_its_reason():
    """perceptron_rejected_state_total{kind="checkpoint"} counts each one skipped at a restore, by reason: too long
    (refused before it is parsed), another model's, a model beyond the bounds (the Restorer's accept says
    non_finite), damaged; the one restored and those older than it are not counted."""
    from perceptron_stream.state.checkpoint import MAX_CHECKPOINT_BYTES, newest_usable, reason_of, refused

    def accept(cp: Checkpoint) -> None:
        if cp.seq == 3:
            raise refused("it holds a model this version cannot read: weights beyond 1e150", "non_finite")

    too_long = CheckpointError("unreached")
    try:
        decode_checkpoint(b" " * (MAX_CHECKPOINT_BYTES + 1))
    except CheckpointError as exc:
        too_long = exc
    foreign = _checkpoint(4)
    foreign = Checkpoint(**{**foreign.__dict__, "owner": Owner("other", "points")})
    reasons: list[str] = []
    candidates: list[tuple[str, Checkpoint | CheckpointError]] = [
        ("5", too_long),
        ("4", foreign),
        ("3", _checkpoint(3)),
        ("2x", CheckpointError("the checkpoint is not valid JSON")),
        ("1", _checkpoint(1)),
        ("0", CheckpointError("older than the one restored: never looked at")),
    ]
    restored = newest_usable(candidates, accept, "here", OWNER, reasons.append)
    assert restored is not None and restored.seq == 1
    assert reasons == ["too_large", "foreign", "non_finite", "damaged"], reasons
    assert reason_of(too_long) == "too_large"


def test_a_store_tells_its_refusals(tmp_path):
    """The stores pass their ``on_reject`` (set at start-up to the metric) to every load."""
    store = LocalStore(tmp_path, "g")
    reasons: list[str] = []
    store.on_reject = reasons.append
    for seq in (1, 2):
        store.save(_checkpoint(seq))
    newest = store.files("model")[0]
    newest.write_bytes(newest.read_bytes()[:100])
    assert _seq(store) == 1 and reasons == ["damaged"]
