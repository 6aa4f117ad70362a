"""What every test in tests/integration shares: the ``integration`` marker, and running a service test on each client.

The rule is one: a test that talks to a broker or to Prometheus over TCP lives
in this folder, and every test here is marked ``integration`` by the hook
below, so ``-m "not integration"`` runs only the fast tests.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by marker
def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(params=["kafka-python", "confluent"])
def kafka_client(request, monkeypatch):
    """A test of the service run once on each Kafka client (the client's name in the test id).

    With ``confluent`` the service the test starts in a thread reads and writes
    through confluent-kafka, which teardown checks; ``kafka-python`` is the default.
    """
    if request.param == "kafka-python":
        yield request.param
        return
    import perceptron_stream.runtime.startup
    from perceptron_stream.kafka.confluent import ConfluentIO

    monkeypatch.setenv("PERCEPTRON_STREAM_KAFKA_CLIENT", "confluent")
    opened = []
    open_stream = perceptron_stream.runtime.startup.open_stream

    def spy(*args, **kwargs):
        opened.append(open_stream(*args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(perceptron_stream.runtime.startup, "open_stream", spy)
    yield request.param
    assert opened and all(type(io) is ConfluentIO for io in opened)
