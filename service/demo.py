"""``perceptron-stream demo``: the whole product on one machine, no Docker.

Starts the embedded broker (a child process), the service and a producer of
the credit-approval stream (threads of this process), and shows a live view:
events/s, mistakes, the mistake rate and its trend, and the weights by
feature, the challengers' mistake rates beside the champion's, and what
river's DDM says of drift. The stream has label noise and a change of the
bank's policy partway through, so the mistake rate climbs and then recovers.
With ``--delayed-labels`` the producer sends each application now and its
outcome a few seconds later on a label topic of its own (some never), the
service joins them, and the view shows the pending points, the joined and
unknown labels and the labels' delay. Ctrl-C (or ``--duration``) stops
everything; the broker goes with it.
"""

from __future__ import annotations

import logging
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import deque

from perceptron_stream.app import Application, StartupError
from perceptron_stream.broker import EmbeddedBroker, PortInUse
from perceptron_stream.config import DemoSettings, ProduceSettings, ServeSettings, load
from perceptron_stream.produce import ProduceError, produce
from perceptron_stream.state.checkpoint import CheckpointError
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

SPARK = "▁▂▃▄▅▆▇█"
#: The variants the demo compares: the champion is ``--variant``, the others of these run as challengers.
VARIANTS = ("averaged", "plain", "pocket")
#: ``--delayed-labels``: the label topic, how long after its point a label is sent, and the share never sent.
LABEL_TOPIC = "labels"
LABEL_DELAY_S = 3.0
LABEL_MISSING = 0.05
#: A point whose label never comes expires after this long (counted as expired) instead of the service's 7 days,
#: so the pending count stays what is really still to come.
LABEL_TTL_S = 30.0
#: The view's events/s is the rate over the last this many seconds (an average since the start would hide what
#: the service does now: it fell from 992 to 535 while the producer ran at 500/s, as the catch-up at the start
#: weighed less and less).
RATE_WINDOW_S = 5.0
#: What the view says of the outputs' guarantee: the demo's, and where the other one runs.
OUTPUTS = "at least once here; exactly once with serve --processing-guarantee exactly-once on Apache Kafka"


def challengers(variant: str) -> list[str]:
    """The demo's challengers: the variants of :data:`VARIANTS` the champion is not.

    >>> challengers("averaged"), challengers("pocket")
    (['plain', 'pocket'], ['averaged', 'plain'])
    """
    return [v for v in VARIANTS if v != variant]


def ago(seconds: float) -> str:
    """A duration as the view says it.

    >>> ago(4.2), ago(75), ago(3 * 3600 + 60)
    ('4 s', '1 min 15 s', '3 h 1 min')
    """
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"


def _sample(metric, name: str, **labels: str) -> float:
    """The value /metrics shows for ``name`` with exactly ``labels`` (0 when absent), read from one metric."""
    for family in metric.collect():
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return 0.0


def sparkline(values: list[float], top: float = 0.5) -> str:
    """Mistake rates as bars, 0 → ▁, ``top`` or more → █.

    >>> sparkline([0.0, 0.1, 0.25, 0.5, 0.9])
    '▁▂▅██'
    """
    return "".join(SPARK[min(len(SPARK) - 1, int(v / top * (len(SPARK) - 1) + 0.5))] for v in values)


class DemoView:
    """What the terminal shows, computed from the running Application."""

    def __init__(
        self,
        app: Application,
        bootstrap: str,
        metrics_url: str,
        drift_at: int,
        *,
        champion: str = "champion",
        label_delay: float | None = None,
        label_missing: float = LABEL_MISSING,
        label_ttl: float = LABEL_TTL_S,
    ):
        """``champion``: its variant's name; ``label_delay``: the seconds after its point a label is sent (None: labels
        inline, in each event), ``label_missing`` the share of labels never sent, ``label_ttl`` how long a point
        waits for its label before it expires."""
        self.app, self.bootstrap, self.metrics_url, self.drift_at = app, bootstrap, metrics_url, drift_at
        self.champion, self.label_delay = champion, label_delay
        self.label_missing, self.label_ttl = label_missing, label_ttl
        self.samples: deque[tuple[float, int]] = deque()  # (time, events seen): the last RATE_WINDOW_S and one before
        self.rates: deque[float] = deque(maxlen=40)  # one mistake-rate sample a second
        self._next_rate_at = 0.0

    def sample(self) -> dict:
        learner = self.app.learner
        now = time.monotonic()
        self.samples.append((now, learner.seen))
        while len(self.samples) > 2 and self.samples[1][0] <= now - RATE_WINDOW_S:
            self.samples.popleft()  # the oldest left is the last one at least RATE_WINDOW_S old
        (t0, n0), (t1, n1) = self.samples[0], self.samples[-1]
        rate = self.app.metrics.window.value
        if now >= self._next_rate_at:
            self.rates.append(rate)
            self._next_rate_at = now + 1.0
        m = self.app.metrics
        last_drift = _sample(m.last_drift, "perceptron_last_drift_timestamp_seconds")
        s = {
            "seen": learner.seen,
            "events_per_s": (n1 - n0) / (t1 - t0) if t1 > t0 else 0.0,
            "mistakes": learner.mistakes,
            "updates": learner.updates,
            "rate": rate,
            "weights": dict(learner.weights),
            "bias": learner.bias,
            "challengers": {name: window.value for name, window in list(m.challenger_windows.items())},
            "drifts": int(_sample(m.drifts, "perceptron_drift_detected_total")),
            "drift_ago": time.time() - last_drift if last_drift else None,
        }
        if self.label_delay is not None:
            count = _sample(m.label_delay, "perceptron_label_delay_seconds_count")
            s.update(
                {
                    outcome: int(_sample(m.labels, "perceptron_labels_total", outcome=outcome))
                    for outcome in ("joined", "unknown_id", "expired")
                }
            )
            s["pending"] = int(_sample(m.pending, "perceptron_pending_labels"))
            s["delay"] = _sample(m.label_delay, "perceptron_label_delay_seconds_sum") / count if count else None
        return s

    def render(self) -> Panel:
        s = self.sample()
        stats = Table.grid(padding=(0, 2))
        stats.add_row("events", f"{s['seen']:,}", f"events/s (last {RATE_WINDOW_S:g} s)", f"{s['events_per_s']:,.0f}")
        stats.add_row("mistakes", f"{s['mistakes']:,}", "updates (model version)", f"{s['updates']:,}")
        no_label_yet = self.label_delay is not None and not s["joined"]
        stats.add_row(
            "mistake rate",
            "no label yet" if no_label_yet else f"{s['rate']:.1%} (last {self.app.metrics.window.window} labeled)",
            "trend (40 s)",
            sparkline(list(self.rates)),
        )
        phase = "before" if s["seen"] < self.drift_at else "after"
        stats.add_row("bank policy", f"changes at event {self.drift_at:,} ({phase})", "", "")
        for name, rate in s["challengers"].items():
            mine, champion = ("no label yet", "-") if no_label_yet else (f"{rate:.1%} mistake rate", f"{s['rate']:.1%}")
            stats.add_row(f"challenger {name}", mine, f"champion {self.champion}", champion)
        drift = (
            "none detected"
            if not s["drifts"]
            else (
                f"{s['drifts']:,} detected, the last {ago(s['drift_ago'])} ago"
                if s["drift_ago"] is not None
                else f"{s['drifts']:,} detected"
            )
        )
        stats.add_row("drift (DDM)", drift, "", "")
        if self.label_delay is not None:
            stats.add_row(
                "labels pending", f"{s['pending']:,}", "joined / unknown_id", f"{s['joined']:,} / {s['unknown_id']:,}"
            )
            delay = "none joined yet" if s["delay"] is None else f"{s['delay']:.1f} s on average"
            stats.add_row(
                "label delay",
                f"{delay} (sent {self.label_delay:g} s after)",
                "expired (never came)",
                f"{s['expired']:,}",
            )
        weights = Table("feature", "weight", box=None, padding=(0, 2))
        for name, w in sorted(s["weights"].items(), key=lambda kv: str(kv[0])):
            weights.add_row(str(name), f"{w:+.3f}")
        weights.add_row("(bias)", f"{s['bias']:+.3f}")
        footer = (
            f"metrics: {self.metrics_url}/metrics   broker: {self.bootstrap}   Ctrl-C stops\n"
            # the embedded broker cannot hold exactly-once (its read_committed readers see aborted records)
            f"outputs: {OUTPUTS}"
        )
        notes: list[RenderableType] = (
            [Text("\n".join(self.label_notes()), style="dim"), ""] if self.label_delay is not None else []
        )
        return Panel(Group(stats, "", *notes, weights, "", footer), title="perceptron-stream demo: credit approval")

    def label_notes(self) -> list[str]:
        """What the delayed-label numbers mean, on the screen: without it a mistake rate near 50% at the start and a
        pending count that only grows, with nothing expired, look like faults."""
        return [
            f"A label comes {self.label_delay:g} s after its point: the mistake rate counts a decision when its label "
            "comes,",
            "and the first decisions were made before any label had come (so it starts near 50%).",
            f"{self.label_missing:.0%} of the labels never come: their points stay pending until they expire after "
            f"{self.label_ttl:g} s.",
        ]

    def legend(self) -> str:
        """What the plain lines' numbers are (printed once, before them)."""
        text = (
            f"events/s: over the last {RATE_WINDOW_S:g} s; mistake_rate: over the last "
            f"{self.app.metrics.window.window} labeled events"
        )
        if self.label_delay is not None:
            text += "; " + " ".join(self.label_notes())
        return text

    def line(self) -> str:
        s = self.sample()
        rate_unknown = self.label_delay is not None and not s["joined"]  # no label has come yet
        rate = "-" if rate_unknown else f"{s['rate']:.3f}"
        line = (
            f"events={s['seen']} events/s={s['events_per_s']:.0f} mistakes={s['mistakes']} "
            f"mistake_rate={rate} updates={s['updates']}"
        )
        line += "".join(
            f" {name}_mistake_rate={'-' if rate_unknown else format(rate, '.3f')}"
            for name, rate in s["challengers"].items()
        )
        line += f" drifts={s['drifts']}"
        if s["drift_ago"] is not None:
            line += f" last_drift_s_ago={s['drift_ago']:.0f}"
        if self.label_delay is not None:
            line += (
                f" pending={s['pending']} joined={s['joined']} unknown_id={s['unknown_id']} expired={s['expired']}"
                f" label_delay_s={'-' if s['delay'] is None else format(s['delay'], '.1f')}"
            )
        return line


def describe_failure(exc: BaseException) -> str:
    """What went wrong with the demo's service, in a sentence that says what to do (a port in use is a StartupError
    naming --metrics-port: service/http.py's)."""
    if _expected(exc):
        return str(exc)
    return f"{type(exc).__name__}: {exc} (traceback above)"


def _expected(exc: BaseException) -> bool:
    """A failure the message explains in full: no traceback needed."""
    return isinstance(exc, (StartupError, CheckpointError))


class _ServiceThread(threading.Thread):
    """The Application in a thread that keeps what it died of."""

    def __init__(self, app: Application):
        super().__init__(name="service", daemon=True)
        self.app = app
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.app.run(install_signal_handlers=False)
        except BaseException as exc:  # reported by run_demo, which then exits 1
            self.error = exc


def _produce(settings: ProduceSettings, should_stop) -> None:
    """The demo's producer thread: a failure is one line, not a thread's traceback."""
    try:
        produce(settings, should_stop)
    except ProduceError as exc:
        print(f"perceptron-stream demo: the producer stopped: {exc}", file=sys.stderr, flush=True)


def run_demo(settings: DemoSettings) -> int:
    """Run the demo until Ctrl-C or ``--duration``; 1 when the service fails (the message says why), else 0."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    console = Console()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    drift_at = max(1000, int(settings.rate * 20))
    failure: str | None = None
    try:
        embedded = EmbeddedBroker(port=settings.broker_port).start()
    except PortInUse as exc:
        print(f"perceptron-stream demo: --broker-port {settings.broker_port}: {exc}", file=sys.stderr)
        return 2
    with (
        embedded as broker,
        tempfile.TemporaryDirectory(prefix="perceptron-demo-") as state,
    ):
        assert broker.process is not None  # the context manager started it
        console.print(f"embedded broker on {broker.bootstrap_servers} (pid {broker.process.pid})")
        base = ["--bootstrap-servers", broker.bootstrap_servers]
        delayed = settings.delayed_labels
        serve = load(
            ServeSettings,
            [
                *base,
                "--metrics-port",
                str(settings.metrics_port),
                "--state-dir",
                state,
                "--variant",
                settings.variant,
                "--standardize" if settings.standardize else "--no-standardize",
                "--checkpoint-interval-seconds",
                "5",
                "--challengers",
                ",".join(challengers(settings.variant)),
                *(["--label-topic", LABEL_TOPIC, "--label-ttl-seconds", str(LABEL_TTL_S)] if delayed else []),
            ],
        )
        app = Application(serve)
        producer_settings = load(
            ProduceSettings,
            [
                *base,
                "--stream",
                "credit",
                "--count",
                "0",
                "--rate",
                str(settings.rate),
                "--noise",
                str(settings.noise),
                "--drift-every",
                str(drift_at),
                "--no-progress",
                *(
                    [
                        "--label-topic",
                        LABEL_TOPIC,
                        "--label-delay-seconds",
                        str(LABEL_DELAY_S),
                        "--label-missing",
                        str(LABEL_MISSING),
                    ]
                    if delayed
                    else []
                ),
            ],
        )
        service = _ServiceThread(app)
        service.start()
        while app.http is None and service.is_alive():
            time.sleep(0.05)
        producer = threading.Thread(
            target=_produce, args=(producer_settings, stop.is_set), name="producer", daemon=True
        )
        view = None
        try:
            if app.http is not None and service.is_alive():  # (the service is up once http is)
                metrics_url = f"http://{serve.metrics_host}:{app.http.port}"
                console.print(f"metrics on {metrics_url}/metrics", highlight=False)
                producer.start()
                view = DemoView(
                    app,
                    broker.bootstrap_servers,
                    metrics_url,
                    drift_at,
                    champion=settings.variant,
                    label_delay=LABEL_DELAY_S if delayed else None,
                )
                deadline = time.monotonic() + settings.duration if settings.duration else float("inf")
                if settings.live:
                    with Live(view.render(), console=console, refresh_per_second=4, screen=True) as live:
                        while not stop.wait(0.25) and time.monotonic() < deadline and service.is_alive():
                            live.update(view.render())
                else:
                    print(view.legend(), flush=True)
                    while not stop.wait(2.0) and time.monotonic() < deadline and service.is_alive():
                        print(view.line(), flush=True)
            died = not service.is_alive()  # before it was asked to stop
        finally:
            stop.set()
            if producer.is_alive():
                producer.join(15)
            app.stop()
            service.join(30)
        if service.error is not None:
            if not _expected(service.error):
                traceback.print_exception(service.error)
            failure = describe_failure(service.error)
        elif died:
            failure = "the service stopped by itself (see the log above)"
        elif service.is_alive():
            failure = "the service did not stop within 30 s"
        if view is not None:
            console.print(view.line(), highlight=False, soft_wrap=True)  # one line, as the lines before it
    # the broker (a child process) and the producer are down here, whatever happened
    if failure is not None:
        print(
            f"perceptron-stream demo: the service failed: {failure} (the broker and the producer are stopped)",
            file=sys.stderr,
            flush=True,
        )
        return 1
    console.print("stopped: broker, producer and service are down")
    return 0
