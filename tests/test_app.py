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

    assert app._until_it_works(flaky, "reach the brokers") == "ok"
    assert app.health.broker_ok is False  # the outage showed on /readyz meanwhile
