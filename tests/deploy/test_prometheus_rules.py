"""Prometheus config and alert rules of deploy/prometheus/, checked with promtool.

- ``promtool check config`` / ``check rules`` / ``test rules`` pass;
- the scrape config and every alert carry what operators rely on, a runbook_url
  among it: the alert's page on the documentation site (docs/operations/runbooks/);
- the unit tests in alerts_test.yml can fail: for every alert, a copy of the
  rules where it never fires fails its firing tests, and a copy where it
  always fires fails its silent tests.

A real Prometheus loading and evaluating them is tests/integration/test_alert_rules.py.
"""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.docs import RUNBOOKS, runbook_page, runbook_url, site_url
from tests.support.metric_names import SERVICE_METRICS
from tests.support.prometheus_server import alert_rules

REPO = Path(__file__).resolve().parents[2]
PROM_DIR = REPO / "deploy" / "prometheus"
CONFIG = PROM_DIR / "prometheus.yml"
ALERTS = PROM_DIR / "alerts.yml"
ALERTS_TEST = PROM_DIR / "alerts_test.yml"

EXPECTED_ALERTS = {
    "PerceptronMistakeRateHigh",
    "PerceptronConsumerLagGrowing",
    "PerceptronNoEventsProcessed",
    "PerceptronTargetDown",
    "PerceptronPollLoopStalled",
    "PerceptronNoPartitionsAssigned",
    "PerceptronMixRecordsRejected",
    "PerceptronDriftDetected",
    "PerceptronLabelsUnmatched",
    "PerceptronEventsWithoutKnownFeatures",
}


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, (
        "promtool is not on PATH: install Debian's package with `apt-get install -y prometheus` (tests/run.sh does it)"
    )
    return path


def run_promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


# -- promtool -------------------------------------------------------------------


def test_promtool_check_config_resolves_the_rule_files(tmp_path: Path) -> None:
    # run from elsewhere: rule_files must resolve relative to the config file, as in the container
    proc = run_promtool("check", "config", str(CONFIG), cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "is valid prometheus config file syntax" in out, out
    assert "1 rule files found" in out, out
    assert f"{len(alert_rules())} rules found" in out, out


def test_promtool_check_rules() -> None:
    proc = run_promtool("check", "rules", str(ALERTS), cwd=PROM_DIR)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"SUCCESS: {len(alert_rules())} rules found" in out, out


def test_promtool_unit_tests_pass(tmp_path: Path) -> None:
    proc = run_promtool("test", "rules", str(ALERTS_TEST), cwd=tmp_path)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "SUCCESS" in out and "FAILED" not in out, out


def test_promtool_notices_a_broken_rule(tmp_path: Path) -> None:
    """The check above could fail: promtool rejects a rule whose PromQL does not parse."""
    broken = tmp_path / "alerts.yml"
    broken.write_text(
        ALERTS.read_text().replace("perceptron_mistake_rate > 0.25", "perceptron_mistake_rate > > 0.25", 1)
    )
    proc = run_promtool("check", "rules", str(broken), cwd=tmp_path)
    assert proc.returncode != 0, proc.stdout + proc.stderr


# -- what the files say ---------------------------------------------------------


def test_scrape_config_targets_the_service() -> None:
    doc = yaml.safe_load(CONFIG.read_text())
    assert doc["rule_files"] == ["alerts.yml"]
    jobs = {job["job_name"]: job for job in doc["scrape_configs"]}
    job = jobs["perceptron-stream"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    assert [t for sc in job["static_configs"] for t in sc["targets"]] == ["perceptron-stream:8000"]


def test_every_alert_has_severity_summary_description_and_a_duration() -> None:
    rules = alert_rules()
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names)), names
    assert set(names) >= EXPECTED_ALERTS
    for rule in rules:
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"].strip(), rule["alert"]
        assert rule["annotations"]["description"].strip(), rule["alert"]
        assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["alert"]


def test_every_alert_has_a_runbook_url_whose_page_exists() -> None:
    for rule in alert_rules():
        alert = rule["alert"]
        url = rule["annotations"].get("runbook_url")
        assert url == runbook_url(alert), (
            alert,
            url,
            f"expected {runbook_url(alert)} (mkdocs.yml site_url + the page)",
        )
        page = runbook_page(alert)
        assert page.is_file(), f"{alert}: runbook_url points at {page.relative_to(REPO)}, which does not exist"
        assert page.read_text(encoding="utf-8").startswith(f"# {alert}\n"), page


def test_a_runbook_that_quotes_its_rule_quotes_it_as_it_is() -> None:
    """A runbook's first PromQL block is its alert's expression, laid out for reading: a rule changed without its
    page (three were, when labels stopped counting as events) fails here."""
    quoted = 0
    for rule in alert_rules():
        blocks = re.findall(
            r"```promql\n(.*?)\n```", runbook_page(rule["alert"]).read_text(encoding="utf-8"), re.DOTALL
        )
        if blocks and "perceptron_mistake_rate >" not in blocks[0]:
            assert " ".join(blocks[0].split()) == " ".join(rule["expr"].split()), rule["alert"]
            quoted += 1
    assert quoted >= 10


def test_every_runbook_page_is_an_alerts() -> None:
    pages = {page.stem for page in RUNBOOKS.glob("*.md")} - {"index"}
    assert pages == {rule["alert"] for rule in alert_rules()}


def test_the_runbooks_live_under_the_site_url() -> None:
    assert site_url().startswith("https://") and site_url().endswith("/"), site_url()
    assert runbook_url("PerceptronTargetDown") == site_url() + "operations/runbooks/PerceptronTargetDown/"


def test_every_firing_expectation_names_the_runbook() -> None:
    """promtool compares every annotation of an expected alert: the unit tests see runbook_url too."""
    tests_doc = yaml.safe_load(ALERTS_TEST.read_text())
    for case in tests_doc["tests"]:
        for check in case.get("alert_rule_test", []):
            for expected in check.get("exp_alerts", []):
                assert expected["exp_annotations"]["runbook_url"] == runbook_url(check["alertname"]), check["alertname"]


def test_expected_durations() -> None:
    durations = {rule["alert"]: rule["for"] for rule in alert_rules()}
    assert durations["PerceptronMistakeRateHigh"] == "5m"
    assert durations["PerceptronConsumerLagGrowing"] == "10m"
    assert durations["PerceptronNoEventsProcessed"] == "5m"
    assert durations["PerceptronTargetDown"] == "1m"
    assert durations["PerceptronPollLoopStalled"] == "5m"
    assert durations["PerceptronNoPartitionsAssigned"] == "5m"
    assert durations["PerceptronMixRecordsRejected"] == "1m"
    assert durations["PerceptronDriftDetected"] == "0s"  # a drift is an event: at once
    assert durations["PerceptronLabelsUnmatched"] == "5m"
    assert durations["PerceptronTransactionsAborting"] == "0s"  # an aborted transaction stopped an instance: at once


def test_mistake_rate_alert_needs_labeled_events_flowing() -> None:
    expr = next(r["expr"] for r in alert_rules() if r["alert"] == "PerceptronMistakeRateHigh")
    assert 'rate(perceptron_events_total{kind="labeled"}' in expr, expr


def test_rules_name_only_metrics_the_service_exports() -> None:
    for rule in alert_rules():
        used = set(re.findall(r"\bperceptron_[a-z_]+\b", rule["expr"]))
        assert used <= SERVICE_METRICS, (rule["alert"], used - SERVICE_METRICS)
    assert 'up{job="perceptron-stream"}' in next(
        r["expr"] for r in alert_rules() if r["alert"] == "PerceptronTargetDown"
    )


# -- the unit tests can fail ----------------------------------------------------


def _subset(tests_doc: dict[str, Any], alert: str, *, firing: bool) -> dict[str, Any]:
    """alerts_test.yml reduced to the expectations on `alert` that it fires (or stays silent)."""
    doc = copy.deepcopy(tests_doc)
    doc["rule_files"] = ["alerts.yml"]
    kept = []
    for case in doc["tests"]:
        checks = [
            c
            for c in case.get("alert_rule_test", [])
            if c["alertname"] == alert and bool(c.get("exp_alerts")) == firing
        ]
        if checks:
            case["alert_rule_test"] = checks
            case.pop("promql_expr_test", None)
            kept.append(case)
    doc["tests"] = kept
    return doc


def _mutated_rules(alert: str, expr: str) -> dict[str, Any]:
    doc = yaml.safe_load(ALERTS.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                rule["expr"] = expr
                rule["for"] = "0s"
    return doc


@pytest.mark.parametrize("alert", sorted(rule["alert"] for rule in alert_rules()))
def test_each_alert_has_unit_tests_that_catch_a_wrong_rule(alert: str, tmp_path: Path) -> None:
    tests_doc = yaml.safe_load(ALERTS_TEST.read_text())
    for firing, wrong_expr in ((True, "vector(1) == 0"), (False, "vector(1)")):
        kind = "firing" if firing else "silent"
        subset = _subset(tests_doc, alert, firing=firing)
        assert subset["tests"], f"alerts_test.yml has no {kind} expectation for {alert}"
        work = tmp_path / kind
        work.mkdir()
        (work / "tests.yml").write_text(yaml.safe_dump(subset, sort_keys=False))
        # the right rules pass the subset ...
        shutil.copy(ALERTS, work / "alerts.yml")
        proc = run_promtool("test", "rules", "tests.yml", cwd=work)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        # ... a rule that never fires (or always fires) fails it
        (work / "alerts.yml").write_text(yaml.safe_dump(_mutated_rules(alert, wrong_expr), sort_keys=False))
        proc = run_promtool("test", "rules", "tests.yml", cwd=work)
        assert proc.returncode != 0, f"the {kind} tests of {alert} pass with expr {wrong_expr!r}:\n{proc.stdout}"
