"""/healthz follows the poll loop, /readyz the assignment, restore and broker."""

import json
import threading

import pytest

from service.broker import free_port
from tests.conftest import http_get, produce, settings_args, wait_until

pytestmark = pytest.mark.integration


def test_not_ready_while_the_broker_is_unreachable_but_alive(tmp_path, topics, service_thread):
    class Nowhere:  # an address where no broker listens
        bootstrap_servers = f"127.0.0.1:{free_port()}"

    service = service_thread(settings_args(Nowhere, topics, tmp_path))
    wait_until(lambda: http_get(service.metrics_url + "/readyz")[0] == 503, 10, what="readyz 503")
    status, body = http_get(service.metrics_url + "/readyz")
    assert json.loads(body) == {"ok": False, "partitions_assigned": False, "state_restored": False, "broker_reachable": False}
    assert http_get(service.metrics_url + "/healthz")[0] == 200  # retrying with backoff is alive, not stuck
    assert service.stop() == 0  # stopped while still retrying: a clean exit, no crash


def test_ready_after_assignment_and_unhealthy_when_the_poll_loop_stalls(broker, topics, tmp_path, service_thread):
    produce(broker.bootstrap_servers, topics["input_topic"], [{"x": [1.0, 2.0], "y": 1}])
    service = service_thread(settings_args(broker, topics, tmp_path, healthz_timeout_seconds=1.0))
    wait_until(lambda: http_get(service.metrics_url + "/readyz")[0] == 200, 60, what="readyz 200")
    assert json.loads(http_get(service.metrics_url + "/readyz")[1])["partitions_assigned"] is True
    assert http_get(service.metrics_url + "/healthz")[0] == 200

    release = threading.Event()
    real_poll = service.app.io.poll

    def stuck_poll(*args, **kwargs):
        release.wait(30)
        return real_poll(*args, **kwargs)

    service.app.io.poll = stuck_poll  # the loop blocks inside poll, as on a hung client
    status, body = wait_until(lambda: (lambda r: r if r[0] == 503 else None)(http_get(service.metrics_url + "/healthz")), 10, what="healthz 503")
    assert json.loads(body)["poll_loop_idle_seconds"] > 1.0
    release.set()
    service.app.io.poll = real_poll
    wait_until(lambda: http_get(service.metrics_url + "/healthz")[0] == 200, 10, what="healthz back to 200")
    assert http_get(service.metrics_url + "/nothing")[0] == 404
