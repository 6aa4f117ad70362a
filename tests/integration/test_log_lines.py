"""What a person reads in the service's log on Apache Kafka: each line true, said once, the clients' noise at DEBUG.

Read as a newcomer meets them: the first start on a new cluster (its group
coordinator not there yet), the first start of a group, a restart restored
from the Kafka store, ``model export``. Each was a line that misled: "the
brokers do not answer" from brokers that had answered, an ERROR of a refresh
the client cancelled itself, a WARNING and "assigned nothing" before the real
assignment, "starting from zero weights" before starting from a model file.
"""

from __future__ import annotations

import json
import logging
import re
import time

import pytest
from perceptron_stream.config import KafkaSettings
from perceptron_stream.kafka import KafkaIO

from tests.support.brokers import new_broker
from tests.support.launch import run_command, settings_args, start_service_process
from tests.support.service import make_events, stop_process, tail, wait_assigned
from tests.support.topics import consume, create_topic, produce
from tests.support.waiting import wait_until

#: A record of the service's log at WARNING or above, and which logger wrote it.
LOUD = re.compile(r"(?m)^\S+ \S+ (WARNING|ERROR|CRITICAL) +(\S+): (.*)$")


def _loud(log: str) -> list[str]:
    return [m.group(0) for m in LOUD.finditer(log)]


def test_a_first_join_assigns_the_partitions_at_once_without_a_warning(apache_kafka, topics, caplog):
    """kafka-python joined before its first metadata on about one first start in three: the leader assigned
    nothing ("No partition metadata for topic"), then a second rebalance the partition. Six first joins here."""
    bootstrap = apache_kafka.bootstrap_servers
    create_topic(bootstrap, topics["input_topic"])
    caplog.set_level(logging.WARNING, logger="kafka")
    for attempt in range(6):
        assigned: list[list] = []
        io = KafkaIO(
            KafkaSettings(bootstrap_servers=bootstrap),
            group_id=f"{topics['group_id']}-{attempt}",
            topics=[topics["input_topic"]],
            auto_offset_reset="earliest",
            on_assigned=lambda partitions, into=assigned: into.append(sorted(partitions)),
            on_revoked=lambda partitions: None,
            max_poll_records=10,
            fetch_max_wait_ms=20,
        )
        try:
            wait_until(lambda io=io, into=assigned: io.poll(100, 10) is not None and bool(into), 60, what="a join")
        finally:
            io.close()
        assert assigned[0] == [(topics["input_topic"], 0)], (attempt, assigned)
    assert not [r.getMessage() for r in caplog.records if r.name.startswith("kafka")]


def test_a_new_clusters_first_start_a_restart_and_an_export_say_only_what_is_true(tmp_path, topics):
    """On a cluster of its own, new: its group coordinator is not there until the first group asks for it."""
    with new_broker("apache-kafka", tmp_path / "kafka") as kafka:
        bootstrap = kafka.bootstrap_servers
        events = make_events(200, seed=34)
        produce(bootstrap, topics["input_topic"], events)
        checkpoints = f"ckpt-{topics['group_id']}"
        args = settings_args(kafka, topics, tmp_path, state_store="kafka", checkpoint_topic=checkpoints)

        first = _run(args, tmp_path / "first.log", "no checkpoint yet of model", bootstrap, topics, len(events))
        assert "do not answer" not in first, first  # the brokers answered: CoordinatorNotAvailableError, said as such
        assert "assigned nothing" not in first and "No partition metadata" not in first, first
        assert not _loud(first), first
        for created in (topics["output_topic"], topics["dlq_topic"], checkpoints):  # said, not hushed with the clients
            assert f"created topic {created} with 1 partition(s)" in first, first

        restart = _run(args, tmp_path / "restart.log", "restored checkpoint", bootstrap, topics, 0)
        assert "Metadata refresh" not in restart and not _loud(restart), restart  # the store's reader closed

        done = run_command(
            "model", "export", "--output", str(tmp_path / "m.json"), "--state-store", "kafka",
            "--checkpoint-topic", checkpoints, "--bootstrap-servers", bootstrap,
            "--group-id", topics["group_id"], "--input-topic", topics["input_topic"],
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert re.fullmatch(r"wrote checkpoint \d+ of model to \S+\n", done.stderr), done.stderr  # that line alone
        assert json.loads((tmp_path / "m.json").read_text())["kind"] == "perceptron-stream.model"


def _run(args, log_path, started: str, bootstrap: str, topics: dict, outputs: int) -> str:
    """The service's log from its start to its stop (SIGTERM, exit 0), once ``started`` is logged and
    ``outputs`` predictions are on the output topic."""
    process = start_service_process(args, log_path)
    try:
        wait_assigned(process, log_path, topics["input_topic"])
        wait_until(lambda: started in log_path.read_text(), 60, what=started)
        if outputs:
            consume(bootstrap, topics["output_topic"], outputs)
    finally:
        code = stop_process(process, log_path)
    assert code == 0, tail(log_path)
    return log_path.read_text()


#: A record of the service's log at INFO or above: its level, logger and message.
SAID = re.compile(r"(?m)^\S+ \S+ (INFO|WARNING|ERROR|CRITICAL) +(\S+): (.*)$")


@pytest.mark.parametrize("own_broker", ["apache-kafka"], indirect=True)
@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_a_broker_killed_for_12_seconds_is_one_line_when_it_goes_and_one_when_it_comes_back(
    own_broker, tmp_path, topics, client
):
    """Before: a 12 s outage (the broker SIGKILLed, then restarted) gave about 980 lines on confluent-kafka
    (librdkafka's FAIL and connect errors, ~50 a second; 826 here at 741eaf1, and "answer again" said 5 s in, with
    the broker still dead) and a burst of dozens on kafka-python (90 here, before the service's own call gave up and
    said the outage). Now the service says once that the brokers do not answer, naming --bootstrap-servers, and once
    that they answer again; the clients' own lines are DEBUG (no reminder: "still no answer" comes a minute into an
    outage, tests/runtime/test_outage.py)."""
    produce(own_broker.bootstrap_servers, topics["input_topic"], make_events(20, seed=35))
    log_path = tmp_path / "serve.log"
    args = settings_args(own_broker, topics, tmp_path, kafka_client=client)
    process = start_service_process(args, log_path)
    try:
        wait_assigned(process, log_path, topics["input_topic"])
        consume(own_broker.bootstrap_servers, topics["output_topic"], 20)  # the stream flows
        before = len(log_path.read_text(errors="replace"))
        own_broker.kill()
        killed = time.monotonic()
        wait_until(lambda: "do not answer" in log_path.read_text(errors="replace")[before:], 60, what="the outage said")
        time.sleep(max(0.0, 12.0 - (time.monotonic() - killed)))
        while_away = log_path.read_text(errors="replace")[before:]
        own_broker.restart()
        wait_until(
            lambda: "answer again" in log_path.read_text(errors="replace")[before:] or process.poll() is not None,
            120,
            what="the end of the outage said",
        )
        assert process.poll() is None, tail(log_path)
    finally:
        assert stop_process(process, log_path) == 0, tail(log_path)
    # to the exit: librdkafka queues its log for the next poll, and a queue served late (the producer's, at the
    # stop) came out as a burst of a hundred lines after the outage
    outage = log_path.read_text(errors="replace")[before:]
    said = SAID.findall(outage)
    print(f"{client}: {len(said)} lines at INFO and above from the kill to the exit")
    went = [message for _, _, message in said if "do not answer" in message]
    back = [message for _, _, message in said if "answer again" in message]
    assert len(went) == 1 and f"the brokers at {own_broker.bootstrap_servers} do not answer" in went[0], outage
    assert "--bootstrap-servers" in went[0], went
    assert len(back) == 1, outage
    # not said while the broker was still dead (a commit of partitions revoked meanwhile asks the brokers nothing)
    assert "answer again" not in while_away, while_away
    assert not [line for line in said if line[1].startswith(("kafka.", "perceptron_stream.kafka"))], outage
    # the two lines, room for what the restart brings (a commit refused for now: the group forgot the member; its
    # partition revoked and assigned again), and the stop's (stopping, revoked)
    assert len(said) <= 8, outage
