"""The batch forms of the metrics' updates count exactly what the per-event forms count."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from service.metrics import LATENCY_BUCKETS, ServiceMetrics, SlidingRate, observe_many


@settings(max_examples=300, deadline=None)
@given(window=st.integers(1, 20), batches=st.lists(st.lists(st.booleans(), max_size=45), max_size=8))
def test_add_many_is_add_on_each(window, batches):
    one, many = SlidingRate(window), SlidingRate(window)
    for flags in batches:
        for flag in flags:
            one.add(flag)
        many.add_many(flags)
        assert list(many._flags) == list(one._flags)
        assert many._count == one._count == sum(one._flags)
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
