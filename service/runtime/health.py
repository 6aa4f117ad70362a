"""What /healthz and /readyz report, set by the poll loop; and the loop's probe of the brokers (lag).

>>> health = Health(stall_timeout_s=30)
>>> health.ready()
(False, {'partitions_assigned': False, 'state_restored': False, 'broker_reachable': False})
"""

from __future__ import annotations

import logging
import time

from perceptron_stream.runtime.outage import Outage

log = logging.getLogger("perceptron_stream")

#: How often the lag is refreshed (and, while no record comes, the brokers probed).
LAG_EVERY_S = 5.0
#: Broker round trips the loop makes on its own give up after this long, so an
#: outage shows on /readyz within seconds and the loop keeps turning.
PROBE_TIMEOUT_S = 3.0


class Health:
    """What /healthz and /readyz report, set by the poll loop."""

    def __init__(self, stall_timeout_s: float, bootstrap_servers: str = ""):
        self.stall_timeout_s = stall_timeout_s
        self.last_beat = time.monotonic()
        self.assigned = False
        self.restored = False
        self._broker_ok = False
        self.outage = Outage(bootstrap_servers)  # said once when the brokers go away, once when they answer again

    @property
    def broker_ok(self) -> bool:
        return self._broker_ok

    @broker_ok.setter
    def broker_ok(self, ok: bool) -> None:
        self._broker_ok = ok
        if ok:
            self.outage.answered()

    def broker_failed(self, what: str, exc: BaseException) -> bool:
        """A call to the brokers got no answer: /readyz not ready, and the outage said once (True when this began
        it)."""
        self._broker_ok = False
        return self.outage.failed(what, exc)

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    def live(self) -> tuple[bool, dict]:
        idle = time.monotonic() - self.last_beat
        return idle <= self.stall_timeout_s, {
            "poll_loop_idle_seconds": round(idle, 3),
            "limit_seconds": self.stall_timeout_s,
        }

    def ready(self) -> tuple[bool, dict]:
        detail = {
            "partitions_assigned": self.assigned,
            "state_restored": self.restored,
            "broker_reachable": self.broker_ok,
        }
        return all(detail.values()), detail


class LagProbe:
    """Lag per partition every few seconds; while no record comes, also the loop's probe of the brokers for /readyz.

    While records flow, the fetch responses' high watermarks give the lag with
    no request, and the flushes tell that the brokers answer.
    """

    def __init__(self, health: Health, metrics, retry):
        self.health, self.metrics, self.retry = health, metrics, retry
        self._next_at = 0.0
        self._flowing = False  # records came in since the last refresh

    def records_came(self) -> None:
        self._flowing = True

    def soon(self) -> None:
        """Refresh at the next turn (after an assignment)."""
        self._next_at = 0.0

    def refresh(self, stream) -> bool:
        """The lag, when due; True when it was (a probe asks the brokers: the loop's turn times count it)."""
        now = time.monotonic()
        if now < self._next_at:
            return False
        self._next_at = now + LAG_EVERY_S
        flowing, self._flowing = self._flowing, False
        ok, lags = self.retry.once(
            lambda: stream.lag(timeout_s=PROBE_TIMEOUT_S, ask_broker=not flowing),
            "read the end offsets for the lag",
            probe=True,
        )
        if ok:
            self.metrics.set_lag(lags)
            if not flowing:  # asked of the brokers (with no partition too: the stream's lag says so)
                self.health.broker_ok = True
        return True
