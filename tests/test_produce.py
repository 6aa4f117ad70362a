"""`perceptron-stream produce`: the synthetic streams keep their promises, files replay as they are,
the rate and the progress bar behave, only acknowledged messages count, and with --label-topic
points go out now and their labels, keyed alike, later.

Statistical checks use a tolerance of Z binomial standard deviations (tests/support/statistics.py): with the
seeds fixed they are deterministic, and a change of generator fails them only
when it drifts from the promised rate (chance of a false alarm ~6e-5 each).
"""

import io
import itertools
import json
import math
import time

import perceptron_stream.kafka.kafka_python as kafka_python_module
import perceptron_stream.produce as produce_module
import pytest
from kafka.errors import KafkaConnectionError, KafkaTimeoutError, MessageSizeTooLargeError
from kafka.future import Future
from perceptron_stream.cli import main
from perceptron_stream.config import ProduceSettings, load
from perceptron_stream.produce import (
    LABEL,
    POINT,
    PairedSchedule,
    ProduceError,
    RateLimiter,
    messages,
    paired_messages,
    produce,
)
from perceptron_stream.streams import POLICIES, bank_score, credit, delayed_labels, separable, separator, synthetic
from rich.console import Console

from tests.support.statistics import within_binomial


def _take(events, n):
    return list(itertools.islice(events, n))


def _sign(v: float) -> int:
    return 1 if v > 0 else -1


def _distance(w, b, x):
    return sum(p * q for p, q in zip(w, x)) + b


# ---------------------------------------------------------------- synthetic streams


@pytest.mark.parametrize("dimensions, margin", [(1, 0.3), (2, 0.5), (10, 0.1), (10, 0.99), (300, 0.5)])
def test_separable_points_keep_the_promised_margin(dimensions, margin):
    """(300, 0.5) never ended before: w·x concentrates near 0 and rejection sampling waited for a miracle."""
    n = 2000 if dimensions < 100 else 200
    events = _take(separable(dimensions=dimensions, margin=margin, seed=11), n)
    w, b = separator(dimensions=dimensions, margin=margin, seed=11)(0)
    assert math.isclose(sum(a * a for a in w), 1.0)
    for event in events:
        assert len(event["x"]) == dimensions
        assert math.sqrt(sum(a * a for a in event["x"])) <= 1.0  # x as written, 6 decimals
        assert event["y"] * _distance(w, b, event["x"]) >= margin, event  # labels consistent, distance ≥ γ
    assert {e["y"] for e in events} == {-1, 1}
    assert [e["id"] for e in events[:2]] == ["p-0", "p-1"]


def test_a_margin_the_ball_cannot_hold_is_refused_not_looped_on():
    with pytest.raises(ValueError, match="margin"):
        next(separable(margin=1.2))
    event = next(separable(dimensions=2000, margin=0.99, seed=1))  # ends at once, even so far from the typical w·x
    w, b = separator(dimensions=2000, margin=0.99, seed=1)(0)
    assert event["y"] * _distance(w, b, event["x"]) >= 0.99


@pytest.mark.parametrize("noise", [0.05, 0.3])
def test_noisy_stream_flips_the_share_of_labels_asked_for(noise):
    n = 20_000
    events = _take(
        synthetic("noisy", dimensions=3, margin=0.05, noise=noise, drift_every=5000, seed=5, unlabeled=0.0), n
    )
    w, b = separator(dimensions=3, margin=0.05, seed=5)(0)
    flips = sum(e["y"] != _sign(_distance(w, b, e["x"])) for e in events)
    assert within_binomial(flips, n, noise), (flips, n * noise)
    assert all(abs(_distance(w, b, e["x"])) >= 0.05 for e in events)  # noise flips labels, it does not move points


def test_drift_stream_turns_the_separator_every_drift_every_events():
    drift = 1000
    events = _take(
        synthetic("drift", dimensions=5, margin=0.1, noise=0.0, drift_every=drift, seed=7, unlabeled=0.0), 3 * drift
    )
    truth = separator(dimensions=5, margin=0.1, seed=7, drift_every=drift)
    assert truth(drift - 1) == truth(0) and truth(drift) != truth(0) and truth(2 * drift) != truth(drift)
    w1, w2 = truth(0)[0], truth(drift)[0]
    assert abs(sum(a * b for a, b in zip(w1, w2))) < 1e-9  # a quarter turn
    for i, event in enumerate(events):
        w, b = truth(i)
        assert event["y"] * _distance(w, b, event["x"]) >= 0.1, i
    w0, b0 = truth(0)

    def accuracy(part):
        return sum(_sign(_distance(w0, b0, e["x"])) == e["y"] for e in part) / len(part)

    assert accuracy(events[:drift]) == 1.0
    assert accuracy(events[drift : 2 * drift]) < 0.7  # about a coin toss after a quarter turn
    assert accuracy(events[2 * drift :]) < 0.3  # half a turn: mostly wrong


def test_credit_stream_tells_the_story_of_the_seeds():
    drift = 2000
    events = _take(credit(noise=0.0, seed=3, drift_every=drift), 3 * drift)
    for event in events:
        f = event["features"]
        assert list(f) == ["age", "salary", "years_in_job", "debt"]
        assert isinstance(f["age"], int) and 18 <= f["age"] <= 75
        assert 5_000 <= f["salary"] <= 500_000 and 0 < f["debt"] <= 1_000_000
        assert 0 <= f["years_in_job"] <= f["age"] - 18
    for i, event in enumerate(events):  # the bank approves when its linear score is positive
        assert event["y"] == _sign(bank_score(event["features"], POLICIES[i >= drift])), i
    assert all(p["salary"] > 0 > p["debt"] for p in POLICIES)  # more salary helps, more debt hurts
    approved = [e["y"] == 1 for e in events]
    assert 0.2 < sum(approved) / len(approved) < 0.8
    rich_and_debt_free = [e["y"] for e in events if e["features"]["salary"] > 60_000 and e["features"]["debt"] < 8_000]
    poor_and_indebted = [e["y"] for e in events if e["features"]["salary"] < 35_000 and e["features"]["debt"] > 20_000]
    assert (
        rich_and_debt_free.count(1) / len(rich_and_debt_free)
        > 0.9
        > 0.1
        > poor_and_indebted.count(1) / len(poor_and_indebted)
    )
    old_policy_wrong = sum(_sign(bank_score(e["features"], POLICIES[0])) != e["y"] for e in events[drift:]) / (
        2 * drift
    )
    assert old_policy_wrong > 0.05  # the policy really changed at drift_every


def test_credit_noise_flips_the_share_of_labels_asked_for():
    n = 10_000
    events = _take(credit(noise=0.1, seed=4, drift_every=n), n)
    flips = sum(e["y"] != _sign(bank_score(e["features"], POLICIES[0])) for e in events)
    assert within_binomial(flips, n, 0.1), flips


@pytest.mark.parametrize("stream", ["separable", "noisy", "drift", "credit"])
def test_unlabeled_share(stream):
    n = 5000
    events = _take(synthetic(stream, dimensions=4, margin=0.1, noise=0.05, drift_every=1000, seed=2, unlabeled=0.2), n)
    unlabeled = sum("y" not in e for e in events)
    assert within_binomial(unlabeled, n, 0.2), unlabeled
    assert all(e.get("y", 1) in (-1, 1) for e in events)


@pytest.mark.parametrize("stream", ["separable", "noisy", "drift", "credit"])
def test_the_same_seed_writes_the_same_bytes(stream):
    def written(seed):
        return list(
            messages(
                load(
                    ProduceSettings,
                    [
                        "--stream",
                        stream,
                        "--count",
                        "300",
                        "--seed",
                        str(seed),
                        "--unlabeled",
                        "0.1",
                        "--drift-every",
                        "100",
                    ],
                )
            )
        )

    first = written(9)
    assert len(first) == 300 and first == written(9)
    assert first != written(10)
    key, value = first[0]
    assert key == json.loads(value)["id"].encode()


# ---------------------------------------------------------------- files


def test_a_jsonl_file_is_sent_line_by_line_as_it_is(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_bytes(b'{"x": [1.0], "y": 1}\nnot json\n\n\xff\xfe\n{"x": [1, 2], "y": 2}\r\n')
    assert list(messages(load(ProduceSettings, ["--file", str(data)]))) == [
        (None, b'{"x": [1.0], "y": 1}'),
        (None, b"not json"),
        (None, b"\xff\xfe"),
        (None, b'{"x": [1, 2], "y": 2}'),
    ]


def test_a_file_is_sent_whole_unless_count_is_given(tmp_path):
    data = tmp_path / "big.jsonl"
    data.write_text("".join(f'{{"x": [{i}], "y": 1}}\n' for i in range(10_005)))  # more than --count's default
    assert len(list(messages(load(ProduceSettings, ["--file", str(data)])))) == 10_005
    assert len(list(messages(load(ProduceSettings, ["--file", str(data), "--count", "7"])))) == 7
    assert len(list(messages(load(ProduceSettings, ["--file", str(data), "--count", "0"])))) == 10_005


# ---------------------------------------------------------------- rate limit


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        assert seconds > 0
        self.now += seconds


def test_the_rate_limit_schedules_events_at_the_rate():
    clock = FakeClock()
    limiter = RateLimiter(250.0, clock=clock, sleep=clock.sleep)
    start, times = clock(), []
    for _ in range(1000):  # four simulated seconds
        limiter.wait()
        times.append(clock())
        clock.now += 0.001  # the send itself takes a millisecond: the limiter absorbs it
    assert times[-1] - start == pytest.approx(1000 / 250)
    assert all(b - a == pytest.approx(1 / 250) for a, b in itertools.pairwise(times))


def test_the_rate_limit_does_not_burst_after_falling_behind():
    clock = FakeClock()
    limiter = RateLimiter(10.0, clock=clock, sleep=clock.sleep)
    limiter.wait()
    clock.now += 5.0  # stalled for five seconds (a GC pause, a slow broker)
    limiter.wait()
    before = clock()
    for _ in range(10):
        limiter.wait()
    assert clock() - before == pytest.approx(1.0)  # back to 10/s, not 50 events at once
    assert RateLimiter(0.0).interval == 0.0


def test_the_rate_limit_in_real_time():
    limiter, start = RateLimiter(50.0), time.monotonic()
    for _ in range(25):
        limiter.wait()
    elapsed = time.monotonic() - start
    assert 25 / 50 <= elapsed < 5.0  # sleep never returns early; the upper bound only catches a limiter gone wild


# ---------------------------------------------------------------- acknowledgements and the progress bar (no broker)


class FakeProducer:
    """Answers send i as ``outcome(i)`` says: None acknowledges, an exception fails the future,
    ("raise", exc) raises from send, "pending" never answers."""

    def __init__(self, outcome=lambda i: None):
        self.outcome, self.sent, self.topics, self.pending, self.closed = outcome, [], [], [], False
        self.created: list = []  # the specs of the topics that ensure_topics created (fake_kafka)

    def send(self, topic, key=None, value=None):
        result = self.outcome(len(self.sent))
        self.sent.append((key, value))
        self.topics.append(topic)
        if isinstance(result, tuple):
            raise result[1]
        future = Future()
        if result is None:
            future.success(len(self.sent))
        elif result == "pending":
            self.pending.append(future)
        else:
            future.failure(result)
        return future

    def flush(self, timeout=None):
        if self.pending:
            raise KafkaTimeoutError(f"flush did not finish in {timeout} s")

    def close(self, timeout=None):
        self.closed = True


@pytest.fixture
def fake_kafka(monkeypatch):
    """A FakeProducer, and topics that exist once ensured (``producer.created``: their specs), with
    ``partitions`` (topic → count) for those that exist already."""

    def install(outcome=lambda i: None, partitions=None):
        producer = FakeProducer(outcome)
        existing = dict(partitions or {})

        def ensure(settings, specs, create, timeout_s=0.0):
            for spec in specs:
                if spec.name not in existing:
                    producer.created.append(spec)
                    existing[spec.name] = spec.partitions

        monkeypatch.setattr(produce_module, "ensure_topics", ensure)
        monkeypatch.setattr(
            produce_module, "partition_counts", lambda settings, names: {n: existing.get(n, 0) for n in names}
        )
        monkeypatch.setattr(
            kafka_python_module, "make_producer", lambda settings: producer
        )  # produce's CountingProducer's
        return producer

    return install


def _settings(*args):
    return load(ProduceSettings, ["--count", "10", "--no-progress", *args])


def test_every_message_acknowledged(fake_kafka):
    producer = fake_kafka()
    assert produce(_settings()) == 10
    assert len(producer.sent) == 10 and producer.closed


def test_a_refused_message_fails_the_run_but_not_the_others(fake_kafka, capsys):
    producer = fake_kafka(lambda i: MessageSizeTooLargeError("too large") if i == 3 else None)
    with pytest.raises(ProduceError) as caught:
        produce(_settings())
    assert caught.value.status == 1 and len(producer.sent) == 10  # a refusal is about one message: carry on
    last = str(caught.value)
    assert "9 of 10 messages acknowledged" in last and "1 × MessageSizeTooLargeError" in last
    assert "--bootstrap-servers" in last


@pytest.mark.parametrize(
    "failure", [KafkaConnectionError("broker gone"), ("raise", KafkaTimeoutError("no metadata in 10 s"))]
)
def test_a_broker_failure_stops_sending(fake_kafka, capsys, failure):
    producer = fake_kafka(lambda i: failure if i >= 4 else None)
    with pytest.raises(ProduceError) as caught:
        produce(_settings())
    assert caught.value.status == 1 and len(producer.sent) == 5
    last = str(caught.value)
    assert "4 of 5 messages acknowledged" in last and "stopped sending" in last


def test_messages_left_unanswered_count_as_lost(fake_kafka, capsys):
    fake_kafka(lambda i: "pending" if i % 2 else None)
    with pytest.raises(ProduceError) as caught:
        produce(_settings())
    last = str(caught.value)
    assert "5 of 10 messages acknowledged" in last and "5 unanswered" in last


def test_the_progress_bar_on_a_terminal(fake_kafka):
    fake_kafka()
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120)
    assert produce(load(ProduceSettings, ["--count", "500"]), console=console) == 500
    text = out.getvalue()
    assert "producing to" in text and "500/500" in text and "500 acknowledged" in text


@pytest.mark.parametrize("terminal, args", [(False, []), (True, ["--no-progress"])])
def test_no_progress_bar_off_a_terminal_or_when_asked(fake_kafka, terminal, args):
    """Piped to a file or another program, rich's bar would write control codes into it."""
    fake_kafka()
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal)
    assert console.is_terminal == terminal
    assert produce(load(ProduceSettings, ["--count", "50", *args]), console=console) == 50
    assert out.getvalue() == ""


def test_a_missing_file_is_a_bad_setting(tmp_path, capsys):
    with pytest.raises(ProduceError) as caught:
        produce(load(ProduceSettings, ["--file", str(tmp_path / "nope.jsonl")]))
    assert caught.value.status == 2
    assert "invalid setting file (--file)" in str(caught.value)


def test_a_bad_csv_row_stops_the_replay_naming_the_line(fake_kafka, tmp_path, capsys):
    data = tmp_path / "d.csv"
    data.write_text("x1,y\n1,1\n2,7\n")
    fake_kafka()
    with pytest.raises(ProduceError) as caught:
        produce(load(ProduceSettings, ["--file", str(data)]))
    assert caught.value.status == 2
    last = str(caught.value)
    assert f"{data}:3:" in last and "1 of the 1 messages before it acknowledged" in last


@pytest.mark.parametrize("where", ["synthetic", "jsonl"])
def test_unlabeled_rows_without_a_csv_is_a_bad_setting(tmp_path, where):
    data = tmp_path / "d.jsonl"
    data.write_text('{"x": [1.0]}\n')
    args = ["--unlabeled-rows"] + (["--file", str(data)] if where == "jsonl" else [])
    with pytest.raises(ProduceError) as caught:
        produce(load(ProduceSettings, args))
    assert caught.value.status == 2
    assert str(caught.value).startswith("invalid setting unlabeled_rows (--unlabeled-rows)"), caught.value


def test_an_empty_label_goes_out_unlabeled_only_with_unlabeled_rows(fake_kafka, tmp_path):
    data = tmp_path / "d.csv"
    data.write_text("id,x1,y\na,1,1\nb,2,\n")
    fake_kafka()
    with pytest.raises(ProduceError) as caught:
        produce(load(ProduceSettings, ["--file", str(data), "--no-progress"]))
    assert caught.value.status == 2 and f"{data}:3: y is empty" in str(caught.value)
    producer = fake_kafka()
    assert produce(load(ProduceSettings, ["--file", str(data), "--unlabeled-rows", "--no-progress"])) == 2
    assert [json.loads(value) for _, value in producer.sent] == [
        {"id": "a", "features": {"x1": 1.0}, "y": 1},
        {"id": "b", "features": {"x1": 2.0}},
    ]


# ---------------------------------------------------------------- delayed labels: the pairs


def _paired_args(*args):
    return ["--stream", "credit", "--count", "2000", "--seed", "3", "--label-topic", "labels", *args]


def test_points_are_todays_events_without_y_and_labels_pair_up_by_id():
    args = ["--stream", "credit", "--count", "2000", "--seed", "3", "--unlabeled", "0.1", "--noise", "0.1"]
    inline = list(messages(load(ProduceSettings, args)))  # the same stream, labels inline
    pairs = list(paired_messages(load(ProduceSettings, [*args, "--label-topic", "labels", "--label-missing", "0.2"])))
    assert len(pairs) == len(inline) == 2000
    for (key, point, label), (inline_key, event) in zip(pairs, inline):
        whole = json.loads(event)
        assert key == inline_key == whole["id"].encode()  # keyed by the id, as today
        assert (
            point == json.dumps({k: v for k, v in whole.items() if k != "y"}, separators=(",", ":")).encode()
        )  # byte for byte
        if label is not None:
            assert label == json.dumps({"id": whole["id"], "y": whole["y"]}, separators=(",", ":")).encode()
    labeled = [json.loads(e) for _, e in inline if "y" in json.loads(e)]
    assert within_binomial(2000 - len(labeled), 2000, 0.1)  # the unlabeled share: no y, hence no label
    assert all(label is None for (_, _, label), (_, e) in zip(pairs, inline) if "y" not in json.loads(e))
    missing = sum(label is None for (_, _, label), (_, e) in zip(pairs, inline) if "y" in json.loads(e))
    assert within_binomial(missing, len(labeled), 0.2), (missing, len(labeled))


@pytest.mark.parametrize("share", [0.0, 0.1, 0.5, 1.0])
def test_the_missing_share_is_honoured_and_seeded(share):
    n = 5000
    events = list(itertools.islice(credit(seed=8), n))

    def labels(missing, seed=8):
        return [label for _, label in delayed_labels(events, missing=missing, seed=seed)]

    first = labels(share)
    assert first == labels(share)  # reproducible
    missing = sum(label is None for label in first)
    assert missing == {0.0: 0, 1.0: n}.get(share, missing) and within_binomial(missing, n, share), missing
    if 0 < share < 1:
        assert first != labels(share, seed=9)
        more = labels(min(1.0, share + 0.2))  # a larger share drops the same labels, and more
        assert all(a is None for a, b in zip(more, first) if b is None)


def test_a_label_without_an_id_to_join_is_refused():
    with pytest.raises(ValueError, match="id"):
        list(delayed_labels([{"x": [1.0], "y": 1}]))


# ---------------------------------------------------------------- delayed labels: the schedule


def _timeline(pairs, rate, delay, clock, stop=lambda: False, send_s=0.001):
    """(kind, key, clock time) of what the schedule hands out; each send takes ``send_s`` of the fake clock."""
    schedule = PairedSchedule(pairs, rate, delay, clock=clock, sleep=clock.sleep, should_stop=stop)
    out = []
    for kind, key, _ in schedule:
        out.append((kind, key, clock()))
        clock.now += send_s
    return out, schedule


def _pairs(n, missing=()):
    return [(f"k{i}".encode(), b"point %d" % i, None if i in missing else b"label %d" % i) for i in range(n)]


@pytest.mark.parametrize("rate, delay", [(10.0, 0.35), (10.0, 0.0), (0.0, 2.0), (200.0, 1.0), (2.0, 5.0)])
def test_each_label_goes_out_its_delay_after_its_point(rate, delay):
    clock = FakeClock()
    out, schedule = _timeline(_pairs(40, missing={3, 17}), rate, delay, clock)
    points = {key: t for kind, key, t in out if kind == POINT}
    labels = {key: t for kind, key, t in out if kind == LABEL}
    assert list(points) == [f"k{i}".encode() for i in range(40)]  # every point, in order
    assert list(labels) == [
        f"k{i}".encode() for i in range(40) if i not in (3, 17)
    ]  # every label but the missing, in order
    for key, t in labels.items():
        assert delay - 1e-9 <= t - points[key] < delay + 0.01, (
            key
        )  # on time (a send in progress may hold it a millisecond)
    times = [t for _, _, t in out]
    assert times == sorted(times) and not schedule.waiting
    if rate:
        # in their slots (a label's send just before a slot may hold a point a millisecond)
        assert all(
            b - a == pytest.approx(1 / rate, abs=0.0011) for a, b in zip(points.values(), list(points.values())[1:])
        )
    due = {key: points[key] + delay for key in labels}
    for index, (kind, key, t) in enumerate(out):  # no point goes out while a label past its time still waits
        if kind == POINT:
            gone = {k for kind_before, k, _ in out[:index] if kind_before == LABEL}
            assert {k for k, d in due.items() if d < t - 1e-9} <= gone, key


def test_rate_0_and_delay_0_interleave_point_and_label():
    clock = FakeClock()
    out, _ = _timeline(_pairs(4, missing={2}), 0.0, 0.0, clock, send_s=0.0)
    assert [(kind, key) for kind, key, _ in out] == [
        (POINT, b"k0"),
        (LABEL, b"k0"),
        (POINT, b"k1"),
        (LABEL, b"k1"),
        (POINT, b"k2"),
        (POINT, b"k3"),
        (LABEL, b"k3"),
    ]


def test_the_end_of_the_stream_waits_for_the_labels_to_come_unless_stopped():
    clock = FakeClock()
    start = clock()
    out, schedule = _timeline(_pairs(5), 0.0, 60.0, clock)
    assert [kind for kind, _, _ in out] == [POINT] * 5 + [LABEL] * 5 and out[-1][2] - start >= 60.0
    clock = FakeClock()
    out, schedule = _timeline(
        _pairs(5), 0.0, 60.0, clock, stop=lambda: clock() > 130.0
    )  # Ctrl-C half-way through the wait
    assert [kind for kind, _, _ in out] == [POINT] * 5 and len(schedule.waiting) == 5 and schedule.stopped
    assert clock() < 130.2  # noticed within a tick, not at the labels' time


# ---------------------------------------------------------------- delayed labels: produce (no broker)


def test_paired_produce_sends_points_and_labels_keyed_alike(fake_kafka):
    producer = fake_kafka(partitions={"points": 3})
    settings = load(
        ProduceSettings,
        ["--no-progress", *_paired_args("--count", "300", "--label-delay-seconds", "0", "--label-missing", "0.1")],
    )
    written = produce(settings)
    expected = list(paired_messages(settings))
    labels = sum(label is not None for _, _, label in expected)
    assert (written.points, written.labels, int(written)) == (300, labels, 300 + labels)
    assert written.line == f"wrote 300 points to points and {labels} labels to labels"
    assert [spec[:2] for spec in producer.created] == [("labels", 3)]  # --topic's count, not --partitions
    sent = list(zip(producer.topics, producer.sent))
    assert [m for t, m in sent if t == "points"] == [(key, point) for key, point, _ in expected]
    assert [m for t, m in sent if t == "labels"] == [(key, label) for key, _, label in expected if label is not None]
    seen = set()
    for topic, (key, value) in sent:  # rate 0, delay 0: each label right after its point, with its key
        if topic == "labels":
            assert key in seen and json.loads(value)["id"].encode() == key
        else:
            assert "y" not in json.loads(value)
            seen.add(key)


def test_inline_labels_are_unchanged_without_a_label_topic(fake_kafka):
    producer = fake_kafka()
    written = produce(_settings("--stream", "credit"))
    assert (written, written.points, written.labels, written.line) == (10, 10, 0, "wrote 10 messages to points")
    assert set(producer.topics) == {"points"} and all("y" in json.loads(v) for _, v in producer.sent)


def test_a_label_topic_with_another_partition_count_is_refused(fake_kafka):
    producer = fake_kafka(partitions={"points": 2, "labels": 3})
    with pytest.raises(ProduceError) as caught:
        produce(load(ProduceSettings, ["--no-progress", *_paired_args()]))
    assert caught.value.status == 2 and not producer.sent
    message = str(caught.value)
    assert "invalid setting label_topic (--label-topic)" in message and "labels has 3 partition(s)" in message
    assert "points (--topic) has 2" in message and "nothing was written" in message


def test_lost_labels_fail_the_run_naming_both_topics(fake_kafka):
    fake_kafka(
        lambda i: MessageSizeTooLargeError("too large") if i % 2 else None
    )  # delay 0, rate 0: every label refused
    with pytest.raises(ProduceError) as caught:
        produce(load(ProduceSettings, ["--no-progress", *_paired_args("--count", "10", "--label-delay-seconds", "0")]))
    message = str(caught.value)
    assert caught.value.status == 1
    assert "10 of 10 points on topic points and 0 of 10 labels on topic labels acknowledged" in message
    assert "10 × MessageSizeTooLargeError" in message


def test_a_stop_while_labels_wait_says_how_many_were_never_sent(fake_kafka):
    producer = fake_kafka()
    ticks: list[int] = []

    def stop_while_waiting():  # Ctrl-C a few ticks into the 30 s wait at the end
        if len(producer.sent) != 20:
            return False
        ticks.append(1)
        return len(ticks) > 3

    started = time.monotonic()
    written = produce(
        load(ProduceSettings, ["--no-progress", *_paired_args("--count", "20", "--label-delay-seconds", "30")]),
        should_stop=stop_while_waiting,
    )
    assert time.monotonic() - started < 10.0
    assert (written.points, written.labels, written.unsent_labels) == (20, 0, 20)
    assert written.line == (
        "wrote 20 points to points and 0 labels to labels; "
        "stopped with 20 more labels waiting for their time (never sent)"
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--label-topic", "labels", "--file", "events.jsonl"],
            "file (--file) and label_topic (--label-topic) cannot be combined",
        ),
        (["--label-missing", "0.1"], "label_missing (--label-missing) are only used with label_topic (--label-topic)"),
        (["--label-delay-seconds", "1"], "label_delay_seconds (--label-delay-seconds) and label_missing"),
        (["--label-topic", "points"], "label_topic (--label-topic) and topic (--topic) must be two different topics"),
        (
            ["--label-topic", "labels", "--label-delay-seconds", "-1"],
            "invalid setting label_delay_seconds (--label-delay-seconds",
        ),
        (["--label-topic", "labels", "--label-missing", "1.5"], "invalid setting label_missing (--label-missing"),
    ],
)
def test_label_settings_that_cannot_work_exit_2_at_start_up(args, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "events.jsonl").write_text('{"id": "a", "x": [1.0], "y": 1}\n')
    assert main(["produce", "--bootstrap-servers", "127.0.0.1:1", *args]) == 2  # before connecting to anything
    assert message in capsys.readouterr().err


def test_label_settings_defaults():
    s = load(ProduceSettings, [])
    assert (s.label_topic, s.label_delay_seconds, s.label_missing) == (None, 5.0, 0.0)


def test_a_csv_with_a_byte_order_mark_sends_its_first_column_by_its_name(fake_kafka, tmp_path):
    data = tmp_path / "excel.csv"
    data.write_bytes("\ufeffage,salary,y\r\n31,52000,1\r\n".encode())
    producer = fake_kafka()
    assert produce(load(ProduceSettings, ["--file", str(data), "--no-progress"])) == 1
    assert json.loads(producer.sent[0][1]) == {"features": {"age": 31.0, "salary": 52000.0}, "y": 1}
    assert produce(load(ProduceSettings, ["--file", str(data), "--no-progress", "--dense"])) == 1
    assert json.loads(producer.sent[1][1]) == {"x": [31.0, 52000.0], "y": 1}


def test_a_csv_of_another_separator_is_refused_before_anything_is_sent_and_one_without_y_is_said_unlabeled(
    fake_kafka, tmp_path
):
    data = tmp_path / "d.csv"
    data.write_text("age;salary;y\n31;52000;1\n")
    producer = fake_kafka()
    with pytest.raises(ProduceError) as caught:
        produce(load(ProduceSettings, ["--file", str(data), "--no-progress"]))
    assert caught.value.status == 2 and "separated by ';' (semicolon)" in str(caught.value) and producer.sent == []
    data.write_text("age,salary,label\n31,52000,1\n")
    out = io.StringIO()
    assert produce(load(ProduceSettings, ["--file", str(data), "--no-progress"]), console=Console(file=out)) == 1
    assert "has no y column (its columns: age, salary, label): its rows are sent unlabeled" in out.getvalue()
