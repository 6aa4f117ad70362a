"""The application's retry policy, as pure code: what is retried and what stops the service."""

from __future__ import annotations

import pytest
from kafka.errors import KafkaConnectionError, SaslAuthenticationFailedError, TopicAuthorizationFailedError

from service.app import Application, StartupError
from service.config import ServeSettings, load


@pytest.fixture
def app():
    return Application(load(ServeSettings, ["--metrics-port", "0"]))


@pytest.mark.parametrize("error", [TopicAuthorizationFailedError, SaslAuthenticationFailedError])
def test_errors_no_retry_can_cure_stop_the_service_naming_them(app, error):
    calls = []

    def denied():
        calls.append(1)
        raise error("denied")

    with pytest.raises(StartupError, match=f"could not check the topics: {error.__name__}.*retrying cannot help"):
        app._until_it_works(denied, "check the topics")
    assert len(calls) == 1


def test_a_broker_away_is_retried_until_it_answers(app):
    answers = iter([KafkaConnectionError("away"), KafkaConnectionError("away"), "ok"])

    def flaky():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    app.health.broker_ok = True  # reachable before: the outage must show on /readyz
    assert app._until_it_works(flaky, "reach the brokers") == "ok"
    assert app.health.broker_ok is False  # the outage showed on /readyz meanwhile


class DeniedStream:
    """The stream of a client whose permissions were taken away after start-up."""

    def __init__(self, where: str, error: type[Exception]):
        self.where, self.error, self.calls = where, error, 0

    def _maybe_deny(self, name: str):
        if name == self.where:
            self.calls += 1
            raise self.error("denied")

    def poll(self, timeout_ms, max_records):
        self._maybe_deny("poll")
        return []

    def commit(self, positions, timeout_s):
        self._maybe_deny("commit")

    def lag(self, timeout_s, ask_broker):
        self._maybe_deny("lag")
        return {}


@pytest.mark.parametrize("where,what", [("poll", "could not read points in group perceptron-stream"),
                                        ("commit", "could not commit offsets of group perceptron-stream"),
                                        ("lag", "could not read the end offsets for the lag")])
def test_errors_no_retry_can_cure_stop_the_running_loop_too(app, where, what):
    app.io = DeniedStream(where, TopicAuthorizationFailedError)
    app._to_commit = {("points", 0): 5}
    app._group_checked = True
    with pytest.raises(StartupError, match=f"{what}: TopicAuthorizationFailedError.*retrying cannot help"):
        app._loop()
    assert app.io.calls == 1  # at once, not retried every half second
