"""Every PromQL of the Grafana dashboard (deploy/grafana) parses in a real Prometheus.

A parse error comes back as HTTP 400 bad_data; the first test shows the check
can fail. The dashboard's structure is tests/deploy/test_grafana_dashboard.py's.
"""

from __future__ import annotations

import re

import pytest

from tests.support.prometheus_server import (
    PrometheusServer,
    dashboard_targets,
    dashboard_variable_values,
    load_dashboard,
    prometheus_annotations,
    substitute_grafana_variables,
)


def test_a_parse_error_is_noticed(prometheus: PrometheusServer) -> None:
    """The check below could fail: a bad expr gets 400 bad_data."""
    status, body = prometheus.query_raw("sum by (kind) (rate(perceptron_events_total[1m])")
    assert status == 400 and body["errorType"] == "bad_data", body
    status, body = prometheus.query_raw("up")
    assert status == 200 and body["status"] == "success", body


@pytest.mark.parametrize(("title", "ref", "expr"), dashboard_targets(), ids=lambda v: str(v)[:40])
def test_dashboard_expr_parses_in_prometheus(prometheus: PrometheusServer, title: str, ref: str, expr: str) -> None:
    status, body = prometheus.query_raw(expr)
    assert body.get("errorType") != "bad_data", f"{title} [{ref}]: {expr}\n{body.get('error')}"
    assert status == 200 and body["status"] == "success", (title, ref, body)
    assert body["data"]["resultType"] == "vector", (title, ref, body["data"]["resultType"])


def test_annotation_queries_parse_in_prometheus(prometheus: PrometheusServer) -> None:
    dashboard = load_dashboard()
    values = dashboard_variable_values(dashboard)
    for annotation in prometheus_annotations(dashboard):
        status, body = prometheus.query_raw(substitute_grafana_variables(annotation["expr"], values))
        assert status == 200 and body["status"] == "success", (annotation["name"], body)


def test_variable_queries_parse_in_prometheus(prometheus: PrometheusServer) -> None:
    dashboard = load_dashboard()
    values = dashboard_variable_values(dashboard)
    for var in dashboard["templating"]["list"]:
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["definition"])
        assert m, var["definition"]
        assert var["query"]["query"] == var["definition"]
        selector = substitute_grafana_variables(m.group(1), values)
        status, body = prometheus.api("series", {"match[]": selector})
        assert status == 200 and body["status"] == "success", (var["name"], body)
