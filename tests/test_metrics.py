"""The batch forms of the metrics' updates count exactly what the per-event forms count."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from perceptron_stream.metrics import LATENCY_BUCKETS, ServiceMetrics, SlidingRate, observe_many
from prometheus_client import CollectorRegistry, Histogram, generate_latest


@settings(max_examples=300, deadline=None)
@given(window=st.integers(1, 20), batches=st.lists(st.lists(st.booleans(), max_size=45), max_size=8))
def test_add_many_is_add_on_each(window, batches):
    one, many = SlidingRate(window), SlidingRate(window)
    for flags in batches:
        for flag in flags:
            one.add(flag)
        many.add_many(flags)
        assert list(many._flags) == list(one._flags)  # noqa: SLF001 — the window itself: equal rates would hide a wrong order
        assert many._count == one._count == sum(one._flags)  # noqa: SLF001 — the count the rate is computed from
        assert many.value == one.value


def test_observe_many_is_observe_count_times():
    registries = CollectorRegistry(), CollectorRegistry()
    loop, batch = (Histogram("h_seconds", "h", buckets=LATENCY_BUCKETS, registry=r) for r in registries)
    rng = random.Random(7)
    values = [0.0, 0.0005, 0.00051, 10.0, 11.0, -1.0] + [rng.expovariate(20) for _ in range(50)]
    for value in values:
        count = rng.randint(0, 1200)
        for _ in range(count):
            loop.observe(value)
        observe_many(batch, value, count)
    lines = [[line for line in generate_latest(r).decode().splitlines() if "_created" not in line] for r in registries]
    sums = [float(next(line for line in ls if line.startswith("h_seconds_sum")).split()[1]) for ls in lines]
    assert sums[1] == pytest.approx(sums[0], rel=1e-12)  # value × count, not count additions: the last bits differ
    assert [line for line in lines[0] if "_sum" not in line] == [line for line in lines[1] if "_sum" not in line]


def test_observe_batch_counts_every_event():
    m = ServiceMetrics(window=4, version="test", variant="plain")
    m.observe_batch(labeled=3, unlabeled=2, mistake_flags=[True, False, True], updates=2, latency_s=0.003)
    m.observe_batch(labeled=2, unlabeled=0, mistake_flags=[False, False], updates=0, latency_s=0.2)
    text = generate_latest(m.registry).decode()
    assert 'perceptron_processing_latency_seconds_bucket{le="0.005"} 5.0' in text
    assert 'perceptron_processing_latency_seconds_bucket{le="0.25"} 7.0' in text
    assert "perceptron_processing_latency_seconds_count 7.0" in text
    assert "perceptron_mistake_rate 0.25" in text  # the last four labeled: False, True, False, False
    assert "perceptron_mistakes_total 2.0" in text and "perceptron_updates_total 2.0" in text


def test_observe_batch_counts_the_dropped_features():
    m = ServiceMetrics(window=4, version="test", variant="plain")
    m.observe_batch(labeled=2, unlabeled=0, mistake_flags=[True, False], updates=1, latency_s=0.001, dropped_features=7)
    m.observe_batch(labeled=1, unlabeled=1, mistake_flags=[False], updates=0, latency_s=0.001, dropped_features=0)
    m.observe_batch(labeled=1, unlabeled=0, mistake_flags=[True], updates=1, latency_s=0.001, dropped_features=5)
    assert _sample(m, "perceptron_dropped_features_total") == 12


# -- the metric list of issue 4, as exported -------------------------------------

#: Every metric family issue 4 (and the alerts) ask for, with its type. Expanded to
#: sample names it must equal SERVICE_METRICS of tests/support/metric_names.py,
#: the list the alert rules are checked against: the three cannot drift apart.
ISSUE_METRICS = {
    "perceptron_events": "counter",  # kind = labeled | unlabeled
    "perceptron_mistakes": "counter",
    "perceptron_updates": "counter",
    "perceptron_dropped_features": "counter",
    "perceptron_events_without_known_features": "counter",
    "perceptron_rejected_events": "counter",  # reason
    "perceptron_rejected_state": "counter",  # kind, reason
    "perceptron_mistake_rate": "gauge",
    "perceptron_mistake_rate_window_events": "gauge",
    "perceptron_processing_latency_seconds": "histogram",
    "perceptron_consumer_lag": "gauge",  # topic, partition
    "perceptron_weight_norm": "gauge",
    "perceptron_data_radius": "gauge",
    "perceptron_last_checkpoint_timestamp_seconds": "gauge",
    "perceptron_transactions": "counter",
    "perceptron_transaction_commit_seconds": "histogram",
    "perceptron_poll_loop_last_turn_timestamp_seconds": "gauge",
    "perceptron_assigned_partitions": "gauge",
    "perceptron_build_info": "gauge",  # version, variant: an Info is a gauge of 1 in the text format
    "perceptron_mixes": "counter",  # partition
    "perceptron_labels": "counter",  # outcome
    "perceptron_challenger_mistakes": "counter",  # challenger
    "perceptron_challenger_mistake_rate": "gauge",  # challenger
    "perceptron_drift_detected": "counter",
    "perceptron_last_drift_timestamp_seconds": "gauge",
    "perceptron_pending_labels": "gauge",
    "perceptron_early_labels": "gauge",
    "perceptron_label_delay_seconds": "histogram",
    "perceptron_mix_records_rejected": "counter",  # reason
    "perceptron_history_records": "counter",  # issue 37: the model history
    "perceptron_history_bytes": "counter",
    "perceptron_poll_loop_turn_seconds": "histogram",  # did (issue 38: where the tail comes from)
    "perceptron_poll_loop_flush_seconds": "histogram",  # a batch turn's wait for its acknowledgements
}
SAMPLE_SUFFIXES = {"counter": ["_total"], "gauge": [""], "histogram": ["_bucket", "_sum", "_count"]}


def _promtool() -> str:
    import shutil

    path = shutil.which("promtool")
    assert path, (
        "promtool is not on PATH: install Debian's package with `apt-get install -y prometheus` (tests/run.sh does it)"
    )
    return path


def _check_metrics(text: bytes):
    import subprocess

    return subprocess.run([_promtool(), "check", "metrics"], input=text, capture_output=True, timeout=60)


def _exported() -> bytes:
    m = ServiceMetrics(window=50, version="1.2.3", variant="plain", challengers=["averaged"])
    m.set_lag({("points", 0): 5})  # labelled families get a series, so their samples show too
    m.mixes.labels("0").inc()
    m.mix_rejected.labels("damaged").inc()
    return generate_latest(m.registry)


def test_issue_list_is_the_list_the_alert_rules_are_checked_against():
    from tests.support.metric_names import SERVICE_METRICS

    samples = {family + suffix for family, kind in ISSUE_METRICS.items() for suffix in SAMPLE_SUFFIXES[kind]}
    assert samples == SERVICE_METRICS


def test_every_metric_is_exported_with_its_type_and_help_and_passes_promtool():
    from prometheus_client.parser import text_string_to_metric_families

    text = _exported()
    proc = _check_metrics(text)
    assert proc.returncode == 0 and not proc.stdout.strip(), (proc.stdout + proc.stderr).decode()
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    # prometheus-client adds a <name>_created gauge beside each counter and histogram
    exported = {
        name
        for name in families
        if name.startswith("perceptron_")
        and not (name.endswith("_created") and name.removesuffix("_created") in families)
    }
    assert exported == set(ISSUE_METRICS), exported ^ set(ISSUE_METRICS)
    for name, kind in ISSUE_METRICS.items():
        family = families[name]
        assert family.type == kind, (name, family.type)
        assert len(family.documentation) > 10, (name, family.documentation)
        sample_names = {s.name for s in family.samples}
        assert sample_names == {name + suffix for suffix in SAMPLE_SUFFIXES[kind]}, (name, sample_names)
    [build] = families["perceptron_build_info"].samples
    assert build.labels == {"version": "1.2.3", "variant": "plain"} and build.value == 1
    assert {s.labels["kind"] for s in families["perceptron_events"].samples if s.name.endswith("_total")} == {
        "labeled",
        "unlabeled",
    }


def test_promtool_check_metrics_can_fail():
    """The check above means something: promtool flags a counter without _total and a metric without help."""
    bad = b"# TYPE perceptron_oops counter\nperceptron_oops 1\n"
    proc = _check_metrics(bad)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and b'"_total" suffix' in out and b"no help text" in out, out


def test_poll_loop_gauge_follows_the_tracked_health():
    import math
    import time

    from perceptron_stream.runtime.health import Health

    m = ServiceMetrics(window=4, version="test", variant="plain")
    assert math.isnan(_sample(m, "perceptron_poll_loop_last_turn_timestamp_seconds"))  # no Health tracked: unknown
    health = Health(stall_timeout_s=1.0)
    m.track_poll_loop(health)
    health.last_beat = time.monotonic() - 120  # the loop last turned two minutes ago
    assert _sample(m, "perceptron_poll_loop_last_turn_timestamp_seconds") == pytest.approx(time.time() - 120, abs=1)
    health.beat()
    assert _sample(m, "perceptron_poll_loop_last_turn_timestamp_seconds") == pytest.approx(time.time(), abs=1)


def test_assigned_partitions_gauge():
    m = ServiceMetrics(window=4, version="test", variant="plain")
    assert _sample(m, "perceptron_assigned_partitions") == 0
    m.set_assigned(3)
    assert _sample(m, "perceptron_assigned_partitions") == 3
    m.set_assigned(0)
    assert _sample(m, "perceptron_assigned_partitions") == 0


def _sample(m: ServiceMetrics, name: str) -> float:
    value = m.registry.get_sample_value(name)
    assert value is not None, name
    return value
