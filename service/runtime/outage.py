"""One log line per outage of the brokers, naming the setting to check; the clients' own log quiet meanwhile.

Why: with the brokers away, kafka-python logs four lines for each connection attempt and the service one more for
each retry: an unreachable ``--bootstrap-servers 127.0.0.1:1`` gave 109 lines in 20 s, none of them naming the
setting (librdkafka is as talkative through our logger). What a person needs is that the brokers do not answer,
since when, what to check, and that they answer again.

So the first failure of an outage logs one WARNING with the brokers' address and the setting in all its spellings,
and lowers the clients' loggers to errors that matter (``kafka``: CRITICAL, the Kafka layer's: ERROR) until the
brokers answer; the failures after it go to DEBUG. The end of an outage is one INFO line. At start-up the clients
are quiet until the brokers first answer (:meth:`Outage.hush`): the first attempt's own lines (sixteen, over the
3 s before it gives up) would come before the outage is known. Errors that retrying
cannot cure (authentication, a certificate) are not outages: they stop the service, naming their setting.
With ``--log-level DEBUG`` nothing is quieted: whoever asks for everything gets everything.

A coordinator not available (``KafkaUnavailable.coordinator``: CoordinatorNotAvailableError and its kin) is no
outage of the brokers: they answered. On a new cluster it is the first thing a service meets (the brokers create
and load ``__consumer_offsets`` at the first group, for a second or so), and "the brokers do not answer, check
--bootstrap-servers" sent people checking a setting that was right. So that wait is said as what it is, at INFO,
and only when it lasts (:data:`COORDINATOR_PATIENCE_S`) as a WARNING naming what to check on the brokers' side.

>>> import logging
>>> outage = Outage("127.0.0.1:1")
>>> outage.failed("check the topics", TimeoutError("Unable to bootstrap"))  # logs the one line
True
>>> outage.failed("check the topics", TimeoutError("Unable to bootstrap"))  # the same outage: DEBUG only
False
>>> logging.getLogger("kafka").level == logging.CRITICAL or logging.getLogger("perceptron_stream").isEnabledFor(10)
True
>>> outage.answered()
>>> outage.on
False
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("perceptron_stream")

#: The loggers an outage quiets, and the level each is set to meanwhile: kafka-python's (it logs a refused
#: connection as ERROR), and the Kafka layer's (librdkafka's log and error callback, the resends' warnings).
QUIETED = {"kafka": logging.CRITICAL, "perceptron_stream.kafka": logging.ERROR}

SETTING = "bootstrap_servers (--bootstrap-servers, PERCEPTRON_STREAM_BOOTSTRAP_SERVERS)"

#: How often an outage that lasts is said again ("still no answer ... after N s"): one line a minute, so a person
#: reading the log of a long outage sees it is still on, not a line per attempt.
REMIND_EVERY_S = 60.0

#: How long a coordinator may take to come before the wait is a WARNING (a new cluster's takes a second or two).
COORDINATOR_PATIENCE_S = 30.0


class Outage:
    """Whether the brokers are away now, said once when they go and once when they come back."""

    def __init__(self, bootstrap_servers: str = ""):
        self.bootstrap_servers = bootstrap_servers
        self.since: float | None = None  # monotonic time of the outage's first failure
        self.failures = 0
        self.coordinator = False  # this outage is a wait for a coordinator: the brokers answer
        self._warned = False  # a coordinator's wait said as a WARNING once it lasted
        self._said_at = 0.0  # monotonic time the outage was last said (its start, or a reminder)
        self._levels: dict[str, int] = {}  # the quieted loggers' own levels, set back when the outage ends

    @property
    def on(self) -> bool:
        return self.since is not None

    def failed(self, what: str, exc: BaseException) -> bool:
        """A call to the brokers got no answer, or no coordinator (``exc.coordinator``); True when it began an
        outage (and was logged as one)."""
        self.failures += 1
        coordinator = bool(getattr(exc, "coordinator", False))
        if self.since is not None and (coordinator or not self.coordinator):
            log.debug(
                "could not %s: %s (%s)",
                what,
                exc,
                "still waiting for the coordinator" if self.coordinator else "the brokers still do not answer",
            )
            now = time.monotonic()
            if not self.coordinator and now - self._said_at >= REMIND_EVERY_S:
                self._said_at = now
                log.warning(
                    "still no answer from the brokers at %s after %.0f s (could not %s: %s); if they are up, check %s",
                    self.bootstrap_servers or "the configured address",
                    now - self.since,
                    what,
                    exc,
                    SETTING,
                )
            if self.coordinator and not self._warned and now - self.since > COORDINATOR_PATIENCE_S:
                self._warned = True
                log.warning(
                    "still waiting for the coordinator after %.0f s (could not %s: %s): the brokers answer, but "
                    "none of them serves it; check the brokers' log (offsets.topic.replication.factor and "
                    "transaction.state.log.replication.factor must not exceed the live brokers)",
                    now - self.since,
                    what,
                    exc,
                )
            return False
        if coordinator:
            self.since, self.coordinator = time.monotonic(), True
            log.info(
                "waiting for the coordinator (could not %s: %s): the brokers at %s answer, but have not made it "
                "available yet (a new cluster does within seconds of its first group); /readyz is not ready meanwhile",
                what,
                exc,
                self.bootstrap_servers or "the configured address",
            )
            self._quiet()
            return True
        self.since, self.coordinator = self.since or time.monotonic(), False
        self._said_at = time.monotonic()
        log.warning(
            "the brokers at %s do not answer (could not %s: %s): waiting for them, /readyz is not ready; if they "
            "are up, check %s. The Kafka clients' own log is quiet until they answer.",
            self.bootstrap_servers or "the configured address",
            what,
            exc,
            SETTING,
        )
        self._quiet()
        return True

    def hush(self) -> None:
        """Quiet the clients until the brokers answer (start-up: until then, a failure is not known for one)."""
        self._quiet()

    def answered(self) -> None:
        """The brokers answered a call: an outage, if one was on, is over; the clients speak again."""
        self.restore()
        if self.since is None:
            return
        if self.coordinator:
            log.info(
                "the coordinator answers, after %.0f s and %d failed call(s)",
                time.monotonic() - self.since,
                self.failures,
            )
        else:
            log.info(
                "the brokers at %s answer again, after %.0f s and %d failed call(s)",
                self.bootstrap_servers or "the configured address",
                time.monotonic() - self.since,
                self.failures,
            )
        self.since, self.failures, self.coordinator, self._warned = None, 0, False, False

    def restore(self) -> None:
        """The quieted loggers' own levels back (also when the service stops during an outage: the process, a
        demo's or a test's, goes on)."""
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)
        self._levels = {}

    def _quiet(self) -> None:
        if self._levels or log.isEnabledFor(logging.DEBUG):  # quiet already; --log-level DEBUG: everything, as asked
            return
        for name, level in QUIETED.items():
            logger = logging.getLogger(name)
            self._levels[name] = logger.level
            logger.setLevel(max(level, logger.level))
