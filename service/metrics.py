"""Prometheus metrics, with prometheus-client's plain API: every metric of the service, named once.

The only module that defines metrics; service/http.py serves them. Each
service instance gets its own registry, so several can live in one test
process.
"""

from __future__ import annotations

import collections
import math
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Sequence
from functools import partial
from itertools import islice

from perceptron_stream.wire.messages import REASONS
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    Info,
    PlatformCollector,
    ProcessCollector,
)

#: A second to a week: labels come from seconds (a click) to months (a default) after their point.
LABEL_DELAY_BUCKETS = (1, 5, 15, 60, 300, 900, 3600, 4 * 3600, 86400, 7 * 86400, 30 * 86400)
#: What a turn of the poll loop may have done: the values of perceptron_poll_loop_turn_seconds' ``did``
#: (runtime/loop.py's turn_did decides).
TURN_KINDS = ("batch", "labels", "mix", "commit", "checkpoint", "transaction", "probe")
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class SlidingRate:
    """Share of True among the last ``window`` flags, updated in O(1) per flag, in C per batch.

    >>> rate = SlidingRate(window=3)
    >>> for flag in (True, False, False, True):
    ...     rate.add(flag)
    >>> round(rate.value, 3)      # the last three: False, False, True
    0.333
    >>> rate.add_many([True, False])
    >>> round(rate.value, 3)      # True, True, False
    0.667
    """

    def __init__(self, window: int):
        self.window = window
        self._flags: deque[bool] = deque(maxlen=window)
        self._count = 0

    def add(self, flag: bool) -> None:
        if len(self._flags) == self.window:
            self._count -= self._flags[0]  # the flag the append pushes out
        self._flags.append(flag)
        self._count += flag

    def add_many(self, flags: list[bool]) -> None:
        """Add ``flags`` in order (the same as ``add`` on each, without a Python-level loop)."""
        n = len(flags)
        if n >= self.window:
            self._flags.clear()
            self._flags.extend(flags[n - self.window :])
            self._count = sum(self._flags)
            return
        out = len(self._flags) + n - self.window  # how many the extend pushes out, from the left
        if out > 0:
            self._count -= sum(islice(self._flags, out))
        self._flags.extend(flags)
        self._count += sum(flags)

    @property
    def value(self) -> float:
        return self._count / len(self._flags) if self._flags else 0.0


def observe_many(histogram: Histogram, value: float, count: int) -> None:
    """``histogram.observe(value)`` ``count`` times, in O(1).

    prometheus-client has no weighted observe; this adds to the sum and to
    the one bucket the value falls in, as ``observe`` does, through its
    (long-stable) internals, and falls back to the loop if they change.
    """
    if count <= 0:
        return
    try:
        bounds, buckets, total = histogram._upper_bounds, histogram._buckets, histogram._sum  # noqa: SLF001 — prometheus-client has no weighted observe
    except AttributeError:  # pragma: no cover - another prometheus-client layout
        for _ in range(count):
            histogram.observe(value)
        return
    total.inc(value * count)
    buckets[bisect_left(bounds, value)].inc(count)  # the first bound >= value; the last bound is +Inf


def observe_all(histogram: Histogram, values: list[float]) -> None:
    """``histogram.observe(v)`` for each of ``values``: one increment per bucket hit and one of the sum (a
    batch's label delays), through the internals :func:`observe_many` uses.

    >>> from prometheus_client import CollectorRegistry
    >>> h = Histogram("delay_seconds", "", buckets=(1, 10), registry=CollectorRegistry())
    >>> observe_all(h, [0.5, 1.0, 3.0, 30.0])
    >>> [(s.labels["le"], s.value) for s in h.collect()[0].samples if s.name.endswith("_bucket")]
    [('1.0', 2.0), ('10.0', 3.0), ('+Inf', 4.0)]
    """
    if not values:
        return
    try:
        bounds, buckets, total = histogram._upper_bounds, histogram._buckets, histogram._sum  # noqa: SLF001 — as observe_many
    except AttributeError:  # pragma: no cover - another prometheus-client layout
        for value in values:
            histogram.observe(value)
        return
    total.inc(sum(values))
    for index, count in collections.Counter(map(partial(bisect_left, bounds), values)).items():
        buckets[index].inc(count)


#: What state read back can be (perceptron_rejected_state_total's ``kind``) and why it can be refused (``reason``).
STATE_KINDS = ("checkpoint", "mix", "changelog", "model_file")
STATE_REASONS = ("damaged", "foreign", "settings", "key", "non_finite", "too_large", "implausible", "replayed", "stale")


class ServiceMetrics:
    """The service's metrics, named by Prometheus conventions (``perceptron_`` prefix, base units)."""

    def __init__(
        self, *, window: int, version: str, variant: str, scope: str = "group", challengers: Sequence[str] = ()
    ):
        self.registry = registry = CollectorRegistry()
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            collector(registry=registry)
        self.events = Counter(
            "perceptron_events",
            "Valid events (points) processed, each once, by whether it came with its label "
            '(a delayed label joined later counts in perceptron_labels_total{outcome="joined"}, not here).',
            ["kind"],
            registry=registry,
        )
        self.labeled, self.unlabeled = self.events.labels("labeled"), self.events.labels("unlabeled")
        self.mistakes = Counter(
            "perceptron_mistakes",
            "Published decisions that were wrong (y·score ≤ 0), scored when their label was known: labeled events "
            "and joined delayed labels.",
            registry=registry,
        )
        self.updates = Counter("perceptron_updates", "Weight updates made by the perceptron.", registry=registry)
        self.dropped_features = Counter(
            "perceptron_dropped_features",
            "New features of labeled events left out of learning because the model held --max-model-features features.",
            registry=registry,
        )
        self.unknown_features = Counter(
            "perceptron_events_without_known_features",
            "Valid events that shared no feature with a model holding some, so scored by its bias alone: a model trained "
            "on named features served dense x, or the reverse, or producers sending other names (the log says which, once).",
            registry=registry,
        )
        self.rejected = Counter(
            "perceptron_rejected_events",
            "Events sent to the dead-letter topic, by reason.",
            ["reason"],
            registry=registry,
        )
        for reason in REASONS:  # every series exists from the start, so rate() and dashboards see zeros, not gaps
            self.rejected.labels(reason)
        self.mistake_rate = Gauge(
            "perceptron_mistake_rate",
            "Share of mistakes among the last N decisions scored (labeled events and joined delayed labels).",
            registry=registry,
        )
        Gauge(
            "perceptron_mistake_rate_window_events",
            "N, the decisions scored in the mistake-rate window (labeled events and joined delayed labels).",
            registry=registry,
        ).set(window)
        self.latency = Histogram(
            "perceptron_processing_latency_seconds",
            "Seconds from polling an event to the broker's acknowledgement of its output.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.lag = Gauge(
            "perceptron_consumer_lag",
            "Messages between the service's position and the end of each input partition.",
            ["topic", "partition"],
            registry=registry,
        )
        # per replica in partition scope (a partition label), one model's in group scope (no label, as before)
        self.replica_labels = ["partition"] if scope == "partition" else []
        self.weight_norm = Gauge(
            "perceptron_weight_norm",
            "Euclidean norm of the predicting weights, bias included.",
            self.replica_labels,
            registry=registry,
        )
        self.radius = Gauge(
            "perceptron_data_radius",
            "R: the largest ‖x‖ seen, the constant 1 included.",
            self.replica_labels,
            registry=registry,
        )
        self.labels = Counter(
            "perceptron_labels",
            "Delayed labels by outcome (joined, unknown_id, duplicate; early: came "
            "before their point and waited for it, then counted again as joined or unknown_id), and "
            "pending points dropped unlabeled (expired, evicted).",
            ["outcome"],
            registry=registry,
        )
        for outcome in ("joined", "unknown_id", "duplicate", "early", "expired", "evicted"):
            self.labels.labels(outcome)
        self.pending = Gauge(
            "perceptron_pending_labels", "Points predicted and published, waiting for their label.", registry=registry
        )
        self.early = Gauge(
            "perceptron_early_labels",
            "Labels that came before their point, waiting for it (at most --label-grace-seconds of stream time).",
            registry=registry,
        )
        self.label_delay = Histogram(
            "perceptron_label_delay_seconds",
            "Seconds from a point to its label, per joined label.",
            buckets=LABEL_DELAY_BUCKETS,
            registry=registry,
        )
        self.challenger_mistakes = Counter(
            "perceptron_challenger_mistakes",
            "Mistakes a challenger variant made on the champion's decisions scored (never published).",
            ["challenger"],
            registry=registry,
        )
        self.challenger_rate = Gauge(
            "perceptron_challenger_mistake_rate",
            "A challenger's share of mistakes among the last N decisions scored, beside perceptron_mistake_rate.",
            ["challenger"],
            registry=registry,
        )
        self.challenger_windows = {name: SlidingRate(window) for name in challengers}
        for name in challengers:  # the series exist from the start: the dashboard compares them with the champion
            self.challenger_mistakes.labels(name)
            self.challenger_rate.labels(name)
        self.drifts = Counter(
            "perceptron_drift_detected",
            "Drift episodes river's DDM opened in the champion's mistake stream "
            "(one change, one count: detections while the model relearns are the same drift).",
            registry=registry,
        )
        self.last_drift = Gauge(
            "perceptron_last_drift_timestamp_seconds",
            "Unix time the last drift episode began (0: none).",
            registry=registry,
        )
        self.mixes = Counter(
            "perceptron_mixes",
            "Mixes of a replica's weights with the other partitions' (--mix-every).",
            ["partition"],
            registry=registry,
        )
        self.mix_rejected = Counter(
            "perceptron_mix_records_rejected",
            "Records of the mix topic not mixed in, by reason.",
            ["reason"],
            registry=registry,
        )
        for reason in (
            "damaged",
            "foreign",
            "settings",
            "key",
            "refused",
        ):  # zeros from the start, as for rejected events
            self.mix_rejected.labels(reason)
        self.rejected_state = Counter(
            "perceptron_rejected_state",
            "State read back and refused before it reached the model, by what it was (checkpoint, mix, changelog, "
            "model_file) and why (damaged, foreign, settings, key, non_finite, too_large, implausible, replayed, "
            "stale): a record that does not check out is never learned from.",
            ["kind", "reason"],
            registry=registry,
        )
        for kind in STATE_KINDS:  # zeros from the start, as for rejected events
            for reason in STATE_REASONS:
                self.rejected_state.labels(kind, reason)
        self.turns = Histogram(
            "perceptron_poll_loop_turn_seconds",
            "Time of the poll loop's turns, after the poll's wait, by what each did (its costliest part by rule): "
            "batch, labels (joined or released), mix, commit, checkpoint (with its commit), transaction (its "
            "commit, exactly-once), probe (the lag asked of the brokers). Where a tail of latency comes from.",
            ["did"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        for did in TURN_KINDS:  # zeros from the start, as for rejected events
            self.turns.labels(did)
        self.flushes = Histogram(
            "perceptron_poll_loop_flush_seconds",
            "Time each batch waited for the brokers to acknowledge its outputs (part of its turn): the rest of a "
            "batch turn is the service's own work.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.history_records = Counter(
            "perceptron_history_records",
            "Records written to the model history (--model-history-topic): full states and changes.",
            registry=registry,
        )
        self.history_bytes = Counter(
            "perceptron_history_bytes",
            "Bytes (keys and values) written to the model history (--model-history-topic).",
            registry=registry,
        )
        self.last_checkpoint = Gauge(
            "perceptron_last_checkpoint_timestamp_seconds",
            "Unix time of the last checkpoint written or restored.",
            registry=registry,
        )
        # --processing-guarantee exactly-once: every transaction ended, and how long its commit took
        self.transactions = Counter(
            "perceptron_transactions",
            "Kafka transactions ended (--processing-guarantee exactly-once), "
            "by result: committed, or aborted (nothing of it visible).",
            ["result"],
            registry=registry,
        )
        for result in ("committed", "aborted"):
            self.transactions.labels(result)
        self.transaction_commit = Histogram(
            "perceptron_transaction_commit_seconds",
            "Seconds a transaction's commit took: its checkpoints sent, outputs flushed, positions and commit acknowledged.",
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        # Liveness for alerts: /healthz tells a probe, this tells Prometheus. Computed
        # at scrape time from the Health the loop beats, so a loop hung inside a
        # call still shows its last turn (NaN until a Health is tracked).
        self._health = None  # the runtime's Health (perceptron_stream.runtime.health), tracked by the HTTP endpoints
        self.poll_loop_last_turn = Gauge(
            "perceptron_poll_loop_last_turn_timestamp_seconds",
            "Unix time at which the poll loop last turned (or waited, alive, for the brokers).",
            registry=registry,
        )
        self.poll_loop_last_turn.set_function(self._last_turn_unix)
        self.assigned_partitions = Gauge(
            "perceptron_assigned_partitions",
            "Input partitions assigned to this instance by its consumer group.",
            registry=registry,
        )
        Info("perceptron_build", "Version and model variant of the running service.", registry=registry).info(
            {"version": version, "variant": variant}
        )
        self.window = SlidingRate(window)

    def reject_state(self, kind: str, reason: str) -> None:
        """State of ``kind`` read back and refused for ``reason``; a mix record counts in its own metric too."""
        self.rejected_state.labels(kind, reason).inc()
        if kind == "mix":
            self.mix_rejected.labels(reason).inc()

    def observe_turn(self, did: str, seconds: float) -> None:
        """A turn of the poll loop and what it did (:func:`perceptron_stream.runtime.loop.turn_did`)."""
        self.turns.labels(did).observe(seconds)

    def observe_flush(self, seconds: float) -> None:
        """A batch's wait for its outputs' acknowledgements."""
        self.flushes.observe(seconds)

    def observe_tally(self, tally, latency_s: float) -> None:
        """Count what one batch did (a :class:`~perceptron_stream.pipeline.task.Tally`)."""
        self.observe_batch(
            labeled=tally.labeled,
            unlabeled=tally.unlabeled,
            mistake_flags=tally.flags,
            updates=tally.updates,
            latency_s=latency_s,
            dropped_features=tally.dropped,
        )
        for reason, count in collections.Counter(tally.rejected).items():
            self.rejected.labels(reason).inc(count)
        for partition, count in collections.Counter(tally.mixes).items():
            self.mixes.labels(str(partition)).inc(count)
        for outcome, count in collections.Counter(tally.label_outcomes).items():
            self.labels.labels(outcome).inc(count)
        for name, flags in tally.challenger_flags.items():
            self.challenger_mistakes.labels(name).inc(sum(flags))
            window = self.challenger_windows.setdefault(name, SlidingRate(self.window.window))
            window.add_many(flags)
            self.challenger_rate.labels(name).set(window.value)
        if tally.unknown:
            self.unknown_features.inc(tally.unknown)
        if tally.history_records:
            self.history_records.inc(tally.history_records)
            self.history_bytes.inc(tally.history_bytes)
        if tally.drifts:
            self.drifts.inc(tally.drifts)
            self.last_drift.set(time.time())
        observe_all(self.label_delay, tally.delays)

    def observe_batch(
        self,
        *,
        labeled: int,
        unlabeled: int,
        mistake_flags: list[bool],
        updates: int,
        latency_s: float,
        dropped_features: int = 0,
    ) -> None:
        """Count one processed batch: its events (points, each once: ``labeled`` came with their label), and its
        decisions scored (``mistake_flags`` in order, one per labeled event or joined delayed label)."""
        self.labeled.inc(labeled)
        self.unlabeled.inc(unlabeled)
        self.mistakes.inc(sum(mistake_flags))
        self.updates.inc(updates)
        if dropped_features:
            self.dropped_features.inc(dropped_features)
        self.window.add_many(mistake_flags)
        self.mistake_rate.set(self.window.value)
        # Every event of a batch waits for the same acknowledgement, so one
        # value stands for all of them (events: a joined label is none).
        observe_many(self.latency, latency_s, labeled + unlabeled)

    def track_poll_loop(self, health) -> None:
        """Report ``health``'s last beat as perceptron_poll_loop_last_turn_timestamp_seconds (HttpEndpoints calls this)."""
        self._health = health

    def _last_turn_unix(self) -> float:
        health = self._health
        if health is None:
            return math.nan
        return time.time() - (time.monotonic() - health.last_beat)

    def set_assigned(self, partitions: int) -> None:
        """The number of input partitions the group gave this instance: call on every assignment and revocation."""
        self.assigned_partitions.set(partitions)

    def set_model(self, weight_norm: float, radius: float, partition: int | None = None) -> None:
        """A model's weight norm and R: the group's model, or (partition scope) ``partition``'s replica."""
        if self.replica_labels:
            self.weight_norm.labels(str(partition)).set(weight_norm)
            self.radius.labels(str(partition)).set(radius)
        else:
            self.weight_norm.set(weight_norm)
            self.radius.set(radius)

    def forget_replica(self, partition: int) -> None:
        """A revoked partition's replica gauges go (its next owner reports them)."""
        for gauge in (self.weight_norm, self.radius):
            try:
                gauge.remove(str(partition))
            except KeyError:
                pass

    def set_lag(self, lags: dict[tuple[str, int], int]) -> None:
        for (topic, partition), lag in lags.items():
            self.lag.labels(topic, str(partition)).set(lag)

    def forget_partitions(self, partitions) -> None:
        for topic, partition in partitions:
            try:
                self.lag.remove(topic, str(partition))
            except KeyError:
                pass
