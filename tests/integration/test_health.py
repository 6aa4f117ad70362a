"""/healthz follows the poll loop, /readyz the assignment, restore and broker."""

import json
import re
import threading
import time

import pytest
from perceptron_stream.broker import free_port

from tests.support.endpoints import http_get
from tests.support.launch import settings_args, start_service_process
from tests.support.service import LOG_RECORD, stop_process
from tests.support.topics import create_topic, produce
from tests.support.waiting import wait_until


def metric(url: str, name: str) -> float | None:
    """The value of an unlabelled sample on /metrics, None when it is not there."""
    status, text = http_get(url + "/metrics")
    assert status == 200, status
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(match.group(1)) if match else None


def test_not_ready_while_the_broker_is_unreachable_but_alive(tmp_path, topics, service_thread):
    class Nowhere:  # an address where no broker listens
        bootstrap_servers = f"127.0.0.1:{free_port()}"

    service = service_thread(settings_args(Nowhere, topics, tmp_path))
    wait_until(lambda: http_get(service.metrics_url + "/readyz")[0] == 503, 10, what="readyz 503")
    _, body = http_get(service.metrics_url + "/readyz")
    assert json.loads(body) == {
        "ok": False,
        "partitions_assigned": False,
        "state_restored": False,
        "broker_reachable": False,
    }
    assert http_get(service.metrics_url + "/healthz")[0] == 200  # retrying with backoff is alive, not stuck
    assert service.stop() == 0  # stopped while still retrying: a clean exit, no crash


@pytest.mark.parametrize("client", ["kafka-python", "confluent"])
def test_an_unreachable_broker_is_one_line_naming_the_setting_not_the_clients_own_log(tmp_path, topics, client):
    """Before: 109 lines in 20 s on either client (kafka-python's four a connection attempt, the service's one a
    retry), none naming --bootstrap-servers. Now the outage is one line that names the setting, however many
    attempts fail, and kafka-python's and librdkafka's loggers stay quiet until the brokers answer."""

    class Nowhere:  # an address where no broker listens
        bootstrap_servers = f"127.0.0.1:{free_port()}"

    log_path = tmp_path / "serve.log"
    process = start_service_process(settings_args(Nowhere, topics, tmp_path, kafka_client=client), log_path)
    try:
        wait_until(lambda: "do not answer" in log_path.read_text(), 60, what="the outage said")
        # a start-up attempt gives up after 3 s, the backoff adds 0.2, 0.4, 0.8 s: four more attempts fail
        # in the next 15 s (fewer on a loaded machine, which can only make the log shorter)
        time.sleep(15)
    finally:
        assert stop_process(process, log_path) == 0
    log = log_path.read_text()
    records = [line for line in log.splitlines() if LOG_RECORD.match(line)]
    told = [line for line in records if "do not answer" in line]
    assert len(told) == 1, log
    assert f"the brokers at {Nowhere.bootstrap_servers} do not answer" in told[0], told
    assert "--bootstrap-servers, PERCEPTRON_STREAM_BOOTSTRAP_SERVERS" in told[0], told
    assert not [line for line in records if " kafka." in line or "perceptron_stream.kafka" in line], log
    # the metrics line, the outage, the stop (and its revocation note, if any): nothing per attempt
    assert len(records) <= 4, log


def test_ready_after_assignment_and_unhealthy_when_the_poll_loop_stalls(broker, topics, tmp_path, service_thread):
    produce(broker.bootstrap_servers, topics["input_topic"], [{"x": [1.0, 2.0], "y": 1}])
    service = service_thread(settings_args(broker, topics, tmp_path, healthz_timeout_seconds=1.0))
    wait_until(lambda: http_get(service.metrics_url + "/readyz")[0] == 200, 60, what="readyz 200")
    assert json.loads(http_get(service.metrics_url + "/readyz")[1])["partitions_assigned"] is True
    assert http_get(service.metrics_url + "/healthz")[0] == 200

    release = threading.Event()
    real_poll = service.app.stream.poll

    def stuck_poll(*args, **kwargs):
        release.wait(120)  # released below; the bound only ends a failed test's stall
        return real_poll(*args, **kwargs)

    def last_turn() -> float:
        value = metric(service.metrics_url, "perceptron_poll_loop_last_turn_timestamp_seconds")
        assert value is not None, "no poll-loop beat on /metrics"
        return value

    # turning: a beat within a second of a scrape (a turn, or the scrape, may lag on a loaded machine: asked again)
    wait_until(lambda: last_turn() > time.time() - 1.0, 30, what="a poll-loop beat within a second")
    service.app.stream.poll = stuck_poll  # the loop blocks inside poll, as on a hung client
    _, body = wait_until(
        lambda: (lambda r: r if r[0] == 503 else None)(http_get(service.metrics_url + "/healthz")),
        30,
        what="healthz 503",
    )
    idle = json.loads(body)["poll_loop_idle_seconds"]
    assert idle > 1.0
    # Prometheus sees the same stall: the last turn stands still while the scrape goes on
    stalled_at = last_turn()
    assert stalled_at < time.time() - 1.0
    time.sleep(0.3)
    assert last_turn() == pytest.approx(stalled_at, abs=0.05)
    release.set()
    service.app.stream.poll = real_poll
    wait_until(lambda: http_get(service.metrics_url + "/healthz")[0] == 200, 30, what="healthz back to 200")
    wait_until(lambda: last_turn() > time.time() - 1.0, 30, what="the poll loop to turn again")
    assert http_get(service.metrics_url + "/nothing")[0] == 404


def test_not_ready_while_the_group_gives_the_partition_to_another_member(broker, topics, tmp_path, service_thread):
    """Broker reachable, state restored, group joined, but no partition: /readyz 503 saying so.

    Two instances in one group on a one-partition topic (no state store, so
    the second is not stopped as a second instance of one model): the group
    gives the partition to one of them; the other is alive and connected but
    must not be ready.
    """
    create_topic(broker.bootstrap_servers, topics["input_topic"], partitions=1)
    produce(broker.bootstrap_servers, topics["input_topic"], [{"x": [1.0, 2.0], "y": 1}])

    def start(name):
        return service_thread(settings_args(broker, topics, tmp_path / name, state_store="none"))

    first = start("a")
    wait_until(lambda: http_get(first.metrics_url + "/readyz")[0] == 200, 60, what="the first instance to be ready")
    second = start("b")
    not_ready = {"ok": False, "partitions_assigned": False, "state_restored": True, "broker_reachable": True}

    def split():
        answers = [http_get(s.metrics_url + "/readyz") for s in (first, second)]
        statuses = sorted(status for status, _ in answers)
        idle = [json.loads(body) for status, body in answers if status == 503]
        return answers if statuses == [200, 503] and idle == [not_ready] else None

    # The second one joining makes the group rebalance (both unassigned for a few
    # seconds); then one holds the partition and the other none, and that lasts.
    held_since, deadline = None, time.monotonic() + 60
    while True:
        answers = split()
        now = time.monotonic()
        held_since = (held_since or now) if answers else None
        if held_since is not None and now - held_since >= 4.0:
            break
        assert now < deadline, f"no lasting split of one ready instance and one without partitions; last: {answers}"
        time.sleep(0.2)
    [(idle_instance, body)] = [(s, b) for s, (status, b) in zip((first, second), answers) if status == 503]
    assert json.loads(body) == not_ready
    assert idle_instance.app.stream.assignment() == []
    assert http_get(idle_instance.metrics_url + "/healthz")[0] == 200  # alive: waiting is not a hung loop


def test_assigned_partitions_gauge_follows_the_assignment(broker, topics, tmp_path, service_thread):
    create_topic(broker.bootstrap_servers, topics["input_topic"], partitions=2)
    service = service_thread(settings_args(broker, topics, tmp_path))
    wait_until(lambda: http_get(service.metrics_url + "/readyz")[0] == 200, 60, what="readyz 200")
    assert metric(service.metrics_url, "perceptron_assigned_partitions") == 2
