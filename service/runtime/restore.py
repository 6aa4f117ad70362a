"""A task's state read back from its store, and checked before it is used.

In this order: whose it is (:class:`~perceptron_stream.state.checkpoint.Owner`: group,
input topic and its id, cluster, task), whether this version can use it
(model settings, a model it can rebuild), and whether its positions lie
inside the partitions' logs. Another model's state is never used silently:
the service stops naming what differs (:class:`StartupError`), or with
``--start-over`` starts a new model whose checkpoints supersede the old ones.
The same holds for committed offsets with no checkpoint behind them (the
state that learned those events is lost), and for a checkpoint behind them
(:meth:`Restorer._refuse_stale`: an older checkpoint put back where a newer one
was). One policy per group: a checkpoint taken with other model settings, or
a store whose checkpoints are signed when this instance has no
``--checkpoint-key`` (or unsigned, or signed with another key, when it has
one), is a bad setting (ConfigError, exit 2) naming it, found before the
instance writes anything.
"""

from __future__ import annotations

import logging
from functools import partial

from perceptron_stream.config import invalid_setting
from perceptron_stream.kafka import committed_offsets, log_ranges
from perceptron_stream.learning import learner_from_state
from perceptron_stream.learning.perceptron import state_reason
from perceptron_stream.runtime.retry import Retry, StartupError
from perceptron_stream.state.checkpoint import (
    GROUP_TASK,
    Checkpoint,
    CheckpointError,
    ForeignStateError,
    KeyPolicyError,
    behind,
    refused,
)

log = logging.getLogger("perceptron_stream")


def learner_of(cp: Checkpoint):
    """``cp``'s learner, or the CheckpointError that has an older checkpoint tried (restore and ``model export``).

    Its reason, for perceptron_rejected_state_total: non_finite (numbers beyond the bounds), implausible, damaged.
    """
    try:
        return learner_from_state(cp.model)
    except ValueError as exc:
        raise refused(f"it holds a model this version cannot read: {exc}", state_reason(exc)) from None


class Restorer:
    def __init__(self, settings, store, retry: Retry, initial=None):
        self.settings, self.store, self.retry = settings, store, retry
        self.initial = initial  # (task) -> None: what a new model starts from (--initial-model)
        self._read: dict | None = None  # within restore_all: what was read from the brokers, for the next task

    def restore_all(self, tasks: list) -> None:
        """Each of ``tasks`` restored as :meth:`restore` does, with one read of the store, of the group's committed
        offsets and of each topic's log ranges for them all (partition scope: the partitions one rebalance assigned).

        Each read is a client of its own (its connection, metadata and fetches), 0.3-0.7 s: one after another,
        six partitions took 4 s. Every read is made where a single restore makes it, at its first use, so the
        order holds: under exactly-once the group's stable offsets before the checkpoints (a checkpoint counts
        when its positions are committed offsets). One answer serves every task: the offsets of partitions just
        assigned were committed by their previous owners before the group handed them on, and a log grows at
        its end (a position inside its range stays inside).
        """
        self._read = {}
        try:
            with self.store.reading([task.name for task in tasks]):
                for task in tasks:
                    self.restore(task)
        finally:
            self._read = None

    def _once(self, what: tuple, read, description: str):
        """``read()`` retried until it works (None: stopped meanwhile); within restore_all, once for every task."""
        if self._read is not None and what in self._read:
            return self._read[what]
        value = self.retry.until_it_works(read, description)
        if self._read is not None and value is not None:
            self._read[what] = value
        return value

    def restore(self, task, *, legacy: bool = False) -> bool:
        """``task`` restored from its store (:meth:`_restore`); a new model's book-keeping set up otherwise."""
        restored = self._restore(task, legacy=legacy)
        if not restored:
            task.fresh()
        if self.initial is not None:
            self.initial(task)
        return restored

    def start_group_model(self, task) -> None:
        """Group scope, before joining the group: the model's state locked and restored (version 0.1's checkpoints
        adopted when vouched for); without a store, the new model started (--initial-model)."""
        if self.store is None:
            if self.initial is not None:
                self.initial(task)
            return
        self.store.lock(GROUP_TASK)
        self.restore(task, legacy=True)

    def _restore(self, task, *, legacy: bool = False) -> bool:
        """Load ``task``'s newest usable checkpoint into it: True; False for a new model (none, or started over).

        ``legacy``: the group's model may adopt version 0.1's checkpoints,
        which record no owner, when the group's committed offsets vouch for them.
        """
        expected = task.meta
        models, other_settings = {}, []

        def accept(cp: Checkpoint) -> None:
            # written before the cap and hashing existed: no hashing, and no cap (the model gets today's cap)
            meta = {"max_model_features": expected.get("max_model_features"), "hash_features": 0, **cp.meta}
            different = {k: (meta.get(k), v) for k, v in expected.items() if meta.get(k) != v}
            if different:  # the operator's settings changed, or this one is not the service's: an older one may fit
                what = ", ".join(f"{k} was {old!r}, now {new!r}" for k, (old, new) in different.items())
                other_settings.append(what)
                raise refused(f"it was taken with other model settings ({what})", "settings")
            models[cp.seq] = learner_of(cp)

        only_committed = {}
        if self.settings.processing_guarantee == "exactly-once":  # only checkpoints committed with their positions
            s = self.settings
            committed = {}
            for topic in [s.input_topic] + ([s.label_topic] if s.label_topic else []):  # a task reads both
                offsets = self._once(  # stable: no transaction committing them still ending
                    ("stable offsets", topic),
                    partial(committed_offsets, s, s.group_id, topic, stable=True),
                    "read the group's committed offsets",
                )
                committed.update({(topic, p): o for p, o in (offsets or {}).items()})
            only_committed = {"committed": committed}
        try:  # retried while the brokers do not answer (the Kafka store): a restart never ends in their raw error
            found = self.retry.until_it_works(
                lambda: (self.store.load(task.name, task.owner, accept, legacy=legacy, **only_committed),),
                f"read the checkpoints of {task.name}",
            )
        except ForeignStateError as exc:
            return self._foreign(task, str(exc), exc.highest_seq)
        except KeyPolicyError as exc:
            return self._other_key(task, exc)
        except CheckpointError:
            if other_settings:  # each one skipped was counted by the store (settings)
                name = other_settings[0].split(" ", 1)[0]
                raise invalid_setting(
                    name,
                    f"the checkpoint was taken with other model settings ({other_settings[0]}): consumer group "
                    f"{self.settings.group_id}'s model runs with those; use the same settings, or another "
                    "--group-id and state store to start a new model. This instance wrote nothing",
                ) from None
            raise
        if found is None:  # stopped meanwhile
            return False
        cp = found[0]
        if cp is None:
            return self._no_checkpoint(task)
        if self.store.key is None and cp.signed:
            self._reject("key")
            raise invalid_setting(
                "checkpoint_key",
                f"checkpoint {cp.seq} of {task.name} is signed: consumer group {self.settings.group_id} runs with a "
                "--checkpoint-key, and this instance has none (it would restore the group's state unchecked and "
                "overwrite it unsigned); set the group's key. This instance wrote nothing",
            )
        if cp.owner is None and not self._vouch_for_legacy(task, cp):
            return False
        if self.settings.processing_guarantee != "exactly-once" and not self._refuse_stale(task, cp):
            return False
        if not self._positions_in_logs(task, cp):
            return False
        learner = models[cp.seq]
        cap = self.settings.max_model_features or None
        if learner.max_features != cap:  # a checkpoint from before the cap existed: it applies from now on
            learner.max_features = cap
            log.info(
                "the checkpoint predates --max-model-features: the model holds %d features, and at most %s from now on",
                len(learner.weights),
                cap,
            )
        try:
            task.restore(cp, learner)
        except CheckpointError as exc:
            raise StartupError(f"checkpoint {cp.seq} of {task.name} cannot be used: {exc}") from None
        log.info(
            "restored checkpoint %d of %s: %d events seen, %d updates, %d features dropped, positions %s",
            cp.seq,
            task.name,
            learner.seen,
            learner.updates,
            learner.dropped_features,
            cp.positions,
        )
        return True

    def _reject(self, reason: str) -> None:
        """A checkpoint the store read back and returned, refused here (key, stale): counted as the store counts its
        own refusals (perceptron_rejected_state_total{kind="checkpoint"})."""
        if self.store.on_reject is not None:
            self.store.on_reject(reason)

    def _other_key(self, task, exc: KeyPolicyError) -> bool:
        """No checkpoint of ``task`` passes this instance's --checkpoint-key: the group runs unsigned (or with another
        key). A bad setting (exit 2), unless told to start a new model (--start-over), whose checkpoints are signed
        and supersede the others."""
        s = self.settings  # each checkpoint that failed the key was counted by the store (key)
        policy = "without --checkpoint-key (its checkpoints are unsigned)" if exc.unsigned else "with another key"
        if s.start_over:
            log.warning(
                "--start-over: %s; starting a new, signed model from --auto-offset-reset %s", exc, s.auto_offset_reset
            )
            task.seq = max(task.seq, exc.highest_seq)
            task.started_over = True
            return False
        raise invalid_setting(
            "checkpoint_key",
            f"consumer group {s.group_id} runs {policy}: {exc}. Run with the group's key (or none, as it does), or "
            "--start-over to start a new model signed with this key. This instance wrote nothing",
        )

    def _refuse_stale(self, task, cp: Checkpoint) -> bool:
        """True when ``cp``'s positions are not behind the group's committed offsets (at-least-once; exactly-once's
        store keeps only a checkpoint at them), or when it is the fallback from unusable newer ones
        (``Checkpoint.newer_skipped``); else refuse it,
        or with --start-over start a new model.

        The newest checkpoint is at or ahead of the committed offsets (saved,
        then committed). One behind them with nothing unusable skipped is an
        older one put back in place of the newer (a replayed record, a store
        restored from a backup): refused, never restored silently. Restoring it
        would learn and publish again every event between its positions and
        the committed offsets; seeking to the committed offsets instead would
        leave them unlearned (each event is learned exactly once:
        docs/concepts/guarantees.md). The operator restores the newer
        checkpoint, or resets the group's offsets to its positions to resume
        from it deliberately. The fallback from a damaged newest checkpoint
        (documented, and what the older ones are kept for) is restored, with a
        WARNING saying the events since it are learned and published again: the
        model learns each of them once, from its state, as after a crash. Only
        a skipped record that may have been a newer checkpoint of this model
        makes it that fallback (:func:`newest_usable`'s rule): never, under
        --checkpoint-key, an unsigned, badly signed or damaged record, which
        anyone who can write the store can add beside an old signed checkpoint.
        """
        s = self.settings
        committed = {}
        for topic in sorted({t for t, _ in cp.positions}):
            offsets = self._once(
                ("offsets", topic),
                partial(committed_offsets, s, s.group_id, topic),
                "read the group's committed offsets",
            )
            committed.update({(topic, p): o for p, o in (offsets or {}).items()})
        stale = behind(cp.positions, committed)
        if not stale:
            return True
        if cp.newer_skipped:  # a newer one may be among the unusable ones skipped: the documented fallback, said
            log.warning(
                "checkpoint %d of %s is behind the offsets consumer group %s committed (%s) because the newer "
                "one(s) are unusable (said above): the events since its positions are learned and published again",
                cp.seq,
                task.name,
                s.group_id,
                "; ".join(stale),
            )
            return True
        self._reject("stale")
        resets = " ".join(f"--topic {t}:{p} --to-offset {o}" for (t, p), o in sorted(cp.positions.items()))
        problem = (
            f"checkpoint {cp.seq} of {task.name}, the newest usable one, is behind the offsets consumer group "
            f"{s.group_id} committed ({'; '.join(stale)}): a newer checkpoint was replaced by an older one (a "
            "replayed record, a store restored from a backup) or is damaged. Restoring it would learn and publish "
            "those events again, and skipping to the committed offsets would leave them unlearned"
        )
        if s.start_over:
            log.warning("--start-over: %s; starting a new model", problem)
            task.seq = max(task.seq, cp.seq)
            task.started_over = True
            return False
        raise StartupError(
            f"{problem}. Nothing was restored and nothing learned. Put the newer checkpoint back; or, to resume from "
            f"this one deliberately, stop every instance and reset the group's offsets to its positions "
            f"(kafka-consumer-groups --group {s.group_id} --reset-offsets {resets} --execute); or start a new model "
            "with --start-over"
        )

    def _foreign(self, task, problem: str, highest_seq: int) -> bool:
        """Stop naming ``problem``, or with --start-over, start a new model whose checkpoints supersede the store's."""
        s = self.settings
        if not s.start_over:
            raise StartupError(
                f"{problem}. Nothing was restored and nothing learned. To keep that model, point --state-dir or "
                f"--checkpoint-topic at this model's own state, or connect to the cluster it belongs to; to start a new "
                f"model on {s.input_topic} from --auto-offset-reset {s.auto_offset_reset} deliberately, run with --start-over"
            )
        log.warning("--start-over: %s; starting a new model from --auto-offset-reset %s", problem, s.auto_offset_reset)
        task.seq = max(task.seq, highest_seq)
        task.started_over = True
        return False

    def _no_checkpoint(self, task) -> bool:
        """A new model, unless committed offsets say the state that learned up to them is lost.

        This service commits only checkpointed positions, so offsets without a
        checkpoint come from a model whose store was emptied (a new volume, a
        deleted topic) or from a storeless run. Going on would learn from the
        middle of the stream with zero weights, silently.
        """
        s = self.settings
        if getattr(task, "started_over", False):
            return False
        offsets = self._once(
            ("offsets", s.input_topic),
            partial(committed_offsets, s, s.group_id, s.input_topic),
            "read the group's committed offsets",
        )
        mine = {p: o for p, o in (offsets or {}).items() if task.partition is None or p == task.partition}
        if not mine:
            # with --initial-model, the factory's next line says what it starts from (not zero weights)
            log.info(
                "no checkpoint yet of %s: a new model%s",
                task.name,
                "" if s.initial_model else ", starting from zero weights",
            )
            return False
        at = ", ".join(f"partition {p} at {o}" for p, o in sorted(mine.items()))
        where = self.store.task_dir(task.name) if s.state_store == "local" else f"topic {s.checkpoint_topic}"
        message = (
            f"consumer group {s.group_id} has committed offsets on {s.input_topic} ({at}) but the state store "
            f"({s.state_store}, {where}) has no checkpoint: the model that learned those events is lost"
        )
        if s.start_over:
            log.warning(
                "--start-over: %s; starting a new model from --auto-offset-reset %s", message, s.auto_offset_reset
            )
            task.started_over = True
            return False
        raise StartupError(
            f"{message}. Restore the checkpoints, or start a new model on the retained history with a new --group-id "
            "or --start-over, or reset the group's offsets (kafka-consumer-groups --reset-offsets)"
        )

    def _vouch_for_legacy(self, task, cp: Checkpoint) -> bool:
        """A version 0.1 checkpoint records no owner: adopt it only when this group's committed offsets are its positions.

        That version committed nothing but checkpointed positions, so equal
        offsets say this group wrote it on this cluster; a fresh cluster or
        another group has other offsets (or none).
        """
        s = self.settings
        offsets = self.retry.until_it_works(
            lambda: committed_offsets(s, s.group_id, s.input_topic), "read the group's committed offsets"
        )
        mine = {p: o for (t, p), o in cp.positions.items() if t == s.input_topic}
        if offsets == mine:
            self.store.adopt_legacy(task.name)
            return True
        return self._foreign(
            task,
            f"checkpoint {cp.seq} was written by version 0.1, which did not record its consumer group or cluster, and the "
            f"offsets consumer group {s.group_id} committed on {s.input_topic} ({offsets or 'none'}) are not its positions "
            f"({mine}): it belongs to another group or cluster",
            cp.seq,
        )

    def _positions_in_logs(self, task, cp: Checkpoint) -> bool:
        """Every position of ``cp`` inside its partition's log (first offset ≤ position ≤ end), else refuse.

        Before the start: records the model never learned were deleted
        (retention). After the end: the topic was emptied or created again, or
        the checkpoint is not this cluster's. Either way, seeking there would
        skip or lose events silently.
        """
        outside = []
        for topic in sorted({t for t, _ in cp.positions}):
            ranges = self._once(
                ("ranges", topic), partial(log_ranges, self.settings, topic), f"read the logs' ranges of {topic}"
            )
            for (t, partition), position in sorted(cp.positions.items()):
                if t != topic:
                    continue
                if partition not in ranges:
                    outside.append(
                        f"{topic} partition {partition} at offset {position}, but {topic} has no partition {partition}"
                    )
                elif not ranges[partition][0] <= position <= ranges[partition][1]:
                    first, end = ranges[partition]
                    outside.append(f"partition {partition} at offset {position}, outside its log ({first} to {end})")
        if not outside:
            return True
        return self._foreign(
            task,
            f"checkpoint {cp.seq} holds positions outside {self.settings.input_topic}'s logs: " + "; ".join(outside),
            cp.seq,
        )
