"""The state topics checked while running and at a restart, on real service processes and brokers.

The trust issue's finding: the checkpoint topic deleted under a running service went unnoticed (the embedded
broker), or came back at the service's next write as an ordinary topic of the brokers' defaults,
``cleanup.policy=delete`` (Apache Kafka), and a restart after it died with a raw KafkaUnavailable traceback
after 30 s (the embedded broker). Now the service stops naming the topic, writes nothing there after, and a
restart says what to do in one line.
"""

from __future__ import annotations

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic
from kafka.errors import KafkaTimeoutError
from perceptron_stream.config import ServeSettings, load
from perceptron_stream.kafka import committed_offsets
from perceptron_stream.kafka.compacted import NO_AUTO_CREATE
from perceptron_stream.kafka.kp_mends import close_producer
from perceptron_stream.kafka.kp_options import make_producer

from tests.support.launch import settings_args, start_service_process
from tests.support.service import exit_code, has_traceback, make_events, stop_process, store_args, tail, wait_assigned
from tests.support.topics import produce
from tests.support.waiting import wait_until

#: The service's own line when it refuses or stops (cli.run_serve), after which it exits 1.
REFUSAL = "perceptron-stream serve: "


def _serving(broker, topics, tmp_path, log_path, **extra):
    """A service with the Kafka store that checkpointed and committed 300 events; (its args, its process)."""
    produce(broker.bootstrap_servers, topics["input_topic"], make_events(300, seed=57))
    args = settings_args(
        broker, topics, tmp_path, batch_size=100, checkpoint_interval_events=100, **store_args("kafka", topics), **extra
    )
    process = start_service_process(args, log_path)
    settings = load(ServeSettings, args)
    wait_assigned(process, log_path, settings.input_topic)
    wait_until(  # committed: a checkpoint is in the topic (only checkpointed positions are committed)
        lambda: (
            committed_offsets(settings, settings.group_id, settings.input_topic).get(0) == 300
            or process.poll() is not None
        ),
        60,
        what="300 events checkpointed and committed",
    )
    assert process.poll() is None, tail(log_path)
    return args, process


def _stopped(process, log_path) -> str:
    """Wait for the service to stop by itself: exit 1, its refusal the log's last line, no traceback."""
    try:
        wait_until(lambda: process.poll() is not None, 60, what="the service to stop by itself")
    except AssertionError:
        raise AssertionError(f"the service did not stop by itself:\n{tail(log_path, 8000)}") from None
    finally:
        stop_process(process, log_path)
    log = log_path.read_text(errors="replace")
    assert process.returncode == 1, log[-3000:]
    assert not has_traceback(log), log[-3000:]
    return log.strip().splitlines()[-1]


def _restart_refused(args, log_path) -> str:
    """A restart that refuses: exit 1, one line that says why, no traceback; that line."""
    code = exit_code(args, log_path, timeout=60)
    log = log_path.read_text(errors="replace")
    assert code == 1, log[-3000:]
    assert not has_traceback(log), log[-3000:]
    refusals = [line for line in log.splitlines() if line.startswith(REFUSAL)]
    assert len(refusals) == 1, log[-3000:]
    return refusals[0]


@pytest.mark.parametrize(
    ("kafka_broker", "guarantee", "client"),
    [
        ("apache-kafka", "at-least-once", "kafka-python"),
        ("embedded", "at-least-once", "kafka-python"),
        ("apache-kafka", "exactly-once", "kafka-python"),
        ("apache-kafka", "exactly-once", "confluent"),
    ],
    indirect=["kafka_broker"],
)
def test_the_checkpoint_topic_deleted_while_running_stops_the_service_naming_it(
    kafka_broker, topics, tmp_path, guarantee, client
):
    """Deleted under the running service: it stops naming the topic (exit 1), without creating it again; the
    restart (which creates it, compacted) refuses in one line: the group's offsets have no checkpoint behind them.

    Under exactly-once the checkpoint records go in the poll loop's transactions, whose producer may create the
    topic again (auto-creation, the brokers' defaults), or whose transaction fails first (the record not
    acknowledged: kafka-python's abort waited for it past 60 s, now 5 s at most): the service stops all the same, saying the topic
    was deleted, and the restart refuses what is there then.
    """
    args, process = _serving(
        kafka_broker,
        topics,
        tmp_path,
        tmp_path / "serve-1.log",
        processing_guarantee=guarantee,
        kafka_client=client,
    )
    checkpoint_topic = load(ServeSettings, args).checkpoint_topic
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers)
    try:
        admin.delete_topics([checkpoint_topic])
        produce(kafka_broker.bootstrap_servers, topics["input_topic"], make_events(200, seed=58))  # more to save
        line = _stopped(process, tmp_path / "serve-1.log")
        assert f"the checkpoint topic {checkpoint_topic} (--checkpoint-topic) was deleted" in line, line
        assert "--start-over" in line and "PerceptronTargetDown.md" in line, line
        recreated = checkpoint_topic in admin.list_topics()
    finally:
        admin.close()
    line = _restart_refused(args, tmp_path / "serve-2.log")
    if guarantee == "at-least-once":  # the checkpoint store's own clients did not bring it back: no auto-creation
        assert not recreated
    if recreated:  # by the transactional producer, with the brokers' defaults
        assert f"the checkpoint topic {checkpoint_topic} (--checkpoint-topic) has cleanup.policy=delete" in line, line
    else:  # created again by the restart, compacted, and empty
        assert f"state store (kafka, topic {checkpoint_topic}) has no checkpoint" in line, line
        assert "--start-over" in line, line


@pytest.mark.parametrize("kafka_broker", ["apache-kafka"], indirect=True)
def test_a_checkpoint_topic_that_deletes_its_records_is_refused_naming_cleanup_policy(kafka_broker, topics, tmp_path):
    """Its cleanup.policy set to delete while running: the service stops naming cleanup.policy and the topic; the
    topic created again as the brokers auto-create one (cleanup.policy=delete): the restart refuses it alike."""
    args, process = _serving(kafka_broker, topics, tmp_path, tmp_path / "serve-1.log")
    checkpoint_topic = load(ServeSettings, args).checkpoint_topic
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers)
    try:
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, checkpoint_topic, {"cleanup.policy": "delete"})])
        line = _stopped(process, tmp_path / "serve-1.log")
        assert f"the checkpoint topic {checkpoint_topic} (--checkpoint-topic) has cleanup.policy=delete" in line, line
        admin.delete_topics([checkpoint_topic])
        wait_until(lambda: checkpoint_topic not in admin.list_topics(), 30, what="the topic deleted")
        admin.create_topics([NewTopic(checkpoint_topic, 1, 1)])  # what auto-creation makes: the brokers' defaults
    finally:
        admin.close()
    line = _restart_refused(args, tmp_path / "serve-2.log")
    assert f"the checkpoint topic {checkpoint_topic} (--checkpoint-topic) has cleanup.policy=delete: " in line, line
    assert "cleanup.policy=compact" in line, line


@pytest.mark.parametrize("kafka_broker", ["embedded"], indirect=True)
def test_a_restart_after_the_checkpoint_topic_was_deleted_says_what_to_do(kafka_broker, topics, tmp_path):
    """Killed (SIGKILL), its checkpoint topic deleted and written to after (as the service's checkpoint producer did
    before this change: it knew the topic, and asked for auto-creation): the restart refuses in one line, at once.
    The embedded broker takes that write without creating the topic, then answers ListOffsets of the topic the
    restart creates again with that write's end, which no fetch reaches: the checkpoints' read ran into its 30 s
    timeout and the KafkaUnavailable escaped as a traceback. (Apache Kafka refuses such a write, and its restart
    is the first test's.)"""
    args, process = _serving(kafka_broker, topics, tmp_path, tmp_path / "serve-1.log")
    process.kill()
    process.wait()
    settings = load(ServeSettings, args)
    key = f"{settings.group_id}/0".encode()
    # a writer that knew the topic before it was deleted, as the service's checkpoint producer did
    late = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers)
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers)
    try:
        late.send(settings.checkpoint_topic, key=key, value=b"{}").get(30)
        admin.delete_topics([settings.checkpoint_topic])
        wait_until(lambda: settings.checkpoint_topic not in admin.list_topics(), 30, what="the topic deleted")
        late.send(settings.checkpoint_topic, key=key, value=b"{}").get(30)
    finally:
        late.close()
        admin.close()
    line = _restart_refused(args, tmp_path / "serve-2.log")
    assert "--start-over" in line, line


@pytest.mark.parametrize("kafka_broker", ["apache-kafka"], indirect=True)
def test_the_state_topics_clients_do_not_create_a_deleted_topic_again(kafka_broker, topics):
    """A producer built as the state topics' are (compacted.NO_AUTO_CREATE) leaves a deleted topic deleted, where the brokers create topics on first use: kafka-python 3.0.12 asked every metadata request with
    auto-creation on, whatever it was given (kp_mends.net_client mends it); its producer's own default created it."""
    settings = load(ServeSettings, ["--bootstrap-servers", kafka_broker.bootstrap_servers])
    topic = f"gone-{topics['group_id']}"
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap_servers)
    producer = make_producer(settings, max_block_ms=2000, **NO_AUTO_CREATE)
    try:
        admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"cleanup.policy": "compact"})])
        producer.send(topic, key=b"k", value=b"before").get(30)
        admin.delete_topics([topic])
        wait_until(lambda: topic not in admin.list_topics(), 30, what="the topic deleted")
        with pytest.raises(KafkaTimeoutError):  # its metadata asked again and again for 5 s: no leader, not created
            producer.send(topic, key=b"k", value=b"after").get(5)
        assert topic not in admin.list_topics()
        with_defaults = make_producer(settings, max_block_ms=10_000)  # the clients' default: created on first use
        try:
            with_defaults.send(topic, key=b"k", value=b"after").get(30)
        finally:
            close_producer(with_defaults, 5.0)
        assert topic in admin.list_topics()
    finally:
        close_producer(producer, 1.0)
        admin.close()
