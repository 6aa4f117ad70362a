"""Start-up in one place: everything the loop needs from the brokers and the disk, opened in dependency order.

In this order: the codecs the clients need; the topics (created with
``--create-topics``, else checked); with delayed labels, the label and
outcome topics partitioned like the input, and with the Kafka store the
pending changelog; the cluster's and input topic's ids (a checkpoint's
owner); the state topics' policy and ids (runtime/state_topics.py: refused
when not compacted, watched while running); the store; with mixing, the
board and the mix topic's tail. Each resource is registered with the
caller's :class:`~contextlib.ExitStack` as it opens, so whatever opened is
closed, in reverse order, however start-up ends.
The stream (the poll loop's consumer and producer) opens last, once the
rebalance callbacks exist (:meth:`Startup.open_stream`). Every wait on the
brokers is retried until it works or the service is stopped: a stop
meanwhile returns None.

``--processing-guarantee exactly-once`` is refused here, before anything is
opened, where it could not hold (:func:`refuse_exactly_once_without`: without
the Kafka store), and on the embedded broker once its cluster id is read
(:func:`refuse_exactly_once_on`); its stream gets the instance's transactional
id (:func:`transactional_id`). It takes delayed labels (the pending changelog's
records join the span's transaction) and mixing (the mix records are outputs of
the span; the mix topic's reader reads committed records only).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from functools import partial
from uuid import uuid4

from perceptron_stream.config import ServeSettings, invalid_setting, signing_key
from perceptron_stream.kafka import (
    DEFAULT_MAX_MESSAGE_BYTES,
    CompactedTopic,
    KafkaFatal,
    PartitionedLog,
    RecordLimits,
    StreamOptions,
    TopicSpec,
    TopicTail,
    cluster_identity,
    ensure_topics,
    open_stream,
    partition_counts,
    record_limits,
    require_codecs,
    require_mends,
)
from perceptron_stream.pipeline.mixer import MixBoard
from perceptron_stream.runtime.factory import model_meta, policy_client_id
from perceptron_stream.runtime.mixing import MixFeed
from perceptron_stream.runtime.retry import Retry, StartupError, fatal
from perceptron_stream.runtime.state_topics import StateTopics, state_topics
from perceptron_stream.state.checkpoint import GROUP_TASK, Owner
from perceptron_stream.state.kafka_store import KafkaStore
from perceptron_stream.state.local import LocalStore
from perceptron_stream.state.store import Store

log = logging.getLogger("perceptron_stream")

#: Settings of the checkpoint and mix topics when the service creates them:
#: compacted, with segments rolled hourly (compaction never touches the active
#: segment, and a start reads every record left), and room for a large model
#: (the checkpoint producer sends up to 16 MiB).
CHECKPOINT_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "segment.ms": str(3600 * 1000),
    "max.message.bytes": str(16 * 1024 * 1024),
}
#: The pending changelog: compacted, and no record younger than a day compacted away, so a change a crashed
#: run wrote after its last checkpoint is still beside the valid one it replaced when the next run undoes it.
CHANGELOG_TOPIC_CONFIG = {**CHECKPOINT_TOPIC_CONFIG, "min.compaction.lag.ms": str(24 * 3600 * 1000)}


@dataclass(frozen=True)
class Opened:
    """What start-up opened for the tasks and the loop (None: not used with these settings)."""

    owner: Owner  # with the cluster's and the input topic's ids when there is a store
    store: Store | None = None
    changelog: PartitionedLog | None = None  # the Kafka store's pending changelog (--label-topic)
    board: MixBoard | None = None  # every partition's latest mixing state (--mix-every)
    mix_feed: MixFeed | None = None  # the mix topic's new records into the board
    state_topics: StateTopics | None = None  # the checkpoint, changelog and mix topics, checked while running
    limits: RecordLimits | None = None  # the largest record each topic the service writes accepts


#: The cluster id the embedded broker (Tansu, ``perceptron-stream broker``) reports: Apache Kafka's are random
#: base64 uuids. Exactly-once is refused on it: its read_committed readers see aborted records, and its
#: TxnOffsetCommit ignores the group generation (a zombie is not fenced): tests/integration/test_transactions.py.
EMBEDDED_BROKER_CLUSTER_ID = "tansu_cluster"


def refuse_exactly_once_on(s: ServeSettings, cluster_id: str | None) -> None:
    """Exactly-once on the embedded broker (by its cluster id): a bad setting (ConfigError, exit 2) naming it, as
    exactly-once without the Kafka store is (ServeSettings checks that one before anything starts)."""
    if s.processing_guarantee == "exactly-once" and cluster_id == EMBEDDED_BROKER_CLUSTER_ID:
        raise invalid_setting(
            "processing_guarantee",
            f"--processing-guarantee exactly-once cannot hold on the embedded broker at "
            f"{s.bootstrap_servers} (cluster id {cluster_id!r}): its read_committed readers see aborted "
            "records and it does not fence a zombie by its group generation; use Apache Kafka, or "
            "--processing-guarantee at-least-once",
        )


def written_topics(s: ServeSettings) -> list[str]:
    """Every topic the service writes, for their record limits (:class:`~perceptron_stream.kafka.RecordLimits`)."""
    topics = [s.output_topic, s.dlq_topic]
    if s.label_topic is not None:
        topics += [s.outcome_topic] + ([s.pending_topic] if s.state_store == "kafka" else [])
    if s.state_store == "kafka":
        topics.append(s.checkpoint_topic)
    if s.model_scope == "partition" and s.mix_every:
        topics.append(s.mix_topic)
    if s.model_history_topic is not None:
        topics.append(s.model_history_topic)
    return topics


def transactional_id(s: ServeSettings) -> str | None:
    """The stream's transactional id under exactly-once (None under at-least-once): one per instance, new at each
    start, ``<group id>-<random hex>``.

    Per instance, not per task (Kafka Streams' exactly_once_v2: one producer per thread): the group coordinator
    fences a zombie by its group generation when it commits offsets in a transaction (KIP-447), so the id need not
    follow the partitions. The cost: a crashed instance's open transaction is not aborted by its successor (another
    id) but by the transaction coordinator after TRANSACTION_TIMEOUT_MS, and until then read_committed readers of
    the partitions it wrote wait at its first record.
    """
    return f"{s.group_id}-{uuid4().hex}" if s.processing_guarantee == "exactly-once" else None


class Startup:
    def __init__(
        self, settings: ServeSettings, retry: Retry, metrics, stopping: Callable[[], bool], resources: ExitStack
    ):
        self.settings, self.retry, self.metrics, self.stopping, self.resources = (
            settings,
            retry,
            metrics,
            stopping,
            resources,
        )
        self.limits: RecordLimits | None = None  # read by open(), for the stream and the stores

    def open(self) -> Opened | None:
        """Codecs, topics, labels' topics and changelog, cluster identity, store, mixing; None when stopped meanwhile."""
        s, until = self.settings, self.retry.until_it_works
        try:
            require_mends()  # before any client: a kafka-python the mends were not checked against is refused
        except KafkaFatal as exc:
            raise fatal(exc, "build kafka-python's clients") from None
        try:
            require_codecs()
        except KafkaFatal as exc:
            raise fatal(exc, "read compressed records") from None
        topics = [
            TopicSpec(name, s.topic_partitions, s.topic_replication_factor)
            for name in (s.input_topic, s.output_topic, s.dlq_topic)
        ]
        if s.state_store == "kafka":
            topics.append(TopicSpec(s.checkpoint_topic, 1, s.topic_replication_factor, CHECKPOINT_TOPIC_CONFIG))
        if s.model_scope == "partition" and s.mix_every:
            topics.append(TopicSpec(s.mix_topic, 1, s.topic_replication_factor, CHECKPOINT_TOPIC_CONFIG))
        if s.model_history_topic is not None:  # one partition: a task's records in the order they were made
            topics.append(TopicSpec(s.model_history_topic, 1, s.topic_replication_factor))
        until(
            lambda: ensure_topics(s, topics, s.create_topics), "check the topics"
        )  # they may have answered: no "reach"
        if self.stopping():
            return None
        changelog = None
        if s.label_topic is not None:
            labels_ok, changelog = self._open_labels(s.label_topic)
            if not labels_ok:
                return None
        # a topic that sets no max.message.bytes of its own takes the brokers' message.max.bytes, which the
        # service cannot read: Kafka's default, or more where --max-message-bytes says the brokers take more
        # (its description: keep it 1 KiB or more under the brokers' message.max.bytes)
        default = max(DEFAULT_MAX_MESSAGE_BYTES, s.max_message_bytes + 1024)
        limits = until(lambda: record_limits(s, written_topics(s), default), "read the topics' max.message.bytes")
        if limits is None:
            return None
        if s.dlq_topic in limits.keyed:  # a dead letter of an input without a key has none: refused for good
            raise StartupError(
                f"dead-letter topic {s.dlq_topic} is compacted (cleanup.policy=compact): it would refuse the dead "
                "letter of every input without a key; give it cleanup.policy=delete (kafka-configs.sh --alter "
                f"--entity-type topics --entity-name {s.dlq_topic} --add-config cleanup.policy=delete)"
            )
        if changelog is not None:
            changelog.limits = limits
        self.limits = limits
        owner = Owner(s.group_id, s.input_topic)
        watch = StateTopics(s, self.retry)
        self.resources.callback(watch.watch.close)
        if s.state_store != "none" or state_topics(s):
            ids = until(lambda: cluster_identity(s, s.input_topic), "read the cluster's and the input topic's ids")
            if ids is None:
                return None
            refuse_exactly_once_on(s, ids[0])
            if s.state_store != "none":
                owner = Owner(s.group_id, s.input_topic, GROUP_TASK, *ids)
            # before the store reads any of them: a topic the brokers created with their defaults is refused here
            if not watch.start(embedded=ids[0] == EMBEDDED_BROKER_CLUSTER_ID):
                return None
        store = self._open_store()
        if store is None and s.state_store != "none":
            return None
        board = mix_feed = None
        if s.model_scope == "partition" and s.mix_every:
            board, mix_feed = self._open_mixing(owner)
        return Opened(owner, store, changelog, board, mix_feed, watch, limits)

    def open_stream(self, on_assigned, on_revoked, on_lost):
        """The poll loop's consumer and producer, the rebalance callbacks given (closed by the caller, after its
        final checkpoint); None when stopped meanwhile."""
        s, tx_id = self.settings, transactional_id(self.settings)
        if tx_id is not None:  # the instance's transactions as the brokers list them (kafka-transactions.sh list)
            log.info("exactly-once: transactions under transactional id %s", tx_id)
        return self.retry.until_it_works(
            lambda: open_stream(
                s,
                s.kafka_client,
                StreamOptions(
                    group_id=s.group_id,
                    topics=[s.input_topic] + ([s.label_topic] if s.label_topic else []),
                    auto_offset_reset=s.auto_offset_reset,
                    on_assigned=on_assigned,
                    on_revoked=on_revoked,
                    on_lost=on_lost,
                    max_poll_records=s.batch_size,
                    fetch_max_wait_ms=s.fetch_max_wait_ms,
                    group_protocol=s.group_protocol,
                    transactional_id=tx_id,
                    client_id=policy_client_id(s),
                    batch_bytes=None if self.limits is None else self.limits.smallest(),
                ),
            ),
            "connect the consumer and producer",
        )

    def _open_store(self) -> Store | None:
        """The store the operator chose, signing with --checkpoint-key (None: no store, or stopped meanwhile)."""
        s = self.settings
        store: Store | None = None
        if s.state_store == "local":
            store = LocalStore(s.state_dir, s.group_id)
        elif s.state_store == "kafka":
            store = self.retry.until_it_works(
                lambda: KafkaStore(CompactedTopic(s, s.checkpoint_topic, self.limits), s.group_id),
                "connect to the checkpoint topic",
            )
        if store is not None:
            self.resources.callback(store.close)
            store.key = signing_key(s)
            store.on_reject = partial(self.metrics.reject_state, "checkpoint")
        return store

    def _open_labels(self, label_topic: str) -> tuple[bool, PartitionedLog | None]:
        """Delayed labels: the label topic partitioned like the input (a label and its point share a partition number,
        so one task holds both), the outcome topic, and with the Kafka store the pending changelog."""
        s, until = self.settings, self.retry.until_it_works
        counts = until(
            lambda: partition_counts(s, [s.input_topic, label_topic]), "count the input and label topics' partitions"
        )
        if counts is None:
            return False, None
        n = counts[s.input_topic]
        topics = [
            TopicSpec(label_topic, n, s.topic_replication_factor),
            TopicSpec(s.outcome_topic, s.topic_partitions, s.topic_replication_factor),
        ]
        if s.state_store == "kafka":
            topics.append(TopicSpec(s.pending_topic, n, s.topic_replication_factor, CHANGELOG_TOPIC_CONFIG))
        if (
            until(lambda: ensure_topics(s, topics, s.create_topics), "check the label, outcome and changelog topics")
            is None
            and self.stopping()
        ):
            return False, None
        counts = until(
            lambda: partition_counts(s, [label_topic] + ([s.pending_topic] if s.state_store == "kafka" else [])),
            "count the label topic's partitions",
        )
        if counts is None:
            return False, None
        for topic, count in counts.items():
            if count != n:
                raise StartupError(
                    f"topic {topic} has {count} partition(s) and input topic {s.input_topic} has {n}: a label "
                    f"and its point must land in the same partition number (both keyed alike), so {topic} "
                    f"needs {n} partitions too (recreate it, or add partitions)"
                )
        changelog = None
        if s.state_store == "kafka":
            changelog = until(lambda: PartitionedLog(s, s.pending_topic), "open the pending changelog")
            if changelog is not None:
                self.resources.callback(changelog.close)
                changelog.on_reject = partial(self.metrics.reject_state, "changelog")  # what its restores refuse
        return True, changelog

    def _open_mixing(self, owner: Owner) -> tuple[MixBoard | None, MixFeed | None]:
        """Partition scope with --mix-every: the board of every partition's latest state, fed from the mix topic."""
        s = self.settings
        counts = self.retry.until_it_works(
            lambda: partition_counts(s, [s.input_topic]), f"count the partitions of {s.input_topic}"
        )
        if counts is None:
            return None, None
        board = MixBoard(
            owner,
            model_meta(s),
            counts[s.input_topic],
            signing_key(s),
            on_reject=partial(self.metrics.reject_state, "mix"),
            every=s.mix_every,
        )
        tail = self.retry.until_it_works(lambda: TopicTail(s, s.mix_topic), "read the mix topic")
        if tail is None:
            return board, None
        feed = MixFeed(board, tail, self.retry)
        self.resources.callback(feed.close)
        return board, feed
