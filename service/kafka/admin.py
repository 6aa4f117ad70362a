"""The admin calls, on kafka-python whichever client runs the poll loop: topics, group offsets and members,
the cluster's identity, partition counts and log ranges. None is on the hot path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from kafka.errors import KafkaError, TopicAlreadyExistsError
from perceptron_stream.config import KafkaSettings
from perceptron_stream.kafka.backoff import Backoff
from perceptron_stream.kafka.contract import MissingTopicError, RecordLimits, TopicSpec
from perceptron_stream.kafka.errors import FATAL_ERRORS, translated
from perceptron_stream.kafka.kp_mends import AdminClient, close_consumer
from perceptron_stream.kafka.kp_options import READ_FETCH_MAX_WAIT_MS, kafka_python_options

log = logging.getLogger(__name__)
#: What the service did, said under its own logger: the Kafka layer's (``log``) is quiet at start-up until the
#: brokers first answer (runtime/outage.py), which swallowed "created topic" for the topics created then.
said = logging.getLogger("perceptron_stream")


@translated
def ensure_topics(settings: KafkaSettings, topics: Iterable[TopicSpec], create: bool, timeout_s: float = 0.0) -> None:
    """Create the topics that are missing, or fail naming them when ``create`` is off.

    Connecting is retried for ``timeout_s`` (0: one attempt, for callers with a retry loop of their own).
    """
    topics = list(topics)
    admin = _retrying(
        lambda: KafkaAdminClient(**kafka_python_options(settings), request_timeout_ms=10_000),
        "connect to the brokers",
        timeout_s,
    )
    try:
        existing = set(admin.list_topics())
        missing = [t for t in topics if t.name not in existing]
        if missing and not create:
            names = ", ".join(t.name for t in missing)
            raise MissingTopicError(
                f"topics {names} do not exist and create_topics is off (--create-topics or create them)"
            )
        for topic in missing:
            try:
                admin.create_topics(
                    [NewTopic(topic.name, topic.partitions, topic.replication_factor, topic_configs=dict(topic.config))]
                )
                said.info("created topic %s with %d partition(s)", topic.name, topic.partitions)
            except TopicAlreadyExistsError:
                pass
    finally:
        admin.close()


def _retrying(action: Callable, what: str, timeout_s: float):
    """Run ``action`` until it works, backing off, for at most ``timeout_s``."""
    backoff, deadline = Backoff(), time.monotonic() + timeout_s
    while True:
        try:
            return action()
        except FATAL_ERRORS:
            raise
        except KafkaError as exc:
            if time.monotonic() + backoff.delay > deadline:
                raise
            delay = backoff.next()
            log.warning("could not %s (%s); retrying in %.1f s", what, exc.__class__.__name__, delay)
            time.sleep(delay)


@translated
def committed_offsets(settings: KafkaSettings, group_id: str, topic: str, stable: bool = False) -> dict[int, int]:
    """Partition → committed next offset of consumer group ``group_id`` on ``topic`` (none: {}).

    ``stable``: refused (KafkaUnavailable: ask again) while a transaction that commits offsets of the group is
    not over, as a read_committed consumer asks (KIP-447's require_stable). An exactly-once restore reads them
    so: a transaction committed just before a rebalance is acknowledged before its markers are written, and the
    next owner would otherwise read the offsets before it and restore the checkpoint before it, publishing the
    span again.
    """
    if stable:
        return _stable_committed_offsets(settings, group_id, topic)
    admin = AdminClient(**kafka_python_options(settings), request_timeout_ms=10_000)
    try:
        offsets = admin.list_group_offsets(group_id).get(group_id, {})
    finally:
        admin.close()
    return {tp.partition: o.offset for tp, o in offsets.items() if tp.topic == topic and o.offset >= 0}


def _stable_committed_offsets(settings: KafkaSettings, group_id: str, topic: str) -> dict[int, int]:
    """What a read_committed consumer of the group is told (UnstableOffsetCommitError while a commit is pending),
    asked without joining the group."""
    consumer = KafkaConsumer(
        **kafka_python_options(settings),
        group_id=group_id,
        enable_auto_commit=False,
        isolation_level="read_committed",
        request_timeout_ms=10_000,
    )
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        offsets = {p: consumer.committed(TopicPartition(topic, p), timeout_ms=10_000) for p in sorted(partitions)}
        return {p: o for p, o in offsets.items() if o is not None and o >= 0}
    finally:
        close_consumer(consumer, autocommit=False)


@translated
def group_members(settings: KafkaSettings, group_id: str) -> dict[str, str]:
    """Member id → client id of consumer group ``group_id``'s members as its coordinator reports them
    (DescribeGroups).

    A member that died without leaving is listed until its session times out
    (on Tansu: until the next join evicts it).
    """
    admin = AdminClient(**kafka_python_options(settings), request_timeout_ms=10_000)
    try:
        group = admin.describe_groups([group_id])[group_id]
    finally:
        admin.close()
    if group.get("error"):
        raise KafkaError(f"describing consumer group {group_id} failed: {group['error']}")
    return {m["member_id"]: m.get("client_id") or "" for m in group.get("members") or []}


#: Topic ids that mean "none": brokers before Kafka 2.8 answer the zero UUID.
_NO_TOPIC_ID = {None, "", "00000000-0000-0000-0000-000000000000", "AAAAAAAAAAAAAAAAAAAAAA"}


@translated
def cluster_identity(settings: KafkaSettings, topic: str) -> tuple[str | None, str | None]:
    """(the cluster's id, ``topic``'s id) as the brokers report them; None where they report none.

    A checkpoint records both: a topic deleted and created again, or another
    cluster behind the same address, has other ids.
    """
    admin = AdminClient(**kafka_python_options(settings), request_timeout_ms=10_000)
    try:
        cluster_id = admin.describe_cluster().get("cluster_id") or None
        return cluster_id, _topic_ids(admin, [topic])[topic]
    finally:
        admin.close()


def _topic_ids(admin: AdminClient, topics: list[str]) -> dict[str, str | None]:
    """Topic → its id as the brokers report it now, None where it does not exist or the brokers report none (one
    Metadata request, which never creates a topic: kafka-python's admin asks with auto-creation off)."""
    described = {t.get("name"): t for t in admin.describe_topics(topics)}
    ids: dict[str, str | None] = {}
    for name in topics:
        topic = described.get(name) or {}
        topic_id = topic.get("topic_id") if not topic.get("error_code") else None
        ids[name] = None if topic_id in _NO_TOPIC_ID else str(topic_id)
    return ids


class TopicWatch:
    """The ids and configs of the same topics asked again and again (the state topics' watch, every few seconds
    on the poll loop's thread), on one admin client kept open: a new one each time connected anew (bootstrap,
    TLS and SASL handshakes) at every check. A client whose call failed is closed and made anew at the next."""

    def __init__(self, settings: KafkaSettings):
        self.settings = settings
        self._admin: AdminClient | None = None

    def _call(self, ask: Callable[[AdminClient], Any]) -> Any:
        if self._admin is None:
            self._admin = AdminClient(**kafka_python_options(self.settings), request_timeout_ms=10_000)
        try:
            return ask(self._admin)
        except Exception:
            self.close()
            raise

    @translated
    def ids(self, topics: Iterable[str]) -> dict[str, str | None]:
        """Topic → its id (:func:`_topic_ids`)."""
        names = list(topics)
        return self._call(lambda admin: _topic_ids(admin, names))

    @translated
    def configs(self, topics: Iterable[str]) -> dict[str, dict[str, str]]:
        """As :func:`topic_configs`."""
        names = list(topics)
        return self._call(lambda admin: _topic_configs(admin, names))

    def close(self) -> None:
        if self._admin is not None:
            admin, self._admin = self._admin, None
            admin.close()


#: What a broker holds a record batch to when a topic says nothing of its own (Kafka's message.max.bytes default):
#: the embedded broker describes no defaults, so a topic of its that sets none has this bound.
DEFAULT_MAX_MESSAGE_BYTES = 1_048_588


@translated
def topic_configs(settings: KafkaSettings, topics: Iterable[str]) -> dict[str, dict[str, str]]:
    """Topic → {config name: value} as the brokers apply them to the topic (DescribeConfigs, every config): its
    own, or else the brokers' (a topic's ``max.message.bytes`` is the brokers' ``message.max.bytes`` unless it sets
    one).

    The embedded broker describes what a topic was created with and no defaults (``{}`` for a topic created
    with none): callers fall back to Kafka's defaults, e.g. :data:`DEFAULT_MAX_MESSAGE_BYTES`.
    """
    admin = AdminClient(**kafka_python_options(settings), request_timeout_ms=10_000)
    try:
        return _topic_configs(admin, list(topics))
    finally:
        admin.close()


def _topic_configs(admin: AdminClient, topics: list[str]) -> dict[str, dict[str, str]]:
    """Topic → {config name: value} (one DescribeConfigs request, every config)."""
    described = admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, t) for t in topics], config_filter="all"
    )
    by_topic = described.get("topic", {}) if isinstance(described, dict) else {}
    return {
        t: {
            name: str(entry.get("value"))
            for name, entry in (by_topic.get(t) or {}).items()
            if entry.get("value") is not None
        }
        for t in topics
    }


def record_limits(
    settings: KafkaSettings, topics: Iterable[str], default: int = DEFAULT_MAX_MESSAGE_BYTES
) -> RecordLimits:
    """The largest record each of ``topics`` accepts (:class:`RecordLimits`): their ``max.message.bytes`` as the
    brokers apply it (the topic's own, or the brokers' ``message.max.bytes``), and ``default`` where the brokers
    describe none (the embedded broker: Kafka's default, or what the operator's settings say the brokers take)."""
    configs = topic_configs(settings, topics)
    return RecordLimits(
        {t: int(c["max.message.bytes"]) for t, c in configs.items() if "max.message.bytes" in c},
        default,
        keyed=[t for t, c in configs.items() if "compact" in c.get("cleanup.policy", "")],
    )


@translated
def partition_counts(settings: KafkaSettings, topics: Iterable[str]) -> dict[str, int]:
    """Topic → number of partitions (0: the topic does not exist)."""
    consumer = KafkaConsumer(**kafka_python_options(settings), enable_auto_commit=False, group_id=None)
    try:
        return {t: len(consumer.partitions_for_topic(t) or ()) for t in topics}
    finally:
        close_consumer(consumer)


@translated
def log_ranges(settings: KafkaSettings, topic: str, timeout_s: float = 10.0) -> dict[int, tuple[int, int]]:
    """Partition → (first offset, end offset) of ``topic``'s logs: where a restored position may lie.

    The end is the larger of ListOffsets' answer and the high watermark of a
    fetch at it: the embedded broker answers ListOffsets with the start of the
    last batch + 1 (README "Brokers"), a fetch tells the true end.
    """
    consumer = KafkaConsumer(
        **kafka_python_options(settings),
        enable_auto_commit=False,
        group_id=None,
        max_poll_records=1,
        fetch_max_bytes=64 * 1024,
        max_partition_fetch_bytes=64 * 1024,
        fetch_max_wait_ms=READ_FETCH_MAX_WAIT_MS,  # an empty log's fetch tells its end at once, not after 500 ms
        request_timeout_ms=int(timeout_s * 1000),
    )
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            raise KafkaError(f"topic {topic} shows no partitions")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        starts = consumer.beginning_offsets(tps, timeout_ms=int(timeout_s * 1000))
        ends = consumer.end_offsets(tps, timeout_ms=int(timeout_s * 1000))
        for tp in tps:
            consumer.seek(tp, max(starts[tp], ends[tp] - 1))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(consumer.highwater(tp) is None for tp in tps):
            consumer.poll(timeout_ms=100)
        return {tp.partition: (starts[tp], max(ends[tp], consumer.highwater(tp) or 0)) for tp in tps}
    finally:
        close_consumer(consumer)
