"""Waiting for what a test cannot know the time of (a broker's answer, a service's output): one poll loop."""

from __future__ import annotations

import time


def wait_until(predicate, timeout: float = 60.0, interval: float = 0.1, what: str = "condition"):
    """``predicate()`` once it is true (that value), polled every ``interval`` s; fails the test after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
