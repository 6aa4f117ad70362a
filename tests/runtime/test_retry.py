"""service/runtime/retry.py: a call the brokers refuse for now (a rebalance) is said once, not at every turn."""

from __future__ import annotations

import logging

import pytest
from perceptron_stream.kafka import KafkaFatal, KafkaUnavailable
from perceptron_stream.runtime.health import Health
from perceptron_stream.runtime.retry import Retry, StartupError


def _refusing(times: int):
    """An action refused ``times`` times ("not now", as a commit during a rebalance), then done."""
    calls = []

    def action():
        calls.append(1)
        if len(calls) <= times:
            raise KafkaUnavailable("[Error 27] RebalanceInProgressError")
        return "done"

    return action


def test_a_refusal_for_now_is_said_once_while_it_lasts_and_once_when_it_ends(caplog):
    """The loop commits every turn (200 ms): a rebalance of a few seconds logged a WARNING at each."""
    caplog.set_level(logging.DEBUG, logger="perceptron_stream")
    retry, action = Retry(Health(60.0), lambda: False), _refusing(5)
    results = [retry.once(action, "commit offsets of group g") for _ in range(6)]
    assert results == [(False, None)] * 5 + [(True, "done")]
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warned] == [
        "could not commit offsets of group g ([Error 27] RebalanceInProgressError); trying again later"
    ]
    assert sum(r.levelno == logging.DEBUG for r in caplog.records) == 4
    assert caplog.records[-1].getMessage() == "could commit offsets of group g again, after 5 refusals"
    assert "do not answer" not in caplog.text


def test_the_next_refusal_after_a_success_is_said_again(caplog):
    caplog.set_level(logging.WARNING, logger="perceptron_stream")
    retry = Retry(Health(60.0), lambda: False)
    for _ in range(2):
        action = _refusing(1)
        assert retry.once(action, "commit offsets of group g") == (False, None)
        assert retry.once(action, "commit offsets of group g") == (True, "done")
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2


def test_a_fatal_error_stops_with_what_to_fix():
    def action():
        raise KafkaFatal("[Error 30] GroupAuthorizationFailedError", hint="grant the group Read")

    with pytest.raises(
        StartupError, match=r"could not commit offsets of group g: .*retrying cannot help: grant the group Read"
    ):
        Retry(Health(60.0), lambda: False).once(action, "commit offsets of group g")
