"""A transactional stream (``open_stream(..., transactional_id=...)``) on both clients: what a transaction makes
visible, and the zombie it fences.

On Apache Kafka a committed transaction's records and input positions are
visible together, an aborted one's never; an instance frozen past its session
timeout, whose partition moved to another member, can commit nothing when it
thaws (KIP-447: the group's generation fences it; or its transaction timed out
and its producer's epoch went). The embedded broker cannot prove any of this:
it shows aborted records to read_committed readers (``embedded_only`` test
below), which is why exactly-once is to be refused on it. The readers of the
compacted topics (checkpoints, mixes, changelog) never see an aborted record.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest
from confluent_kafka import Producer
from kafka import KafkaConsumer, TopicPartition
from perceptron_stream.config import KafkaSettings
from perceptron_stream.kafka import (
    TRANSACTION_TIMEOUT_MS,
    CompactedTopic,
    Fenced,
    PartitionedLog,
    Stream,
    TopicTail,
    committed_offsets,
    open_stream,
)
from perceptron_stream.kafka.kafka_python import KafkaIO

from tests.support.topics import create_topic, end_offset, produce, stable_offsets
from tests.support.waiting import wait_until

CLIENTS = ["kafka-python", "confluent"]


def _stream(bootstrap: str, client: str, topics: dict, transactional_id: str) -> Stream:
    return open_stream(
        KafkaSettings(bootstrap_servers=bootstrap),
        client,
        group_id=topics["group_id"],
        topics=[topics["input_topic"]],
        auto_offset_reset="earliest",
        on_assigned=lambda partitions: None,
        on_revoked=lambda partitions: None,
        max_poll_records=1000,
        fetch_max_wait_ms=20,
        transactional_id=transactional_id,
    )


def _poll_some(stream: Stream, max_records: int, timeout_s: float = 60.0) -> list:
    """The records (at most ``max_records``) of the first poll that returns some."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        records = [r for batch in stream.poll(200, max_records) for r in batch]
        if records:
            return records
    raise AssertionError(f"no record polled within {timeout_s:.0f} s")


def _visible(bootstrap: str, topic: str, partition: int = 0) -> list[bytes]:
    """The values a read_committed reader sees in ``topic``'s ``partition``, up to its last stable offset."""
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, isolation_level="read_committed"
    )
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]  # read_committed: the last stable offset
        values: list[bytes] = []
        deadline = time.monotonic() + 30
        while consumer.position(tp) < end and time.monotonic() < deadline:
            values += [r.value for r in consumer.poll(timeout_ms=200).get(tp, [])]
        assert consumer.position(tp) >= end, f"read up to {consumer.position(tp)} of {end}"
        return values
    finally:
        consumer.close()


def _transactions_over(bootstrap: str, topic: str, partition: int = 0, timeout: float = 60.0) -> int:
    """Once no transaction is open on ``topic``'s ``partition`` (its last stable offset is its end): that end.

    A transaction's end is acknowledged (EndTxn) before the broker has written its markers, so right after a
    commit or an abort a read_committed reader may still stop before the transaction's records: what it sees
    then would fail a check after a commit, and prove nothing after an abort.
    """
    readers = [
        KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, isolation_level=level)
        for level in ("read_committed", "read_uncommitted")
    ]
    tp = TopicPartition(topic, partition)

    def end_if_stable() -> list[int] | None:
        stable, end = (reader.end_offsets([tp])[tp] for reader in readers)
        return [end] if stable == end else None

    try:
        return wait_until(end_if_stable, timeout, what=f"the markers of every transaction on {tp}")[0]
    finally:
        for reader in readers:
            reader.close()


def _next_position(records: list) -> dict[tuple[str, int], int]:
    return {(records[-1].topic, records[-1].partition): records[-1].offset + 1}


@pytest.mark.parametrize("client", CLIENTS)
def test_a_committed_transaction_shows_its_records_and_positions_an_aborted_one_neither(client, apache_kafka, topics):
    bootstrap, source, sink = apache_kafka.bootstrap_servers, topics["input_topic"], topics["output_topic"]
    settings = KafkaSettings(bootstrap_servers=bootstrap)
    create_topic(bootstrap, sink)
    produce(bootstrap, source, [f"in-{n}".encode() for n in range(15)])
    stream = _stream(bootstrap, client, topics, f"tx-{topics['group_id']}")
    try:
        first = _poll_some(stream, 5)
        stream.begin()
        for r in first:
            stream.send(sink, r.key, b"out-" + r.value)
        assert stream.commit_transaction(_next_position(first), timeout_s=30) == []
        committed_values = [b"out-" + r.value for r in first]
        _transactions_over(bootstrap, sink)
        assert _visible(bootstrap, sink) == committed_values
        # stable: the offsets' commit is pending until its markers are written too (read before: the ones before)
        assert committed_offsets(settings, topics["group_id"], source, stable=True) == {0: first[-1].offset + 1}

        second = _poll_some(stream, 5)
        stream.begin()
        for r in second:
            stream.send(sink, r.key, b"out-" + r.value)
        assert stream.flush(30) == []  # in the log, then aborted
        stream.abort()
        _transactions_over(bootstrap, sink)  # the reader goes past the aborted records, not up to them
        assert _visible(bootstrap, sink) == committed_values
        assert committed_offsets(settings, topics["group_id"], source, stable=True) == {0: first[-1].offset + 1}

        stream.begin()  # the stream goes on after an abort
        stream.send(sink, None, b"after the abort")
        assert stream.commit_transaction(_next_position(second), timeout_s=30) == []
        _transactions_over(bootstrap, sink)
        assert _visible(bootstrap, sink) == [*committed_values, b"after the abort"]
        assert committed_offsets(settings, topics["group_id"], source, stable=True) == {0: second[-1].offset + 1}
    finally:
        stream.close()


@pytest.mark.parametrize("client", CLIENTS)
def test_send_to_writes_a_partition_of_the_transaction(client, apache_kafka, topics):
    """The pending changelog is partitioned like the input: its records go to a partition named, in the span's
    transaction."""
    bootstrap, changelog = apache_kafka.bootstrap_servers, topics["output_topic"]
    create_topic(bootstrap, changelog, partitions=2)
    produce(bootstrap, topics["input_topic"], [b"in-0"])
    stream = _stream(bootstrap, client, topics, f"tx-{topics['group_id']}")
    try:
        records = _poll_some(stream, 1)
        stream.begin()
        stream.send_to(changelog, 1, b"k", b"aborted")
        assert stream.flush(30) == []
        stream.abort()
        stream.begin()
        stream.send_to(changelog, 1, b"k", b"committed")
        assert stream.commit_transaction(_next_position(records), timeout_s=30) == []
        with pytest.raises(RuntimeError, match="begin"):  # outside a transaction it would be an at-least-once write
            stream.send_to(changelog, 1, b"k", b"no transaction")
    finally:
        stream.close()
    _transactions_over(bootstrap, changelog, 1)
    assert _visible(bootstrap, changelog, 1) == [b"committed"]
    assert _visible(bootstrap, changelog, 0) == []


@pytest.mark.parametrize("client", CLIENTS)
def test_a_transaction_left_open_is_aborted_after_its_timeout_and_fences_its_producer(client, apache_kafka, topics):
    """What a crashed (or frozen) instance's open transaction costs: read_committed readers of its partitions
    wait, not for ever: the coordinator aborts it once TRANSACTION_TIMEOUT_MS is over (it looks every second here,
    the test broker's transaction.abort.timed.out.transaction.cleanup.interval.ms; 10 s by default), and the
    producer can commit nothing."""
    bootstrap, sink = apache_kafka.bootstrap_servers, topics["output_topic"]
    create_topic(bootstrap, sink)
    produce(bootstrap, topics["input_topic"], [b"in-0"])
    stream = _stream(bootstrap, client, topics, f"tx-{topics['group_id']}")
    reader = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, isolation_level="read_committed")
    tp = TopicPartition(sink, 0)
    try:
        records = _poll_some(stream, 1)
        began = time.monotonic()  # the coordinator's clock starts between here (the first send) and the flush
        stream.begin()
        stream.send(sink, None, b"left open")
        assert stream.flush(30) == []
        flushed = time.monotonic()
        assert reader.end_offsets([tp])[tp] == 0  # readers wait at the open transaction (its last stable offset)
        # one reader asking every 0.1 s: the abort is seen within moments of its markers, however loaded the machine
        wait_until(lambda: reader.end_offsets([tp])[tp] > 0, 60, 0.1, "the coordinator's abort")
        aborted = time.monotonic()
        timeout_s = TRANSACTION_TIMEOUT_MS / 1000
        assert aborted - began >= timeout_s - 1, aborted - began  # not before the timeout
        assert aborted - flushed <= timeout_s + 1 + 5, aborted - flushed  # the stream's timeout, and a look-up
        with pytest.raises(Fenced):
            stream.commit_transaction(_next_position(records), timeout_s=30)
    finally:
        reader.close()
        stream.close()
    assert _visible(bootstrap, sink) == []
    assert (
        committed_offsets(KafkaSettings(bootstrap_servers=bootstrap), topics["group_id"], topics["input_topic"]) == {}
    )


def _zombie(client: str, bootstrap: str, topics: dict, conn) -> None:
    """Instance A, in a process of its own (the test freezes it): reads a few records, sends their outputs in an
    open transaction, says so, and once told, tries to commit; reports what the commit raised."""
    stream = _stream(bootstrap, client, topics, f"a-{topics['group_id']}")
    try:
        records = _poll_some(stream, 5)
        stream.begin()
        for r in records:
            stream.send(topics["output_topic"], r.key, b"zombie-" + r.value)
        stream.flush(30)  # in the log: only the transaction's end decides whether it is seen
        conn.send(_next_position(records))
        conn.recv()
        try:
            stream.commit_transaction(_next_position(records), timeout_s=30)
            conn.send(("committed", ""))
        except Exception as exc:  # the test asserts which
            conn.send((type(exc).__name__, str(exc)))
    finally:
        stream.close()


@pytest.mark.parametrize("client", CLIENTS)
def test_a_zombie_whose_partition_moved_can_commit_nothing(client, apache_kafka, topics):
    """A freezes with a transaction open; B joins the group and takes the partition once A's session (6 s) is
    over, and commits its own transaction; A thaws and tries to commit: Fenced, none of its records visible,
    the group's committed offset B's."""
    bootstrap, source, sink = apache_kafka.bootstrap_servers, topics["input_topic"], topics["output_topic"]
    create_topic(bootstrap, sink)
    inputs = [f"in-{n}".encode() for n in range(20)]
    produce(bootstrap, source, inputs)
    context = multiprocessing.get_context("spawn")  # a clean process: this one runs client threads
    here, there = context.Pipe()
    zombie = context.Process(target=_zombie, args=(client, bootstrap, topics, there), daemon=True)
    zombie.start()
    assert zombie.pid is not None
    b = None
    try:
        assert here.poll(90), "A read nothing"
        a_positions = here.recv()
        assert a_positions[(source, 0)] <= 5
        os.kill(zombie.pid, signal.SIGSTOP)

        b = _stream(bootstrap, client, topics, f"b-{topics['group_id']}")
        read: list = []
        while len(read) < len(inputs):  # from offset 0: A committed nothing
            read += _poll_some(b, 1000)
        b.begin()
        for r in read:
            b.send(sink, r.key, b"b-" + r.value)
        assert b.commit_transaction(_next_position(read), timeout_s=30) == []

        os.kill(zombie.pid, signal.SIGCONT)
        here.send("commit")
        assert here.poll(90), "A's commit never ended"
        outcome, message = here.recv()
        assert outcome == Fenced.__name__, message

        b_values = [b"b-" + v for v in inputs]
        assert wait_until(lambda: _visible(bootstrap, sink) == b_values or None, 60, 1.0, "B's records alone")
        assert committed_offsets(KafkaSettings(bootstrap_servers=bootstrap), topics["group_id"], source) == {
            0: len(inputs)
        }
    finally:
        if zombie.is_alive():
            os.kill(zombie.pid, signal.SIGCONT)
        zombie.join(30)
        if zombie.is_alive():
            zombie.kill()
        if b is not None:
            b.close()


@pytest.mark.embedded_only
@pytest.mark.parametrize("client", CLIENTS)
def test_the_embedded_broker_shows_an_aborted_transactions_records(client, broker, topics):
    """Why exactly-once cannot be offered on the embedded broker: it accepts transactions, but a read_committed
    reader sees what an aborted one sent."""
    bootstrap, sink = broker.bootstrap_servers, topics["output_topic"]
    create_topic(bootstrap, sink)
    produce(bootstrap, topics["input_topic"], [b"in-0"])
    stream = _stream(bootstrap, client, topics, f"tx-{topics['group_id']}")
    try:
        stream.begin()
        stream.send(sink, None, b"aborted")
        assert stream.flush(30) == []
        stream.abort()
    finally:
        stream.close()
    assert _visible(bootstrap, sink) == [b"aborted"]


def test_the_compacted_topics_readers_never_restore_an_aborted_record(apache_kafka, topics):
    """Checkpoints, mix records and changelog records go into their span's transaction under exactly-once: the
    readers of those topics read committed records only."""
    bootstrap, topic = apache_kafka.bootstrap_servers, topics["output_topic"]
    settings = KafkaSettings(bootstrap_servers=bootstrap)
    create_topic(bootstrap, topic)
    writer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"store-{topics['group_id']}"})
    writer.init_transactions(30)
    for value, commit in ((b"committed", True), (b"aborted", False)):
        writer.begin_transaction()
        writer.produce(topic, value, b"checkpoint", partition=0)
        assert writer.flush(30) == 0  # in the log before the transaction ends
        writer.commit_transaction(30) if commit else writer.abort_transaction(30)

    store = CompactedTopic(settings, topic)
    try:
        assert store.read_latest({b"checkpoint"}) == {b"checkpoint": b"committed"}
    finally:
        store.close()
    log = PartitionedLog(settings, topic)
    try:
        assert list(log.read(0, timeout_s=30)) == [(b"checkpoint", b"committed")]
    finally:
        log.close()
    end, tp = _transactions_over(bootstrap, topic), TopicPartition(topic, 0)  # both markers written: the log's end
    tail = TopicTail(settings, topic)
    try:
        seen: list = []

        def at_the_end() -> bool:  # the tail has no end of its own: read until it stands past the aborted record
            seen.extend(tail.poll(200))
            return tail.consumer.position(tp) >= end

        wait_until(at_the_end, 60, 0, what=f"the tail at the end of {topic} ({end})")
        assert seen == [(b"checkpoint", b"committed")]
    finally:
        tail.close()


def test_the_compacted_topics_readers_wait_for_a_transaction_open_when_they_began(apache_kafka, topics):
    """Instances share the one-partition checkpoint topic: a crashed one's open transaction holds its last stable
    offset back while another commits a checkpoint after it. A restore must read that checkpoint, not stop at the
    last stable offset: the readers end once every transaction open when they began is over."""
    bootstrap, topic = apache_kafka.bootstrap_servers, topics["output_topic"]
    settings = KafkaSettings(bootstrap_servers=bootstrap)
    create_topic(bootstrap, topic)
    crashed = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"crashed-{topics['group_id']}"})
    live = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"live-{topics['group_id']}"})
    for writer in (crashed, live):
        writer.init_transactions(30)
        writer.begin_transaction()
    crashed.produce(topic, b"left open", b"a", partition=0)
    assert crashed.flush(30) == 0
    live.produce(topic, b"committed after it", b"b", partition=0)
    assert live.flush(30) == 0
    live.commit_transaction(30)
    assert end_offset(bootstrap, topic, read_committed=True) == 0  # held back by the open transaction

    store, log = CompactedTopic(settings, topic), PartitionedLog(settings, topic)
    changelog: list = []
    reading = threading.Thread(target=lambda: changelog.extend(log.read(0, timeout_s=30)))  # both readers at once
    reading.start()
    aborting = threading.Timer(2.0, crashed.abort_transaction, (30,))  # as the coordinator does after its timeout
    aborting.start()
    try:
        assert store.read_latest({b"a", b"b"}) == {b"b": b"committed after it"}
        reading.join(30)
        assert changelog == [(b"b", b"committed after it")]
    finally:
        aborting.join()
        reading.join(30)
        store.close()
        log.close()


def test_stable_committed_offsets_wait_for_the_transaction_that_commits_them(apache_kafka, topics):
    """A transaction committed just before a rebalance is acknowledged before its markers are written: the next
    owner reads the group's offsets as a read_committed consumer does (require_stable), never the ones before it."""
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as Partition

    bootstrap, group, topic = apache_kafka.bootstrap_servers, topics["group_id"], topics["input_topic"]
    settings = KafkaSettings(bootstrap_servers=bootstrap)
    produce(bootstrap, topic, [b"in-0"])
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"})
    writer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"offsets-{group}"})
    try:
        member.subscribe([topic])
        wait_until(lambda: member.poll(0.2) is not None and member.assignment(), 60, what="the member's partition")
        writer.init_transactions(30)
        writer.begin_transaction()
        writer.send_offsets_to_transaction([Partition(topic, 0, 1)], member.consumer_group_metadata(), 30)
        stable: dict = {}
        failed: list[BaseException] = []

        def read_stable() -> None:
            """As the service's restore does: a read refused for longer than its own timeout (10 s) is asked again,
            for as long as the test may take under load; anything else fails the test (from here, after join)."""
            try:
                stable.update(stable_offsets(settings, group, topic, timeout=120))
            except BaseException as exc:
                failed.append(exc)

        reading = threading.Thread(target=read_stable, daemon=True)
        reading.start()
        time.sleep(2.0)
        assert committed_offsets(settings, group, topic) == {}  # what the admin call saw: the offsets before it
        assert stable == {} and not failed  # still asking
        writer.commit_transaction(30)
        reading.join(150)
        assert not reading.is_alive(), "the stable read never ended"
        if failed:
            raise failed[0]
        assert stable == {0: 1}
    finally:
        member.close()


def test_a_commit_without_a_member_id_is_never_sent_for_the_coordinator_would_take_it_unchecked(apache_kafka, topics):
    """kafka-python resets its member id and generation when its heartbeat learns that the group removed it (a
    frozen instance, thawed), before its next poll tells the application. The group coordinator checks a
    transactional offset commit only against the member id and generation it carries: one with neither is taken
    unchecked, in a group with members (shown first, with a bare producer). So the stream sends none: it aborts
    and raises Fenced, and nothing of the transaction shows."""
    from kafka import KafkaProducer
    from kafka.structs import ConsumerGroupMetadata, OffsetAndMetadata

    bootstrap, source, sink = apache_kafka.bootstrap_servers, topics["input_topic"], topics["output_topic"]
    settings, group = KafkaSettings(bootstrap_servers=bootstrap), topics["group_id"]
    create_topic(bootstrap, sink)
    produce(bootstrap, source, [f"in-{n}".encode() for n in range(15)])
    stream = _stream(bootstrap, "kafka-python", topics, f"tx-{group}")
    bare = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"bare-{group}")
    try:
        records = _poll_some(stream, 5)  # the stream's consumer is the group's member
        bare.init_transactions()
        bare.begin_transaction()
        bare.send(sink, b"a zombie's output")
        anonymous = ConsumerGroupMetadata(group_id=group)  # generation -1, no member id: what a reset client holds
        bare.send_offsets_to_transaction({TopicPartition(source, 0): OffsetAndMetadata(2, "", -1)}, anonymous)
        bare.commit_transaction()  # taken: the hazard
        _transactions_over(bootstrap, sink)
        assert _visible(bootstrap, sink) == [b"a zombie's output"]
        assert committed_offsets(settings, group, source, stable=True) == {0: 2}

        stream.begin()
        for r in records:
            stream.send(sink, r.key, b"out-" + r.value)
        assert isinstance(stream, KafkaIO)
        stream.consumer._coordinator.reset_generation()  # noqa: SLF001 — what its heartbeat does on eviction
        with pytest.raises(Fenced, match="the group removed this instance"):
            stream.commit_transaction(_next_position(records), timeout_s=30)
        _transactions_over(bootstrap, sink)
        assert _visible(bootstrap, sink) == [b"a zombie's output"]  # none of the stream's outputs
        assert committed_offsets(settings, group, source, stable=True) == {0: 2}  # nor its offsets
    finally:
        bare.close()
        stream.close()
