"""The mix board's checks of a record read back from the mix topic (pure: records made here, no Kafka).

A record anyone who can write the topic may have made: its size is checked before it is parsed, its feature count
before its model is built, its mistake count against the events its replica could have learned, its numbers against
the bounds that keep a score finite; each refusal is counted under its reason and the record never reaches a mix.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from perceptron_stream.config import ServeSettings, load
from perceptron_stream.learning import make_learner
from perceptron_stream.pipeline.mixer import MixBoard, Mixer, mix_key
from perceptron_stream.pipeline.task import partition_task
from perceptron_stream.runtime.factory import model_meta
from perceptron_stream.state.checkpoint import GROUP_TASK, Checkpoint, Owner, decode_checkpoint, encode_checkpoint

EVERY, CAP = 10, 100
SETTINGS = load(
    ServeSettings,
    ["--model-scope", "partition", "--mix-every", str(EVERY), "--max-model-features", str(CAP), "--standardize"],
)
OWNER = Owner(SETTINGS.group_id, SETTINGS.input_topic, GROUP_TASK, "cluster", "topic-id")


def _board() -> tuple[MixBoard, list[str]]:
    reasons: list[str] = []
    return MixBoard(OWNER, model_meta(SETTINGS), 2, on_reject=reasons.append, every=EVERY), reasons


def _state(features: int = 3) -> dict:
    learner = make_learner(standardize=True, max_features=None)
    for i in range(4):
        learner.step({f"f{j}": float((i + j) % 3 - 1) for j in range(features)}, 1 if i % 2 else -1)
    return learner.to_state()


def _record(
    model: dict | None = None, mistakes: int = 3, learned: int = EVERY, partition: int = 1, epoch: int = 0
) -> bytes:
    owner = Owner(OWNER.group_id, OWNER.input_topic, partition_task(partition), OWNER.cluster_id, OWNER.topic_id)
    return encode_checkpoint(
        Checkpoint(
            seq=1,
            positions={(SETTINGS.input_topic, partition): 40},
            model=_state() if model is None else model,
            meta=model_meta(SETTINGS),
            owner=owner,
            task={"mix": {"mistakes": mistakes, "learned": learned, "inputs": [], "epoch": epoch}},
        )
    )


def _offer(board: MixBoard, value: bytes, partition: int = 1) -> None:
    board.offer(mix_key(OWNER.group_id, partition), value)


def test_a_plausible_record_is_kept():
    board, reasons = _board()
    _offer(board, _record(mistakes=EVERY))
    assert reasons == [] and board.latest[1].mistakes == EVERY


@pytest.mark.parametrize(
    ("mistakes", "learned"),
    [(2**63 - 1, EVERY), (4, 3)],
    ids=["2**63-1 mistakes (the finding)", "beyond its own events learned"],
)
def test_a_record_claiming_more_mistakes_than_events_it_learned_is_refused_as_implausible(mistakes, learned):
    """Measured before: 2**63-1 mistakes were kept, μ ≈ 1, and the forged weights replaced every replica's."""
    board, reasons = _board()
    _offer(board, _record(mistakes=mistakes, learned=learned))
    assert reasons == ["implausible"] and board.latest == {}


def test_a_record_of_more_mistakes_than_mix_every_is_kept_weighed_as_mix_every():
    """A writer with a larger --mix-every (a rolling change of it) was refused as implausible by every reader; it is
    weighed as a replica that erred on each of this reader's --mix-every events, as a forger's claim is at most."""
    board, reasons = _board()
    _offer(board, _record(mistakes=10 * EVERY, learned=10 * EVERY))
    assert reasons == [] and board.latest[1].mistakes == EVERY


def test_an_epoch_more_than_a_day_ahead_is_refused_as_implausible():
    """An epoch of 2**62 had every genuine record of its partition refused as replayed, and one of 2**63-1 made the
    replica's next epoch 2**63, which its own checkpoint could then not restore."""
    board, reasons = _board()
    _offer(board, _record(epoch=2**62))
    assert reasons == ["implausible"] and board.latest == {}


def test_a_record_longer_than_the_cap_allows_is_refused_before_it_is_parsed():
    """Not even JSON: refused for its length, not as damaged, so nothing of it was parsed."""
    board, reasons = _board()
    assert board.max_bytes == CAP * 2048 + 64 * 1024
    _offer(board, b"[" * (board.max_bytes + 1))
    assert reasons == ["too_large"] and board.latest == {}


def test_a_record_of_more_features_than_the_cap_is_refused_before_its_model_is_built():
    """Measured before: a record of 500,000 features filled a replica to its 50,000 cap (here: 101 over 100)."""
    board, reasons = _board()
    value = _record(_state(features=CAP + 1))
    assert board.max_bytes is not None and len(value) < board.max_bytes
    _offer(board, value)
    assert reasons == ["too_large"] and board.latest == {}


@pytest.mark.parametrize(
    ("where", "value"),
    [("weights", 1e308), ("weights", 1e151), ("means", 1e200), ("vars", 1e300)],
    ids=["weight 1e308 (the finding)", "weight 1e151", "mean 1e200", "variance 1e300"],
)
def test_a_record_with_numbers_beyond_the_bounds_is_refused_as_non_finite(where, value):
    """A scaler mean of 1e200 used to pass the read-back check, and its mix then overflowed (OverflowError, which
    the board did not catch: the loop's error)."""
    board, reasons = _board()
    model = _state()
    if where == "weights":
        model["perceptron"]["weights"][0] = value
    else:
        model["scaler"][where][0][1] = value
    _offer(board, _record(model))
    assert reasons == ["non_finite"] and board.latest == {}


def test_a_replica_publishes_no_more_mistakes_than_events_it_learned_since_its_mix():
    """A replica whose book-keeping starts after its updates (a checkpoint without a mixer's, an initial model's
    state) counted every update since its start as mistakes of its first round; its peers would refuse that."""
    board, reasons = _board()
    learner = make_learner(standardize=True, max_features=CAP)
    for i in range(30):  # 30 events learned before the mixer counts: many updates
        learner.step({"f": float(i % 3 - 1), "g": 1.0}, 1 if i % 2 else -1)
    assert learner.updates > EVERY
    mixer = Mixer(EVERY, board, SETTINGS.mix_topic)
    while not mixer.learned():
        pass
    sent = []
    task = SimpleNamespace(
        learner=learner,
        positions={(SETTINGS.input_topic, 0): 30},
        decoder=SimpleNamespace(dimension=None),
        meta=model_meta(SETTINGS),
        owner=Owner(OWNER.group_id, OWNER.input_topic, partition_task(0), OWNER.cluster_id, OWNER.topic_id),
        partition=0,
    )
    mixer.mix(task, lambda topic, key, value: sent.append(value), 0.0)
    assert decode_checkpoint(sent[0]).task["mix"]["mistakes"] == EVERY
    other, reasons = _board()
    _offer(other, sent[0], partition=0)
    assert reasons == [] and other.latest[0].mistakes == EVERY


def test_a_record_that_mixes_beyond_the_bounds_is_refused_and_left_out_of_the_mix():
    """An averaged record within the bounds alone (u of 1e150 over a c of 1) made a replica of c = 1000 hold sums of
    1e153 when mixed: its learner could not be built, and the mix raised (the loop's error, at every restart)."""
    settings = load(ServeSettings, ["--model-scope", "partition", "--mix-every", str(EVERY), "--variant", "averaged"])
    reasons: list[str] = []
    board = MixBoard(OWNER, model_meta(settings), 3, on_reject=reasons.append, every=EVERY)
    own = make_learner("averaged", max_features=settings.max_model_features)
    for i in range(1000):
        own.step([1.0, (-1) ** i * 0.5], 1 if i % 3 else -1)
    forged = make_learner("averaged", max_features=settings.max_model_features)
    forged.step([1.0, 0.5], 1)
    state = forged.to_state()
    state["averaged"].update(sum=[1e150, 1e150], c=1)
    honest = make_learner("averaged", max_features=settings.max_model_features)
    honest.step([1.0, -0.5], 1)
    for partition, model in ((1, state), (2, honest.to_state())):
        owner = Owner(OWNER.group_id, OWNER.input_topic, partition_task(partition), OWNER.cluster_id, OWNER.topic_id)
        board.accept(
            partition,
            Checkpoint(1, {}, model, None, model_meta(settings), 0.0, owner, {"mix": {"mistakes": 1, "learned": 1}}),
        )
    assert sorted(board.latest) == [1, 2] and reasons == []
    mixer = Mixer(EVERY, board, settings.mix_topic)
    mixer.since = EVERY
    sent: list[bytes] = []
    task = SimpleNamespace(
        learner=own,
        positions={},
        decoder=SimpleNamespace(dimension=2),
        meta=model_meta(settings),
        owner=Owner(OWNER.group_id, OWNER.input_topic, partition_task(0), OWNER.cluster_id, OWNER.topic_id),
        partition=0,
    )
    mixed = mixer.mix(task, lambda topic, key, value: sent.append(value), 0.0)
    assert reasons == ["non_finite"] and 1 not in board.latest
    assert [p for p, _, _ in decode_checkpoint(sent[0]).task["mix"]["inputs"]] == [0, 2]  # the honest one mixed
    assert all(abs(v) < 1e6 for v in mixed.weights.values())


# replay (issue 35): a signed mix record that is not newer than the newest read is refused ---------------------------
# A signature proves who wrote a record, not that it is the latest: the board orders each partition's records by
# (epoch, mix number) and refuses an older or equal one as ``replayed``; a replica restarted from an older checkpoint
# publishes under a newer epoch, which is taken.
KEY = b"a-secret-of-32-bytes-for-tests!!"
REPLAY_OWNER = Owner("g", "points", "model", "cluster", "topic-id")
META = {"variant": "plain"}


def _signed(seq: int, epoch: int | None, weight: float = 1.0, partition: int = 0) -> bytes:
    learner = make_learner("plain", 0.0, False)
    learner.step({"a": weight}, 1)
    mix = {"mistakes": seq, "learned": 100, "inputs": [[partition, seq, 1.0]]}
    if epoch is not None:
        mix["epoch"] = epoch
    cp = Checkpoint(
        seq=seq,
        positions={("points", partition): 10 * seq},
        model=learner.to_state(),
        meta=META,
        owner=Owner("g", "points", f"partition-{partition}", "cluster", "topic-id"),
        task={"mix": mix},
    )
    return encode_checkpoint(cp, KEY)


def _keyed_board():
    rejected: list[str] = []
    return MixBoard(REPLAY_OWNER, META, 2, KEY, on_reject=rejected.append), rejected


def test_an_old_signed_record_sent_again_is_refused_as_replayed():
    board, rejected = _keyed_board()
    records = {seq: _signed(seq, epoch=5, weight=seq) for seq in (1, 2, 3)}
    for seq in (1, 2, 3):
        board.offer(mix_key("g", 0), records[seq])
    assert board.latest[0].seq == 3 and rejected == []
    board.offer(mix_key("g", 0), records[1])  # seq 1 after 3: the finding (seq 1 after 12)
    board.offer(mix_key("g", 0), _signed(3, epoch=5, weight=99))  # the same number, another state
    board.offer(mix_key("g", 0), _signed(9, epoch=4, weight=99))  # an older epoch
    board.offer(mix_key("g", 0), _signed(3, epoch=None, weight=99))  # before epochs (epoch 0): by its number
    assert rejected == ["replayed"] * 4
    assert (board.latest[0].epoch, board.latest[0].seq, board.latest[0].mistakes) == (5, 3, 3)
    board.offer(mix_key("g", 0), records[3])  # the very record read again (a producer's retry): no refusal
    board.offer(mix_key("g", 0), None)  # a tombstone (unsigned, anyone can write one) forgets the state...
    board.offer(mix_key("g", 0), records[2])  # ...but not what was read: the older record stays refused
    assert rejected == ["replayed"] * 5 and 0 not in board.latest


def test_a_record_of_a_version_before_epochs_is_told_by_its_mix_number_alone():
    """A rolling upgrade: an older instance's records (epoch 0) were refused as replayed by every board that had
    read a newer instance's record of the partition, whatever their number."""
    board, rejected = _keyed_board()
    board.offer(mix_key("g", 0), _signed(3, epoch=5))
    board.offer(mix_key("g", 0), _signed(4, epoch=None))  # the older instance's next mix
    assert rejected == [] and board.latest[0].seq == 4
    board.offer(mix_key("g", 0), _signed(2, epoch=None, weight=99))  # an old one sent again
    assert rejected == ["replayed"]


def test_a_replica_restarted_from_an_older_checkpoint_publishes_under_a_newer_epoch_which_is_taken():
    board, rejected = _keyed_board()
    board.offer(mix_key("g", 0), _signed(12, epoch=5))  # the crashed replica's last mix
    mixer = Mixer(10, board, "mix", KEY)
    mixer.restore({"mixer": {"mixes": 3, "learned": 0, "updates_at_mix": 0, "epoch": 4}})  # an older checkpoint
    assert board.epoch_for(0, mixer.saved_epoch, now=0.0) == 6  # above the board's newest and the checkpoint's
    assert board.epoch_for(0, 7, now=0.0) == 8
    assert board.epoch_for(0, 7, now=1_800_000_000.0) == 1_800_000_000_000  # the wall clock, in ms, as a floor
    other, _ = _keyed_board()
    other.offer(mix_key("g", 0), _signed(12, epoch=5))
    other.offer(mix_key("g", 0), _signed(4, epoch=6))  # its mix 4 under the new epoch: newer
    assert (other.latest[0].epoch, other.latest[0].seq) == (6, 4) and rejected == []


def test_old_book_keeping_without_an_epoch_restores_with_epoch_0():
    board, _ = _keyed_board()
    mixer = Mixer(10, board, "mix", KEY)
    mixer.restore({"mixer": {"mixes": 3, "learned": 2, "updates_at_mix": 1}})
    assert (mixer.mixes, mixer.saved_epoch, mixer.epoch) == (3, 0, None)
    assert mixer.to_state()["mixer"]["epoch"] == 0
