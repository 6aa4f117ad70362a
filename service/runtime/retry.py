"""How the service retries its calls to the brokers: with the one backoff (:class:`Backoff`, at home in
:mod:`perceptron_stream.kafka.backoff` and re-exported here), and one classification of errors.

The Kafka clients raise only the service's own errors (:mod:`perceptron_stream.kafka.contract`,
decided by :mod:`perceptron_stream.kafka.errors`):

- :class:`~perceptron_stream.kafka.contract.KafkaFatal`: retrying cannot help (a
  setting, a permission): the service stops with :class:`StartupError`
  (exit 1), naming what to fix;
- :class:`~perceptron_stream.kafka.contract.KafkaUnavailable`: the brokers are away or
  busy: wait and try again, backing off, with ``/readyz`` not ready while
  they do not answer.

>>> b = Backoff(first=0.2, most=1.0)
>>> [b.next() for _ in range(5)]
[0.2, 0.4, 0.8, 1.0, 1.0]
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from perceptron_stream.kafka import KafkaFatal, KafkaUnavailable
from perceptron_stream.kafka.backoff import (
    Backoff,
)  # the one backoff (perceptron_stream.kafka.backoff: why it lives there)
from perceptron_stream.runtime.health import Health

log = logging.getLogger("perceptron_stream")


class StartupError(RuntimeError):
    """The service cannot start, or go on: a refusal by the brokers or the state that the settings alone do not
    explain; the message says why and what to do (exit 1). A bad setting is a
    :class:`~perceptron_stream.config.ConfigError` instead (exit 2), wherever it is found."""


def fatal(exc: KafkaFatal, what: str) -> StartupError:
    """The StartupError for a fatal error met while trying to ``what``: waiting cannot cure it."""
    return StartupError(f"could not {what}: {exc}; retrying cannot help: {exc.hint}")


class Retry:
    """How the service calls the brokers: until it works (start-up), or once and again later (the loop)."""

    def __init__(self, health: Health, stopping: Callable[[], bool]):
        self.health, self.stopping = health, stopping
        self.refused: dict[str, int] = {}  # what the brokers said "not now" to → how many times since it last worked

    def until_it_works(self, action: Callable[[], Any], what: str) -> Any:
        """``action()``, retried with backoff while the brokers are unavailable; None when stopped meanwhile."""
        backoff = Backoff()
        while True:
            try:
                result = action()
            except KafkaFatal as exc:
                raise fatal(exc, what) from None
            except KafkaUnavailable as exc:
                self.health.broker_failed(what, exc)  # one line per outage, naming the setting to check
                if self.stopping():
                    return None
                delay = backoff.next()
                log.debug("could not %s: %s; retrying in %.1f s", what, exc, delay)
                self.sleep(delay)
            else:
                self.health.outage.answered()
                return result

    def once(self, action: Callable[[], Any], what: str, probe: bool = False) -> tuple[bool, Any]:
        """One attempt: ``(True, result)``, or ``(False, None)`` when the brokers did not answer (logged); a fatal
        error raises StartupError. /readyz shows an outage when the call timed out, or on any failure of a ``probe``
        (a call made to learn whether the brokers answer; a commit refused during a rebalance says nothing of it)."""
        try:
            result = action()
        except KafkaFatal as exc:
            raise fatal(exc, what) from None
        except KafkaUnavailable as exc:
            if exc.timed_out or probe:  # the brokers did not answer: an outage, said once
                self.health.broker_failed(what, exc)
            else:  # they answered no for now (a rebalance): not an outage; said once, not at every turn of the loop
                refusals = self.refused[what] = self.refused.get(what, 0) + 1
                (log.warning if refusals == 1 else log.debug)("could not %s (%s); trying again later", what, exc)
            return False, None
        refusals = self.refused.pop(what, 0)
        if refusals > 1:
            log.info("could %s again, after %d refusals", what, refusals)
        return True, result

    def sleep(self, seconds: float) -> None:
        """Wait, alive (the loop beats), and return early when the service is stopping."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not self.stopping():
            self.health.beat()
            time.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
