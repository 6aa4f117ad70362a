"""The service's HTTP endpoints as a test reads them: a GET that never raises, and /metrics once they show a line."""

from __future__ import annotations

import urllib.error
import urllib.request

from tests.support.waiting import wait_until


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """The status and body of a GET; ``(0, "")`` while nothing listens (yet)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, ConnectionError):  # nothing listens (yet)
        return 0, ""
    except TimeoutError:  # a service too busy to answer in time (a loaded machine): asked again by the caller
        return 0, ""


def metrics_once(metrics_url: str, *lines: str, timeout: float = 30.0) -> str:
    """A service's /metrics once they show every one of ``lines``; after ``timeout``, as they are then (the
    caller's assertion says what they hold). A batch is counted just after its outputs are acknowledged, one
    counter after another, so a test that has read the outputs may be a moment ahead of the counts: wait for
    each line the test asserts, not for one that may hold a batch early (a gauge already 0)."""
    try:
        return wait_until(
            lambda: (text := http_get(metrics_url + "/metrics")[1]) and all(line in text for line in lines) and text,
            timeout,
            what=" and ".join(lines),
        )
    except AssertionError:
        return http_get(metrics_url + "/metrics")[1]


def metric(text: str, line_start: str) -> float:
    """The value of the /metrics line that starts with ``line_start`` (name and labels), 0 when there is none."""
    found = [line.rsplit(" ", 1)[1] for line in text.splitlines() if line.startswith(line_start + " ")]
    return float(found[0]) if found else 0.0
