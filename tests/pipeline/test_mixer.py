"""The mix board's replay check: a signed mix record that is not newer than the newest read is refused.

A signature proves who wrote a record, not that it is the latest (issue 35): the board orders each partition's
records by (epoch, mix number) and refuses an older or equal one as ``replayed``; a replica restarted from an
older checkpoint publishes under a newer epoch, which is taken.
"""

from __future__ import annotations

from perceptron_stream.learning import make_learner
from perceptron_stream.pipeline.mixer import MixBoard, Mixer, mix_key
from perceptron_stream.state.checkpoint import Checkpoint, Owner, encode_checkpoint

KEY = b"a-secret-of-32-bytes-for-tests!!"
OWNER = Owner("g", "points", "model", "cluster", "topic-id")
META = {"variant": "plain"}


def _record(seq: int, epoch: int | None, weight: float = 1.0, partition: int = 0) -> bytes:
    learner = make_learner("plain", 0.0, False)
    learner.step({"a": weight}, 1)
    mix = {"mistakes": seq, "learned": 10, "inputs": [[partition, seq, 1.0]]}
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


def _board():
    rejected: list[str] = []
    return MixBoard(OWNER, META, 2, KEY, on_reject=rejected.append), rejected


def test_an_old_signed_record_sent_again_is_refused_as_replayed():
    board, rejected = _board()
    records = {seq: _record(seq, epoch=5, weight=seq) for seq in (1, 2, 3)}
    for seq in (1, 2, 3):
        board.offer(mix_key("g", 0), records[seq])
    assert board.latest[0].seq == 3 and rejected == []
    board.offer(mix_key("g", 0), records[1])  # seq 1 after 3: the finding (seq 1 after 12)
    board.offer(mix_key("g", 0), _record(3, epoch=5, weight=99))  # the same number, another state
    board.offer(mix_key("g", 0), _record(9, epoch=4, weight=99))  # an older epoch
    board.offer(mix_key("g", 0), _record(9, epoch=None, weight=99))  # written before epochs: epoch 0
    assert rejected == ["replayed"] * 4
    assert (board.latest[0].epoch, board.latest[0].seq, board.latest[0].mistakes) == (5, 3, 3)
    board.offer(mix_key("g", 0), records[3])  # the very record read again (a producer's retry): no refusal
    board.offer(mix_key("g", 0), None)  # a tombstone (unsigned, anyone can write one) forgets the state...
    board.offer(mix_key("g", 0), records[2])  # ...but not what was read: the older record stays refused
    assert rejected == ["replayed"] * 5 and 0 not in board.latest


def test_a_replica_restarted_from_an_older_checkpoint_publishes_under_a_newer_epoch_which_is_taken():
    board, rejected = _board()
    board.offer(mix_key("g", 0), _record(12, epoch=5))  # the crashed replica's last mix
    mixer = Mixer(10, board, "mix", KEY)
    mixer.restore({"mixer": {"mixes": 3, "learned": 0, "updates_at_mix": 0, "epoch": 4}})  # an older checkpoint
    assert board.epoch_for(0, mixer.saved_epoch, now=0.0) == 6  # above the board's newest and the checkpoint's
    assert board.epoch_for(0, 7, now=0.0) == 8
    assert board.epoch_for(0, 7, now=1_800_000_000.0) == 1_800_000_000_000  # the wall clock, in ms, as a floor
    other, _ = _board()
    other.offer(mix_key("g", 0), _record(12, epoch=5))
    other.offer(mix_key("g", 0), _record(4, epoch=6))  # its mix 4 under the new epoch: newer
    assert (other.latest[0].epoch, other.latest[0].seq) == (6, 4) and rejected == []


def test_old_book_keeping_without_an_epoch_restores_with_epoch_0():
    board, _ = _board()
    mixer = Mixer(10, board, "mix", KEY)
    mixer.restore({"mixer": {"mixes": 3, "learned": 2, "updates_at_mix": 1}})
    assert (mixer.mixes, mixer.saved_epoch, mixer.epoch) == (3, 0, None)
    assert mixer.to_state()["mixer"]["epoch"] == 0
