"""The Grafana side of deploy/: provisioning files and the perceptron-stream dashboard.

Structure (unique panel ids, a layout that fits the grid, the provisioned
datasource uid everywhere, an expr in every target, the panels the service
needs). Every expr sent to a real Prometheus is
tests/integration/test_dashboard_queries.py.

The end-to-end test (tests/integration/test_prometheus_e2e.py) gets every
panel's PromQL, Grafana's variables substituted, from
tests/support/prometheus_server.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.prometheus_server import (
    DASHBOARD_PATH,
    dashboard_queries,
    dashboard_variable_values,
    iter_panels,
    load_dashboard,
    prometheus_annotations,
    substitute_grafana_variables,
)

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
DATASOURCES = GRAFANA / "provisioning" / "datasources" / "prometheus.yml"
PROVIDERS = GRAFANA / "provisioning" / "dashboards" / "dashboards.yml"


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    return load_dashboard()


def provisioned_datasource() -> dict[str, Any]:
    doc = yaml.safe_load(DATASOURCES.read_text())
    assert doc["apiVersion"] == 1
    [ds] = [d for d in doc["datasources"] if d["type"] == "prometheus"]
    return ds


def all_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in iter_panels(dashboard["panels"]) for t in p.get("targets", [])]


# -- provisioning ---------------------------------------------------------------


def test_datasource_provisioning_points_at_the_compose_prometheus() -> None:
    ds = provisioned_datasource()
    assert ds["uid"] == "prometheus"
    assert ds["url"] == "http://prometheus:9090"
    assert ds["access"] == "proxy"
    assert ds.get("isDefault") is True


def test_dashboard_provider_loads_files_from_the_dashboards_path() -> None:
    doc = yaml.safe_load(PROVIDERS.read_text())
    assert doc["apiVersion"] == 1
    [provider] = doc["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    # the dashboard is a file in the directory mounted there
    assert DASHBOARD_PATH.parent == GRAFANA / "dashboards" and DASHBOARD_PATH.is_file()


# -- structure ------------------------------------------------------------------


def test_dashboard_top_level(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "perceptron-stream"
    assert dashboard["title"] == "perceptron-stream"
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["id"] is None  # provisioning assigns it
    assert dashboard["panels"]
    assert dashboard["time"]["from"].startswith("now-")


def test_panel_ids_are_unique(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in iter_panels(dashboard["panels"])]
    assert all(isinstance(i, int) and i > 0 for i in ids), ids
    assert len(ids) == len(set(ids)), ids


def test_panels_fit_the_grid_without_overlap(dashboard: dict[str, Any]) -> None:
    cells: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["y"] >= 0, panel["title"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']!r} overlaps {cells[(x, y)]!r}"
                cells[(x, y)] = panel["title"]


def test_panel_types_and_titles(dashboard: dict[str, Any]) -> None:
    for panel in iter_panels(dashboard["panels"]):
        assert panel["type"] in {"timeseries", "stat", "row"}, panel
        assert panel["title"].strip()
    types = {p["type"] for p in dashboard["panels"]}
    assert {"timeseries", "stat"} <= types


def test_every_datasource_is_the_provisioned_one(dashboard: dict[str, Any]) -> None:
    uid = provisioned_datasource()["uid"]
    expected = {"type": "prometheus", "uid": uid}
    for panel in iter_panels(dashboard["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == expected, panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", expected) == expected, (panel["title"], target["refId"])
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            assert var["datasource"] == expected, var["name"]


def test_every_target_has_an_expr_and_a_unique_ref_id(dashboard: dict[str, Any]) -> None:
    for panel in iter_panels(dashboard["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert isinstance(target.get("expr"), str) and target["expr"].strip(), (panel["title"], target)


def _panel_exprs(dashboard: dict[str, Any], title_part: str) -> list[str]:
    panels = [p for p in dashboard["panels"] if title_part.lower() in p["title"].lower() and p["type"] == "timeseries"]
    assert panels, f"no timeseries panel titled like {title_part!r}"
    return [t["expr"] for p in panels for t in p["targets"]]


def test_the_panels_the_service_needs(dashboard: dict[str, Any]) -> None:
    compact = lambda exprs: [re.sub(r"\s+", "", e) for e in exprs]  # noqa: E731
    mistake_rate = compact(_panel_exprs(dashboard, "mistake rate"))
    assert any(e.startswith("perceptron_mistake_rate{") for e in mistake_rate), mistake_rate
    cumulative = compact(_panel_exprs(dashboard, "cumulative mistakes"))
    assert any("perceptron_mistakes_total{" in e for e in cumulative)
    assert any("perceptron_updates_total{" in e for e in cumulative)
    events = compact(_panel_exprs(dashboard, "events per second"))
    assert any(e.startswith("sumby(kind)(rate(perceptron_events_total{") for e in events), events
    rejected = compact(_panel_exprs(dashboard, "rejected events per second"))
    assert any(e.startswith("sumby(reason)(rate(perceptron_rejected_events_total{") for e in rejected), rejected
    lag = compact(_panel_exprs(dashboard, "lag per partition"))
    assert any("by(topic,partition)" in e and "perceptron_consumer_lag{" in e for e in lag), lag
    latency = compact(_panel_exprs(dashboard, "latency"))
    for q in ("0.5", "0.99"):
        assert any(
            e.startswith(f"histogram_quantile({q},sumby(le)(rate(perceptron_processing_latency_seconds_bucket{{")
            for e in latency
        ), (q, latency)
    norm = compact(_panel_exprs(dashboard, "weight norm"))
    assert any(e.startswith("perceptron_weight_norm{") for e in norm)
    assert any(e.startswith("perceptron_data_radius{") for e in norm)


def test_the_scale_out_panels(dashboard: dict[str, Any]) -> None:
    """Instances and partitions per instance, and per partition the weight norm, the mixes and the rejected mix records.

    The partition label exists only in partition scope, and the mix counters' series only once something was
    mixed or rejected: the panels fall back to a zero built from a series every running service has, so they
    show data (zero) in group scope too, where the end-to-end test runs them.
    """
    compact = lambda exprs: [re.sub(r"\s+", "", e) for e in exprs]  # noqa: E731
    instances = compact(_panel_exprs(dashboard, "instances and partitions"))
    assert any(e.startswith("sum(up{") for e in instances), instances
    assert any(e.startswith("sumby(instance)(perceptron_assigned_partitions{") for e in instances), instances
    norm = compact(_panel_exprs(dashboard, "weight norm per partition"))
    assert any(e.startswith("maxby(partition)(perceptron_weight_norm{") for e in norm), norm
    mixes = compact(_panel_exprs(dashboard, "mixes per second by partition"))
    assert any(e.startswith("sumby(partition)(rate(perceptron_mixes_total{") for e in mixes), mixes
    rejected = compact(_panel_exprs(dashboard, "mix records rejected"))
    assert any(e.startswith("sumby(reason)(rate(perceptron_mix_records_rejected_total{") for e in rejected), rejected
    # a fallback stands in only for missing series: 0 times a series of the service, never a bare constant
    for expr in mixes + rejected:
        _, sep, fallback = expr.partition(")or")
        assert sep and "0*" in fallback and "perceptron_" in fallback, expr


def test_the_delayed_label_and_model_operation_panels(dashboard: dict[str, Any]) -> None:
    """Pending labels, label delay p50/p99, labels by outcome; the champion's mistake rate beside the challengers'; drift."""
    compact = lambda exprs: [re.sub(r"\s+", "", e) for e in exprs]  # noqa: E731
    pending = compact(_panel_exprs(dashboard, "pending labels"))
    assert any(e.startswith("sumby(instance)(perceptron_pending_labels{") for e in pending), pending
    assert any(e.startswith("sumby(instance)(perceptron_early_labels{") for e in pending), (
        pending
    )  # labels before their point
    delay = compact(_panel_exprs(dashboard, "label delay"))
    for q in ("0.5", "0.99"):
        assert any(
            e.startswith(f"histogram_quantile({q},sumby(le)(rate(perceptron_label_delay_seconds_bucket{{")
            for e in delay
        ), (q, delay)
    outcomes = compact(_panel_exprs(dashboard, "labels per second by outcome"))
    assert any(e.startswith("sumby(outcome)(rate(perceptron_labels_total{") for e in outcomes), outcomes
    [panel] = [p for p in dashboard["panels"] if p["title"] == "Champion and challengers: mistake rate"]
    exprs = compact(t["expr"] for t in panel["targets"])
    assert any(e.startswith("perceptron_mistake_rate{") for e in exprs) and any(
        e.startswith("perceptron_challenger_mistake_rate{") for e in exprs
    ), exprs
    assert any("{{challenger}}" in t["legendFormat"] for t in panel["targets"])
    assert panel["fieldConfig"]["defaults"]["unit"] == "percentunit"
    stats = {p["title"]: compact(t["expr"] for t in p["targets"]) for p in dashboard["panels"] if p["type"] == "stat"}
    assert stats["Last drift"] == [
        'max(perceptron_last_drift_timestamp_seconds{job=~"$job",instance=~"$instance"})*1000'
    ]
    [last] = [p for p in dashboard["panels"] if p["title"] == "Last drift"]
    assert last["fieldConfig"]["defaults"]["unit"] == "dateTimeFromNow"
    assert {"0": {"text": "never", "index": 0}} in [m["options"] for m in last["fieldConfig"]["defaults"]["mappings"]]


def test_the_exactly_once_transaction_panels(dashboard: dict[str, Any]) -> None:
    """Transactions per second by result (committed, aborted) and the commit's p50/p99 (--processing-guarantee exactly-once)."""
    compact = lambda exprs: [re.sub(r"\s+", "", e) for e in exprs]  # noqa: E731
    results = compact(_panel_exprs(dashboard, "transactions per second by result"))
    assert results == [
        'sumby(result)(rate(perceptron_transactions_total{job=~"$job",instance=~"$instance"}[$__rate_interval]))'
    ]
    commit = compact(_panel_exprs(dashboard, "transaction commit time"))
    for q in ("0.5", "0.99"):
        assert any(
            e.startswith(f"histogram_quantile({q},sumby(le)(rate(perceptron_transaction_commit_seconds_bucket{{")
            for e in commit
        ), (q, commit)
    [panel] = [p for p in dashboard["panels"] if p["title"] == "Transaction commit time"]
    assert panel["fieldConfig"]["defaults"]["unit"] == "s"


def test_drift_annotation(dashboard: dict[str, Any]) -> None:
    """A drift marks every time series: an annotation where the drift counter went up. increase, not changes: a
    restart sets the counter back to 0, which is no drift."""
    [drift] = [a for a in prometheus_annotations(dashboard) if a["name"] == "Drift detected"]
    assert drift["enable"] is True and drift["datasource"] == {
        "type": "prometheus",
        "uid": provisioned_datasource()["uid"],
    }
    assert (
        re.sub(r"\s+", "", drift["expr"])
        == 'increase(perceptron_drift_detected_total{job=~"$job",instance=~"$instance"}[$__rate_interval])>0'
    )
    assert drift["tagKeys"] == "instance" and "{{instance}}" in drift["textFormat"]


def test_annotation_queries_substitute_to_plain_promql(dashboard: dict[str, Any]) -> None:
    values = dashboard_variable_values(dashboard)
    for annotation in prometheus_annotations(dashboard):
        query = substitute_grafana_variables(annotation["expr"], values)
        assert "$" not in query, query


#: How Grafana shows the value 1.0 in a unit: percentunit reads values as
#: fractions (1.0 is 100%), the plain units show the number as it is.
ONE_IN_UNIT = {"percentunit": "100%", "none": "1", "short": "1"}


def test_cpu_panel_description_matches_its_unit(dashboard: dict[str, Any]) -> None:
    """rate(process_cpu_seconds_total) is 1.0 for one busy core: the description must say one core
    is what the unit shows for 1.0 (1 with a plain unit, 100% with percentunit), and not the other."""
    [panel] = [p for p in iter_panels(dashboard["panels"]) if p["title"] == "CPU"]
    [expr] = [t["expr"] for t in panel["targets"]]
    assert re.fullmatch(r"rate\(process_cpu_seconds_total\{[^}]*\}\[\$__rate_interval\]\)", expr), expr  # cores
    unit = panel["fieldConfig"]["defaults"].get("unit", "none")
    assert unit in ONE_IN_UNIT, f"CPU panel unit {unit!r}: say in ONE_IN_UNIT how it shows one core"
    description = panel["description"]
    assert f"{ONE_IN_UNIT[unit]} = one core" in description, (unit, description)
    for other in set(ONE_IN_UNIT.values()) - {ONE_IN_UNIT[unit]}:
        assert not re.search(rf"(?<![\d.]){re.escape(other)} = one core", description), (unit, description)


def test_no_query_falls_back_to_a_constant(dashboard: dict[str, Any]) -> None:
    """`... or vector(0)` returns data for a service that exports nothing: the end-to-end
    check that every panel returns data would then prove nothing. The service creates
    its unlabelled series, and the rejected-events series of every reason, at start."""
    for expr in all_exprs(dashboard):
        assert not re.search(r"\b(vector|scalar)\s*\(", expr), expr


def test_rates_use_the_rate_interval(dashboard: dict[str, Any]) -> None:
    for expr in all_exprs(dashboard):
        for window in re.findall(r"\[([^\]]+)\]", expr):
            assert window == "$__rate_interval", expr


def test_every_selector_is_narrowed_by_the_dashboard_variables(dashboard: dict[str, Any]) -> None:
    # each metric selector carries job=~"$job" and instance=~"$instance", so the
    # dropdowns apply everywhere (and process_* of other jobs stay out)
    for expr in all_exprs(dashboard):
        selectors = re.findall(r"\b([a-z_]+)\{([^}]*)\}", expr)
        assert selectors, expr
        for name, matchers in selectors:
            assert 'job=~"$job"' in matchers and 'instance=~"$instance"' in matchers, (name, expr)


def test_variables_substitute_to_plain_promql(dashboard: dict[str, Any]) -> None:
    values = dashboard_variable_values(dashboard)
    assert values["job"] == "perceptron-stream"
    assert values["instance"] == ".*"
    assert values["__rate_interval"] == "1m"
    queries = dashboard_queries()
    assert len(queries) == len(all_exprs(dashboard))
    for q in queries:
        assert "$" not in q and "[[" not in q, q


# -- every expr parses on a real Prometheus --------------------------------------
