"""The demo's live view (rich), rendered to a recording console with a real learner and metrics."""

import re
from types import SimpleNamespace

import perceptron_stream.demo as demo
import pytest
from perceptron_stream.demo import DemoView, sparkline
from perceptron_stream.learning import make_learner
from perceptron_stream.metrics import ServiceMetrics
from rich.console import Console


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def _render(view: DemoView) -> str:
    console = Console(record=True, width=120, color_system=None)
    console.print(view.render())
    return console.export_text()


@pytest.fixture
def app():
    learner = make_learner("plain", 0.0, False)
    metrics = ServiceMetrics(window=10, version="test", variant="plain")
    return SimpleNamespace(learner=learner, metrics=metrics)


def _learn(app, events):
    flags = []
    for features, y in events:
        _y_pred, _score, mistake = app.learner.step(features, y)
        flags.append(mistake)
    app.metrics.observe_batch(labeled=len(flags), unlabeled=0, mistake_flags=flags, updates=0, latency_s=0.001)
    return flags


def test_the_view_shows_rate_mistakes_trend_and_weights_by_name(app, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(demo.time, "monotonic", clock)
    view = DemoView(app, "127.0.0.1:9092", "http://127.0.0.1:8000", drift_at=5000)

    first = _render(view)  # nothing seen yet, at t = 1000 s
    assert "events/s" in first and "0" in first

    # 40 events in 2 s: 20 events/s. The label is the sign of the salary, so the
    # perceptron soon gets them right, except two flipped labels among the last ten.
    events = [({"age": 0.5, "salary": 1.0 if i % 2 == 0 else -1.0}, 1 if i % 2 == 0 else -1) for i in range(40)]
    for i in (33, 36):
        features, y = events[i]
        events[i] = (features, -y)
    flags = _learn(app, events)
    clock.now += 2.0
    text = _render(view)

    learner = app.learner
    rate = app.metrics.window.value  # the last 10 labeled events
    assert learner.seen == 40 and 0 < learner.mistakes == sum(flags) < 40
    assert 0 < rate < 1
    lines = text.splitlines()

    def row(label: str) -> str:
        return next(line for line in lines if label in line)

    assert re.search(r"events\s+40\s+events/s \(last 5 s\)\s+20\s", row("events/s")), row("events/s")
    assert re.search(
        rf"mistakes\s+{learner.mistakes}\s+updates \(model version\)\s+{learner.updates}\s", row("mistakes")
    ), row("mistakes")
    assert re.search(rf"mistake rate\s+{re.escape(f'{rate:.1%}')} \(last 10 labeled\)", row("mistake rate")), row(
        "mistake rate"
    )
    assert sparkline([0.0, rate]) in row("trend")  # one sample a second: the first at 0, then the rate now
    for name, weight in learner.weights.items():
        assert re.search(rf"\b{name}\s+{re.escape(f'{weight:+.3f}')}\s", row(name)), (name, weight, row(name))
    assert set(learner.weights) == {"age", "salary"} and any(w != 0 for w in learner.weights.values())
    assert f"{learner.bias:+.3f}" in row("(bias)")
    assert "changes at event 5,000 (before)" in text
    assert "outputs: at least once here; exactly once with serve --processing-guarantee exactly-once" in row("outputs")
    assert "http://127.0.0.1:8000/metrics" in text and "127.0.0.1:9092" in text


def test_the_plain_line_says_the_same(app, monkeypatch):
    clock = Clock()
    monkeypatch.setattr(demo.time, "monotonic", clock)
    view = DemoView(app, "b:1", "http://m:1", drift_at=10)
    view.line()
    _learn(app, [({"a": 1.0}, 1), ({"a": 1.0}, -1), ({"a": -1.0}, 1), ({"a": 2.0}, 1)])
    clock.now += 1.0
    line = view.line()
    assert f"events=4 events/s=4 mistakes={app.learner.mistakes} mistake_rate={app.metrics.window.value:.3f}" in line


def test_events_per_second_is_the_rate_of_the_last_seconds_not_since_the_start(app, monkeypatch):
    """A catch-up at the start (1,000 events in its first second) then 500 events/s: the view shows 500, where an
    average since the start would still show 545 after 11 s."""
    clock = Clock()
    monkeypatch.setattr(demo.time, "monotonic", clock)
    view = DemoView(app, "b:1", "http://m:1", drift_at=10**6)
    assert "events/s: over the last 5 s" in view.legend()
    view.line()
    _learn(app, [({"a": 1.0}, 1)] * 1000)
    clock.now += 1.0
    assert "events/s=1000 " in view.line()
    for _ in range(5):  # every 2 s, as the demo's --no-live lines
        _learn(app, [({"a": 1.0}, 1)] * 1000)
        clock.now += 2.0
        line = view.line()
    assert app.learner.seen == 6000
    assert "events/s=500 " in line, line
    assert re.search(r"events/s \(last 5 s\)\s+500\s", _render(view)), _render(view)


def _tally(**fields):
    from perceptron_stream.pipeline.task import Tally

    tally = Tally()
    for name, value in fields.items():
        setattr(tally, name, value)
    return tally


def _challenged_app(flags):
    """The demo's champion (averaged) with its two challengers, after ``flags``' labeled events."""
    learner = make_learner("averaged", 0.0, False)
    metrics = ServiceMetrics(window=10, version="test", variant="averaged", challengers=["plain", "pocket"])
    metrics.observe_tally(
        _tally(
            labeled=len(flags["champion"]),
            flags=flags["champion"],
            challenger_flags={"plain": flags["plain"], "pocket": flags["pocket"]},
        ),
        0.001,
    )
    return SimpleNamespace(learner=learner, metrics=metrics)


FLAGS = {"champion": [True] + [False] * 9, "plain": [True] * 3 + [False] * 7, "pocket": [True] * 2 + [False] * 8}


def test_each_challenger_has_a_line_beside_the_champion_and_drift_has_one(monkeypatch):
    from perceptron_stream.demo import challengers

    assert challengers("averaged") == ["plain", "pocket"] and challengers("plain") == ["averaged", "pocket"]
    monkeypatch.setattr(demo.time, "monotonic", Clock())
    app = _challenged_app(FLAGS)
    view = DemoView(app, "b:1", "http://m:1", drift_at=5000, champion="averaged")
    lines = _render(view).splitlines()

    def row(label: str) -> str:
        return next(line for line in lines if label in line)

    assert re.search(r"challenger plain\s+30\.0% mistake rate\s+champion averaged\s+10\.0%", row("challenger plain")), (
        row("challenger plain")
    )
    assert re.search(
        r"challenger pocket\s+20\.0% mistake rate\s+champion averaged\s+10\.0%", row("challenger pocket")
    ), row("challenger pocket")
    assert re.search(r"drift \(DDM\)\s+none detected", row("drift")), row("drift")
    assert not any(
        "pending" in line or "label delay" in line for line in lines
    )  # labels inline: no delayed-label lines

    wall = Clock(1_700_000_000.0)
    monkeypatch.setattr(demo.time, "time", wall)
    app.metrics.observe_tally(_tally(drifts=2), 0.001)  # stamps the last drift with time.time(), the clock above
    wall.now += 75
    assert re.search(r"drift \(DDM\)\s+2 detected, the last 1 min 15 s ago", _render(view)), _render(view)
    line = view.line()
    assert "plain_mistake_rate=0.300 pocket_mistake_rate=0.200 drifts=2 last_drift_s_ago=75" in line, line
    assert "pending=" not in line


def test_delayed_labels_show_pending_joined_unknown_and_the_delay(monkeypatch):
    monkeypatch.setattr(demo.time, "monotonic", Clock())
    app = _challenged_app(FLAGS)
    view = DemoView(app, "b:1", "http://m:1", drift_at=5000, champion="averaged", label_delay=3.0)
    before = _render(view)
    assert re.search(r"labels pending\s+0\s+joined / unknown_id\s+0 / 0", before), before
    assert "none joined yet (sent 3 s after)" in before
    # no label has come: no mistake rate to show, and the screen says why the numbers look as they will
    assert re.search(r"mistake rate\s+no label yet\s", before), before
    assert "mistake_rate=- " in view.line() and "plain_mistake_rate=- pocket_mistake_rate=- " in view.line()
    assert re.search(r"challenger plain\s+no label yet\s+champion averaged\s+-", before), before
    for said in (
        "A label comes 3 s after its point: the mistake rate counts a decision when its label comes",
        "the first decisions were made before any label had come (so it starts near 50%)",
        "5% of the labels never come: their points stay pending until they expire after 30 s",
    ):
        assert said in before, (said, before)
        assert said in view.legend()

    m = app.metrics
    m.observe_tally(
        _tally(
            label_outcomes=["joined"] * 1200 + ["unknown_id"] * 2 + ["expired"] * 7, delays=[2.5] * 600 + [3.5] * 600
        ),
        0.001,
    )
    m.pending.set(1503)
    lines = _render(view).splitlines()

    def row(label: str) -> str:
        return next(line for line in lines if label in line)

    assert re.search(r"labels pending\s+1,503\s+joined / unknown_id\s+1,200 / 2\b", row("labels pending")), row(
        "labels pending"
    )
    assert re.search(
        r"label delay\s+3\.0 s on average \(sent 3 s after\)\s+expired \(never came\)\s+7\b", row("label delay")
    ), row("label delay")
    assert re.search(r"mistake rate\s+10\.0% \(last 10 labeled\)", row("mistake rate")), row("mistake rate")
    assert row("challenger plain") and row("drift (DDM)")  # the lines of both modes stay
    line = view.line()
    assert "pending=1503 joined=1200 unknown_id=2 expired=7 label_delay_s=3.0" in line, line
