"""The alert rules of deploy/prometheus/alerts.yml loaded and evaluated by a real Prometheus.

The rules' static checks (promtool, their unit tests, the metric names they
use) are tests/deploy/test_prometheus_rules.py's.
"""

from __future__ import annotations

import socket
import time
from typing import Any

from tests.support.prometheus_server import ALERTS_PATH, PrometheusServer, alert_rules


def test_real_prometheus_loads_and_evaluates_every_rule(prometheus_factory) -> None:
    with socket.socket() as s:  # a port nobody listens on: the target is down
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    prom: PrometheusServer = prometheus_factory([dead], rule_files=[ALERTS_PATH])
    prom.wait_for('up{job="perceptron-stream"}', lambda r: len(r) == 1 and r[0]["value"][1] == "0", timeout=20)

    def rules_now() -> dict[str, dict[str, Any]]:
        return {r["name"]: r for g in prom.rule_groups() for r in g["rules"]}

    def down_alert(rules: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            a for a in rules.get("PerceptronTargetDown", {}).get("alerts", []) if a["labels"].get("instance") == dead
        ]

    # every rule evaluated after the first failed scrape (evaluation and scrape run each second)
    deadline = time.monotonic() + 20
    rules = rules_now()
    while not down_alert(rules) and time.monotonic() < deadline:
        time.sleep(0.25)
        rules = rules_now()
    assert set(rules) == {r["alert"] for r in alert_rules()}
    for name, rule in rules.items():
        assert rule["health"] == "ok", (name, rule.get("lastError"))
        assert not rule["lastEvaluation"].startswith("0001"), (name, "never evaluated")
    # the target is down: the alert is pending (it fires after 1 minute), with the target's labels
    [alert] = down_alert(rules)
    assert alert["state"] == "pending", alert
    assert alert["labels"]["job"] == "perceptron-stream" and alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["summary"] == f"perceptron-stream {dead} is down"
    for name in set(rules) - {"PerceptronTargetDown"}:
        assert rules[name]["state"] == "inactive", rules[name]
