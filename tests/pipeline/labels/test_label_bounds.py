"""A label batch's bounds (Joiner.label_bounds, used by label_many) give each label the times two believed() calls
give it (its time, and its mark's on the TTL's clock), as label() takes them."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from tests.support.labels import make_joiner

MS = st.integers(-(10**13), 10**13)


@given(st.lists(MS, min_size=1, max_size=20), MS, st.one_of(st.just(-1), MS), st.sampled_from([math.inf, 0.0, 60.0]))
def test_the_bounds_give_each_label_the_times_label_at_gives_it(stamps, wall_ms, clock, skew):
    joiner = make_joiner(max_clock_skew=skew, wall=lambda: wall_ms / 1000)
    now_ms = joiner.wall_ms()
    latest, earliest = joiner.label_bounds(now_ms, clock)
    for stamp in stamps:
        at = joiner.believed(stamp, now_ms=now_ms)
        assert min(stamp, latest) == at and max(min(stamp, latest), earliest) == joiner.believed(at, clock, now_ms)


def test_a_batch_is_bounded_by_the_wall_clock_and_the_ttl_clock():
    joiner = make_joiner(max_clock_skew=60.0, wall=lambda: 1_000.0)
    assert joiner.label_bounds(joiner.wall_ms(), 500_000) == (1_060_000, 440_000)
    assert joiner.label_bounds(joiner.wall_ms(), -1) == (1_060_000, 940_000)  # no clock yet: the wall clock's
    assert make_joiner().label_bounds(None, 500_000) == (math.inf, -math.inf)
