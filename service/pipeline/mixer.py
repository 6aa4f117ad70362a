"""Iterative parameter mixing between replicas, over the mix topic.

Every ``--mix-every`` events a replica learns from, it publishes its state
(its weights and its mistakes since its previous mix) to the compacted mix
topic, keyed ``<group>/<partition>``, and replaces its weights by the mix of
the latest state of every partition, each weighted by those mistakes
(:mod:`perceptron_stream.learning.mixing`: McDonald, Hall & Mann 2010, error-weighted).

A mix record is read back from a topic that others can write: it is a
checkpoint document (:mod:`perceptron_stream.state.checkpoint`: checksummed, signed with
``--checkpoint-key``, every field checked) whose owner, partition and model
settings must be this model's, and whose model must rebuild; anything else is
rejected, counted and logged, never mixed in. Each record names the records
its mix used (``task.mix.inputs``: partition, mix number, μ), so a replica's
weights can be recomputed from the topic (tests do).

Bounds, checked before a record can weigh in a mix (:meth:`MixBoard.offer`,
:meth:`MixBoard.accept`), each refusal counted under its reason:

- ``too_large``: a record longer than a model file of ``--max-model-features``
  features may be (:func:`~perceptron_stream.learning.model_file.largest_file_bytes`:
  a mix record holds less per feature than a model file), refused before it is
  parsed; one whose model holds more features than the cap, before the model is
  built (a forged record of 500,000 features filled a replica to its cap);
- ``implausible``: mistakes since the previous mix beyond what its replica could
  have made: one per event learned, and a replica mixes once it learned
  ``--mix-every`` events, so at most ``min(learned, --mix-every)``. A record
  claiming 2**63-1 mistakes took μ ≈ 1 and its weights replaced everyone's;
  held to the bound, a record weighs at most as much as a replica that erred on
  every event of its round. (Who may write the topic at all is
  ``--checkpoint-key``'s job: without it a forger can still send plausible
  records.)
- ``non_finite``: a number of the model beyond the bounds that keep a score
  finite (:data:`~perceptron_stream.learning.perceptron.MAX_STATE_MAGNITUDE`),
  or a mix with the record that would leave them (:meth:`Mixer._mixed`).

A signature proves who wrote a record, not that it is the latest: each record
also carries its writer's *epoch* (``task.mix.epoch``), and the board keeps
every partition's newest (epoch, mix number) read from the topic. A record at or before it is
refused as ``replayed`` (an old record sent again), unless it is the very
record read before (a producer's retry). A replica's
epoch is fixed at its first mix: above the one its checkpoint saved, above the
partition's newest on the board, and at least the wall clock in milliseconds,
so a replica restarted from an older checkpoint (at-least-once after a crash)
publishes mix numbers it published before under a newer epoch, which every
board takes. Records written before epochs existed have epoch 0.
"""

from __future__ import annotations

import logging
import time
from typing import Any, NamedTuple

from perceptron_stream.learning import learner_from_state
from perceptron_stream.learning.mixing import mix_states, mixing_weights
from perceptron_stream.learning.model_file import largest_file_bytes
from perceptron_stream.learning.perceptron import state_reason
from perceptron_stream.state.checkpoint import Checkpoint, CheckpointError, Owner, decode_checkpoint, encode_checkpoint

log = logging.getLogger("perceptron_stream")


#: How far ahead of the reader's wall clock a mix record's epoch (its writer's wall clock in ms) is believed.
EPOCH_AHEAD_S = 86_400.0


class Published(NamedTuple):
    """A partition's latest mixing state, as checked."""

    seq: int  # its mix number
    mistakes: int  # its mistakes since its previous mix: its weight in the next mixes
    state: dict  # its learner's state before it mixed
    epoch: int = 0  # its writer's epoch (0: written before epochs existed)


def replayed(newest: Published | None, candidate: Published) -> bool:
    """Whether ``candidate`` is at or before ``newest`` (by epoch, then mix number) and is not the same state.

    >>> a = Published(seq=12, mistakes=3, state={"w": 1}, epoch=5)
    >>> replayed(a, Published(1, 1, {"w": 0}, 5)), replayed(a, Published(12, 3, {"w": 1}, 5))
    (True, False)
    >>> replayed(a, Published(1, 0, {"w": 2}, 6)), replayed(None, Published(1, 0, {}, 0))
    (False, False)
    """
    if newest is None or _order(candidate, newest) > _order(newest, candidate):
        return False
    return candidate != newest


def _order(record: Published, other: Published) -> tuple[int, int]:
    """What ``record`` is ordered by against ``other``: (epoch, mix number); its mix number alone where either was
    written by a version before epochs (epoch 0: a rolling upgrade's older instances), whose epoch says nothing.

    >>> _order(Published(4, 0, {}, 0), Published(3, 0, {}, 5)), _order(Published(4, 0, {}, 6), Published(3, 0, {}, 5))
    ((0, 4), (6, 4))
    """
    return (record.epoch, record.seq) if record.epoch and other.epoch else (0, record.seq)


def mix_key(group_id: str, partition: int) -> bytes:
    return f"{group_id}/{partition}".encode()


class MixBoard:
    """The latest checked mixing state of every partition of this model (one per instance)."""

    def __init__(
        self, owner: Owner, meta: dict, partitions: int, key: bytes | None = None, on_reject=None, every: int = 0
    ):
        self.owner, self.meta, self.partitions, self.key = owner, meta, partitions, key
        self.on_reject = on_reject or (lambda reason: None)
        self.every = every  # --mix-every: the most events a replica learns between its mixes (0: no bound)
        self.max_features = meta.get("max_model_features") or None  # --max-model-features (None: no cap)
        self.max_bytes = largest_file_bytes(self.max_features)  # the longest record read (None: no bound)
        self.latest: dict[int, Published] = {}
        #: the newest record of each partition read from the topic (``latest`` may be newer: this instance's own
        #: replicas put theirs there as they publish, before the topic gives it back)
        self.read: dict[int, Published] = {}
        self._prefix = f"{owner.group_id}/".encode()

    def epoch_for(self, partition: int, saved: int, now: float) -> int:
        """A new epoch for ``partition``'s replica: above ``saved`` (its checkpoint's) and the board's newest, and at
        least the wall clock ``now`` in milliseconds (above a crashed writer's the board has not read yet)."""
        newest = self.latest.get(partition)
        return max(saved + 1, (newest.epoch + 1) if newest is not None else 0, int(now * 1000))  # below 2**63: the
        # board refuses epochs more than a day ahead of its wall clock

    def offer(self, key: bytes | None, value: bytes | None) -> None:
        """A record read from the mix topic: kept as its partition's latest when it checks out."""
        if key is None or not key.startswith(self._prefix):
            return  # another group's, or not a mix record: not ours to judge
        tail = key[len(self._prefix) :]
        if not tail.isdigit() or int(tail) >= self.partitions:
            return self._reject("key", f"key {key[:80]!r} names no partition of {self.owner.input_topic}")
        partition = int(tail)
        if value is None:
            self.latest.pop(partition, None)  # a tombstone: that partition's state was removed
            return
        if self.max_bytes is not None and len(value) > self.max_bytes:
            return self._reject(
                "too_large",
                f"partition {partition}'s mix record is {len(value):,} bytes, more than the {self.max_bytes:,} a model "
                f"of --max-model-features {self.max_features:,} may take",
            )
        try:
            cp = decode_checkpoint(value, self.key)
        except CheckpointError as exc:
            return self._reject("damaged", f"partition {partition}'s mix record is unusable: {exc}")
        self.accept(partition, cp)

    def accept(self, partition: int, cp: Checkpoint) -> None:
        from perceptron_stream.pipeline.task import partition_task

        expected = Owner(
            self.owner.group_id,
            self.owner.input_topic,
            partition_task(partition),
            self.owner.cluster_id,
            self.owner.topic_id,
        )
        differs = expected.differences(cp.owner) if cp.owner is not None else ["it records no owner"]
        if differs:
            return self._reject(
                "foreign", f"a mix record under partition {partition}'s key is not its replica's: {'; '.join(differs)}"
            )
        if cp.meta != self.meta:
            return self._reject("settings", f"partition {partition}'s mix record was made with other model settings")
        mix = cp.task.get("mix")
        if not isinstance(mix, dict) or type(mix.get("mistakes")) is not int or mix["mistakes"] < 0:
            return self._reject("damaged", f"partition {partition}'s mix record has no mistake count")
        learned = mix.get("learned", mix["mistakes"])  # (absent from records written before it was)
        if type(learned) is not int or learned < 0:
            return self._reject("damaged", f"partition {partition}'s mix record has no count of events learned")
        if mix["mistakes"] > learned:
            return self._reject(
                "implausible",
                f"partition {partition}'s mix record claims {mix['mistakes']:,} mistakes since its previous mix, "
                f"more than the {learned:,} events it learned",
            )
        features = _features(cp.model)
        if self.max_features is not None and (features is None or len(features) > self.max_features):
            return self._reject(
                "too_large" if features is not None else "damaged",
                f"partition {partition}'s mix record holds {'no' if features is None else f'{len(features):,}'} "
                f"features, and --max-model-features is {self.max_features:,}",
            )
        epoch = mix.get("epoch", 0)
        if type(epoch) is not int or not 0 <= epoch < 1 << 63:
            return self._reject("damaged", f"partition {partition}'s mix record has a malformed epoch")
        if epoch > (time.time() + EPOCH_AHEAD_S) * 1000:  # epochs are a writer's wall clock in ms (epoch_for)
            return self._reject(
                "implausible",
                f"partition {partition}'s mix record has epoch {epoch}, a wall clock in ms more than a day ahead: "
                "it would have every genuine record of its partition refused as replayed",
            )
        # weighed as a replica that erred on each of --mix-every events at most (a writer with a larger
        # --mix-every, during a rolling change of it, is weighed so too): whatever a forger claims within the
        # events it learned, it weighs no more than that
        weight = min(mix["mistakes"], self.every) if self.every else mix["mistakes"]
        published = Published(cp.seq, weight, cp.model, epoch)
        newest = self.read.get(partition)
        if newest is not None and _order(published, newest) <= _order(newest, published):
            if not replayed(newest, published):
                return None  # the same record read again (a producer's retry)
            return self._reject(
                "replayed",
                f"partition {partition}'s mix record (epoch {epoch}, mix {cp.seq}) is not newer than the newest "
                f"read (epoch {newest.epoch}, mix {newest.seq}): an old record sent again",
            )
        try:
            learner_from_state(cp.model)
            mix_states(cp.model, [cp.model], [1.0])  # a state of a variant with a mix
        except (ValueError, KeyError, TypeError, ArithmeticError) as exc:
            return self._reject(state_reason(exc), f"partition {partition}'s mix record holds no usable model: {exc}")
        self.read[partition] = published
        held = self.latest.get(partition)
        if held is None or _order(published, held) > _order(held, published):  # else: this instance's own, read
            # back late
            self.latest[partition] = published

    def refuse(self, partition: int, reason: str, message: str) -> None:
        """``partition``'s latest record, kept, refused now (a mix with it found it beyond the bounds)."""
        self.latest.pop(partition, None)
        self._reject(reason, message)

    def _reject(self, reason: str, message: str) -> None:
        log.warning("mix record rejected: %s", message)
        self.on_reject(reason)


def _features(state) -> list | None:
    """The features a learner's state holds (a hashed or scaled one's perceptron's), None when it names none."""
    while isinstance(state, dict) and state.get("kind") in ("hashed-perceptron", "scaled-perceptron"):
        state = state.get("model") if state["kind"] == "hashed-perceptron" else state.get("perceptron")
    features = state.get("features") if isinstance(state, dict) else None
    return features if isinstance(features, list) else None


class Mixer:
    """One replica's mixing: when it is due, what it publishes, and the mixed model that replaces its own."""

    def __init__(self, every: int, board: MixBoard, topic: str, key: bytes | None = None):
        self.every, self.board, self.topic, self.key = every, board, topic, key
        self.mixes = 0  # mixes made: the number of the last one
        self.since = 0  # labeled events learned since the last mix
        self.updates_at_mix = 0  # the learning weights' mistakes (updates) when it last mixed
        self.saved_epoch = 0  # the epoch its checkpoint recorded (0: none, or one from before epochs)
        self.epoch: int | None = None  # its epoch, fixed at its first mix (MixBoard.epoch_for)

    def learned(self) -> bool:
        """One more labeled event learned; True when a mix is due."""
        self.since += 1
        return self.since >= self.every

    def mix(self, task, send, now: float):
        """Publish ``task``'s state, then the mixed learner that replaces its model."""
        learner = task.learner
        state = learner.to_state()
        # at most one update an event learned: more means the book-keeping started after the updates it counts (a
        # checkpoint without a mixer's, --initial-model's state), and the readers would refuse it as implausible
        mistakes = min(learner.updates - self.updates_at_mix, self.since)
        seq = self.mixes + 1
        if self.epoch is None:
            self.epoch = self.board.epoch_for(task.partition, self.saved_epoch, now)
        others = [(p, published) for p, published in sorted(self.board.latest.items()) if p != task.partition]
        mixed, others, mu = self._mixed(state, mistakes, others)
        inputs = [[task.partition, seq, mu[0]]] + [[p, published.seq, m] for (p, published), m in zip(others, mu[1:])]
        record = Checkpoint(
            seq=seq,
            positions=dict(task.positions),
            model=state,
            dimension=task.decoder.dimension,
            meta=task.meta,
            created=now,
            owner=task.owner,
            task={"mix": {"mistakes": mistakes, "learned": self.since, "inputs": inputs, "epoch": self.epoch}},
        )
        send(self.topic, mix_key(task.owner.group_id, task.partition), encode_checkpoint(record, self.key))
        self.board.latest[task.partition] = Published(seq, mistakes, state, self.epoch)  # this instance's see it now
        self.mixes, self.since, self.updates_at_mix = seq, 0, mixed.updates
        log.debug("partition %d mix %d: μ %s", task.partition, seq, inputs)
        return mixed

    def _mixed(self, state: dict, mistakes: int, others: list) -> tuple[Any, list, list[float]]:
        """The learner of ``state`` mixed with ``others`` (partition, Published), the others it mixed and the μ.

        A record that checked out alone can still take a mix beyond the read-back bounds: the averaged variant keeps
        its own c and takes u = c·(w − a), so a record whose w − a is 1e150 (u of 1e150 over a c of 1) makes a
        replica of c = 1000 hold sums of 1e153, and its learner could not be built (the loop's error, at every
        restart while the record stays). Such a record is refused (``non_finite``) and left out of this mix and
        the next ones; one that mixes within the bounds with this replica alone is kept.
        """

        def mixed_with(chosen: list):
            mu = mixing_weights([mistakes] + [published.mistakes for _, published in chosen])
            return learner_from_state(mix_states(state, [state] + [pub.state for _, pub in chosen], mu)), mu

        try:
            mixed, mu = mixed_with(others)
            return mixed, others, mu
        except (ValueError, ArithmeticError):
            pass
        kept = []
        for partition, published in others:
            try:
                mixed_with([(partition, published)])
                kept.append((partition, published))
            except (ValueError, ArithmeticError) as exc:
                self.board.refuse(
                    partition, "non_finite", f"partition {partition}'s mix record mixes beyond the bounds: {exc}"
                )
        try:
            mixed, mu = mixed_with(kept)
        except (ValueError, ArithmeticError):  # each within the bounds, all of them together not: this mix is its own
            kept = []
            mixed, mu = mixed_with(kept)
        return mixed, kept, mu

    def to_state(self) -> dict:
        epoch = self.saved_epoch if self.epoch is None else self.epoch
        return {
            "mixer": {"mixes": self.mixes, "learned": self.since, "updates_at_mix": self.updates_at_mix, "epoch": epoch}
        }

    def restore(self, task_state: dict) -> None:
        """The book-keeping a checkpoint saved; one from before epochs restores with epoch 0 (the next is above)."""
        saved = task_state.get("mixer") if isinstance(task_state, dict) else None
        self.epoch = None
        if not isinstance(saved, dict):
            self.mixes = self.since = self.updates_at_mix = self.saved_epoch = 0
            return
        values: list[Any] = [saved.get(k) for k in ("mixes", "learned", "updates_at_mix")]  # JSON: checked below
        epoch: Any = saved.get("epoch", 0)
        if not all(type(v) is int and 0 <= v < 1 << 63 for v in [*values, epoch]):
            raise CheckpointError("the checkpoint's mixer book-keeping is malformed")
        self.mixes, self.since, self.updates_at_mix = values
        self.saved_epoch = epoch
