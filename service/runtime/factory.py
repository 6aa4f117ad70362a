"""The task factory: what a task (the group's model, or a partition's replica) is made of, from the settings.

The one place that builds a :class:`~perceptron_stream.pipeline.task.Task`: its
learner (frozen with ``--learning off``), decoder, mixer, joiner and pending
tables, challengers and drift watch; and the one place a new model starts
from ``--initial-model``. Start-up makes a factory from what it opened (the
cluster's ids in the owner, the store, the changelog, the mix board); the
rebalance callbacks ask it for a partition's task (:mod:`perceptron_stream.runtime.partitions`).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import orjson
from perceptron_stream.config import ServeSettings, invalid_setting, signing_key
from perceptron_stream.kafka.contract import RecordLimits
from perceptron_stream.learning import make_learner
from perceptron_stream.pipeline.history import History, challenger_key, history_key
from perceptron_stream.pipeline.labels import Joiner
from perceptron_stream.pipeline.mixer import MixBoard, Mixer
from perceptron_stream.pipeline.models import DriftWatch, Frozen, ModelSet
from perceptron_stream.pipeline.task import Task, partition_task
from perceptron_stream.state.changelog import Changelog
from perceptron_stream.state.checkpoint import GROUP_TASK, Owner
from perceptron_stream.state.pending import PendingTable
from perceptron_stream.state.store import Store
from perceptron_stream.wire.inputs import Decoder

log = logging.getLogger("perceptron_stream")


def model_meta(s: ServeSettings) -> dict:
    """The settings a model depends on: a checkpoint (or a mix record) taken with others is not this model's."""
    return {
        "variant": s.variant,
        "margin": s.margin,
        "standardize": s.standardize,
        "input_topic": s.input_topic,
        "max_model_features": s.max_model_features,
        "hash_features": s.hash_features,
    }


#: What a member's client id starts with when it says its model's policy (:func:`policy_client_id`).
POLICY_CLIENT_ID = "perceptron-stream;"


def policy_client_id(s: ServeSettings) -> str:
    """The poll loop's client id: the settings its model depends on, and whether it signs, for the other members of
    its group to read (DescribeGroups) before they process anything
    (:class:`~perceptron_stream.runtime.partitions.OnePolicy`). Whether it signs, not with which key: anything
    derived from the key, shown to whoever may describe the group, would let them test guesses of a weak key
    offline; an instance with another key is refused by the signatures of the group's checkpoints instead.

    >>> from perceptron_stream.config import ServeSettings, load
    >>> policy_client_id(load(ServeSettings, ["--variant", "averaged"]))
    'perceptron-stream;variant=averaged;margin=0.0;standardize=False;max_model_features=50000;hash_features=0;key=none'
    """
    meta = {k: v for k, v in model_meta(s).items() if k != "input_topic"}  # the group reads one input topic
    meta["key"] = "none" if signing_key(s) is None else "signed"
    return POLICY_CLIENT_ID + ";".join(f"{k}={v}" for k, v in meta.items())


def policy_of(client_id: str) -> dict[str, str] | None:
    """The policy a member's client id says (None: not a perceptron-stream that says one).

    >>> policy_of("perceptron-stream;variant=plain;key=none")
    {'variant': 'plain', 'key': 'none'}
    >>> policy_of("rdkafka") is None
    True
    """
    if not client_id.startswith(POLICY_CLIENT_ID):
        return None
    return dict(part.partition("=")[::2] for part in client_id[len(POLICY_CLIENT_ID) :].split(";"))


class TaskFactory:
    """Tasks for ``owner``'s model: with no store, changelog or board, as before start-up (or without them)."""

    def __init__(
        self,
        settings: ServeSettings,
        owner: Owner,
        *,
        store: Store | None = None,
        changelog=None,
        board: MixBoard | None = None,
        limits: RecordLimits | None = None,
    ):
        self.settings, self.owner = settings, owner
        self.limits = limits  # the topics' record limits: a history record is cut to fit its topic
        self.store, self.changelog, self.board = store, changelog, board  # changelog: the Kafka store's PartitionedLog
        self.meta = model_meta(settings)
        self.challenger_specs = ModelSet.parse(settings.challengers)
        self._cache_dir: tempfile.TemporaryDirectory | None = None  # pending tables the store keeps no files for

    def new_task(self, partition: int | None) -> Task:
        """A fresh task: the group's (``partition`` None) or a partition's replica; restoring it is the restorer's."""
        s = self.settings
        name = GROUP_TASK if partition is None else partition_task(partition)
        owner = Owner(self.owner.group_id, self.owner.input_topic, name, self.owner.cluster_id, self.owner.topic_id)
        frozen = s.learning == "off"
        learner = self.make_learner(s.variant, s.margin)
        decoder = Decoder(s.max_message_bytes, s.max_features, max_feature_value=s.max_feature_value)
        mixer = None
        if partition is not None and s.mix_every and self.board is not None:
            mixer = Mixer(s.mix_every, self.board, s.mix_topic, signing_key(s))
        joiner = None
        if s.label_topic is not None:
            joiner = Joiner(
                lambda p: self.pending_table(name, p),
                ttl_seconds=s.label_ttl_seconds,
                max_pending=s.max_pending,
                outcome_topic=s.outcome_topic,
                dlq_topic=s.dlq_topic,
                max_message_bytes=s.max_message_bytes,
                changelog=None
                if self.changelog is None
                else Changelog(
                    self.changelog,
                    s.group_id,
                    in_transactions=s.processing_guarantee == "exactly-once",
                    on_reject=getattr(self.changelog, "on_reject", None),  # set at start-up: the rejected-state metric
                ),
                label_topic=s.label_topic,
                grace_seconds=s.label_grace_seconds,
                max_early=s.max_early_labels,
                max_clock_skew=s.max_clock_skew_seconds or 0.0,  # never None: the settings set its default
            )
        models = None
        if self.challenger_specs:
            models = ModelSet(self.challenger_specs, self.make_learner)
            if frozen:
                models.challengers = {n: Frozen(c) for n, c in models.challengers.items()}
        return Task(
            name,
            owner,
            Frozen(learner) if frozen else learner,
            decoder,
            self.meta,
            partition=partition,
            mixer=mixer,
            joiner=joiner,
            models=models,
            drift=DriftWatch(),
            frozen=frozen,
            explain=s.explain,
            history=None if s.model_history_topic is None else self._history(history_key(s.group_id, name), self.meta),
            challenger_histories={  # (--history-challengers needs the history: the settings check it)
                challenger: self._history(
                    challenger_key(s.group_id, name, challenger), {**self.meta, "variant": variant, "margin": margin}
                )
                for challenger, variant, margin in self.challenger_specs
            }
            if s.history_challengers
            else None,
            outputs={
                "output_topic": s.output_topic,
                "dlq_topic": s.dlq_topic,
                "max_message_bytes": s.max_message_bytes,
                "label_topic": s.label_topic,
            },
        )

    def _history(self, key: bytes, meta: dict) -> History:
        """A model history of ``key``'s records on --model-history-topic, each within the topic's limit."""
        s = self.settings
        topic = s.model_history_topic
        assert topic is not None  # (asked only with a history)
        limit = 0 if self.limits is None else self.limits.of(topic)
        return History(key, s.history_snapshot_every, topic, meta, max_record_bytes=limit, signing_key=signing_key(s))

    def make_learner(self, variant: str, margin: float):
        s = self.settings
        return make_learner(variant, margin, s.standardize, s.max_model_features or None, s.hash_features)

    def initial(self, task: Task) -> None:
        """A new model (no checkpoint) starts from --initial-model; a restored one ignores it, saying so."""
        s = self.settings
        if s.initial_model is None:
            return
        if task.seq and not task.started_over:
            log.info("--initial-model %s ignored: %s was restored from its checkpoint", s.initial_model, task.name)
            return
        doc = orjson.loads(s.initial_model.read_bytes())  # checked against the ModelFile contract with the settings
        try:
            learner = s.learner_from_model_file(doc)
        except ValueError as exc:  # checked with the settings (ServeSettings): only a file changed since then
            raise invalid_setting("initial_model", str(exc)) from None
        task.learner = Frozen(learner) if s.learning == "off" else learner
        log.info(
            "%s starts from --initial-model %s (%s): %d features",
            task.name,
            s.initial_model,
            doc["source"],
            len(doc["features"]),
        )

    def pending_table(self, task: str, partition: int) -> PendingTable:
        """A partition's pending table: where the store keeps the task's files, else in a cache directory
        (the Kafka store rebuilds it from its changelog; without a store it lives as long as the process)."""
        s = self.settings
        directory = self.store.pending_dir(task) if self.store is not None else None
        if directory is None:
            if self._cache_dir is None:
                self._cache_dir = tempfile.TemporaryDirectory(prefix="perceptron-pending-")
            directory = Path(self._cache_dir.name) / task
        directory.mkdir(parents=True, exist_ok=True)
        return PendingTable(
            directory / f"pending-{partition}.sqlite",
            ttl_seconds=s.label_ttl_seconds,
            max_pending=s.max_pending,
            track_changes=self.changelog is not None,
        )

    def close(self) -> None:
        """Remove the cache directory of pending tables (their joiners closed first)."""
        if self._cache_dir is not None:
            self._cache_dir.cleanup()
