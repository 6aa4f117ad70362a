"""`perceptron-stream produce`: the synthetic streams keep their promises, files replay as they are,
the rate and the progress bar behave, and only acknowledged messages count.

Statistical checks use a tolerance of Z binomial standard deviations: with the
seeds fixed they are deterministic, and a change of generator fails them only
when it drifts from the promised rate (chance of a false alarm ~6e-5 each).
"""

import io
import itertools
import json
import math
import time

import pytest
from kafka.errors import KafkaConnectionError, KafkaTimeoutError, MessageSizeTooLargeError
from kafka.future import Future
from rich.console import Console

import service.produce as produce_module
from service.config import ProduceSettings, load
from service.produce import Deliveries, ProduceError, RateLimiter, messages, produce
from service.streams import POLICIES, bank_score, credit, separable, separator, synthetic
from tests.conftest import consume

Z = 4.0


def _take(events, n):
    return list(itertools.islice(events, n))


def _sign(v: float) -> int:
    return 1 if v > 0 else -1


def _distance(w, b, x):
    return sum(p * q for p, q in zip(w, x)) + b


def _within_binomial(k: int, n: int, p: float) -> bool:
    return abs(k - n * p) <= Z * math.sqrt(n * p * (1 - p))


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
    events = _take(synthetic("noisy", dimensions=3, margin=0.05, noise=noise, drift_every=5000, seed=5, unlabeled=0.0), n)
    w, b = separator(dimensions=3, margin=0.05, seed=5)(0)
    flips = sum(e["y"] != _sign(_distance(w, b, e["x"])) for e in events)
    assert _within_binomial(flips, n, noise), (flips, n * noise)
    assert all(abs(_distance(w, b, e["x"])) >= 0.05 for e in events)  # noise flips labels, it does not move points


def test_drift_stream_turns_the_separator_every_drift_every_events():
    drift = 1000
    events = _take(synthetic("drift", dimensions=5, margin=0.1, noise=0.0, drift_every=drift, seed=7, unlabeled=0.0), 3 * drift)
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
    assert accuracy(events[drift:2 * drift]) < 0.7  # about a coin toss after a quarter turn
    assert accuracy(events[2 * drift:]) < 0.3  # half a turn: mostly wrong


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
    assert rich_and_debt_free.count(1) / len(rich_and_debt_free) > 0.9 > 0.1 > poor_and_indebted.count(1) / len(poor_and_indebted)
    old_policy_wrong = sum(_sign(bank_score(e["features"], POLICIES[0])) != e["y"] for e in events[drift:]) / (2 * drift)
    assert old_policy_wrong > 0.05  # the policy really changed at drift_every


def test_credit_noise_flips_the_share_of_labels_asked_for():
    n = 10_000
    events = _take(credit(noise=0.1, seed=4, drift_every=n), n)
    flips = sum(e["y"] != _sign(bank_score(e["features"], POLICIES[0])) for e in events)
    assert _within_binomial(flips, n, 0.1), flips


@pytest.mark.parametrize("stream", ["separable", "noisy", "drift", "credit"])
def test_unlabeled_share(stream):
    n = 5000
    events = _take(synthetic(stream, dimensions=4, margin=0.1, noise=0.05, drift_every=1000, seed=2, unlabeled=0.2), n)
    unlabeled = sum("y" not in e for e in events)
    assert _within_binomial(unlabeled, n, 0.2), unlabeled
    assert all(e.get("y", 1) in (-1, 1) for e in events)


@pytest.mark.parametrize("stream", ["separable", "noisy", "drift", "credit"])
def test_the_same_seed_writes_the_same_bytes(stream):
    def written(seed):
        return list(messages(load(ProduceSettings, ["--stream", stream, "--count", "300", "--seed", str(seed),
                                                    "--unlabeled", "0.1", "--drift-every", "100"])))

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
        (None, b'{"x": [1.0], "y": 1}'), (None, b"not json"), (None, b"\xff\xfe"), (None, b'{"x": [1, 2], "y": 2}')]


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
    assert all(b - a == pytest.approx(1 / 250) for a, b in zip(times, times[1:]))


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
        self.outcome, self.sent, self.pending, self.closed = outcome, [], [], False

    def send(self, topic, key=None, value=None):
        result = self.outcome(len(self.sent))
        self.sent.append((key, value))
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
    def install(outcome=lambda i: None):
        producer = FakeProducer(outcome)
        monkeypatch.setattr(produce_module, "ensure_topics", lambda *a, **k: None)
        monkeypatch.setattr(produce_module, "make_producer", lambda settings: producer)
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


@pytest.mark.parametrize("failure", [KafkaConnectionError("broker gone"), ("raise", KafkaTimeoutError("no metadata in 10 s"))])
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


def test_deliveries_count_from_another_thread():
    import threading

    deliveries = Deliveries()
    threads = [threading.Thread(target=lambda: [deliveries.ok() for _ in range(10_000)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert deliveries.acknowledged == 40_000 and not deliveries.broken


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


# ---------------------------------------------------------------- end to end, on the embedded broker

@pytest.mark.integration
def test_jsonl_replay_passes_malformed_lines_for_the_service_to_dead_letter(broker, topics, tmp_path):
    lines = [b'{"id": "a", "x": [1.0, 2.0], "y": 1}', b"not json", b"\xff\xfe not utf-8", b'{"x": [1, 2], "y": 2}',
             b'{"x": [NaN]}', b'{"features": {"age": 31}}']
    data = tmp_path / "d.jsonl"
    data.write_bytes(b"\n".join(lines) + b"\n\n")
    topic = topics["input_topic"]
    assert produce(load(ProduceSettings, ["--bootstrap-servers", broker.bootstrap_servers, "--topic", topic, "--file", str(data)])) == 6
    records = consume(broker.bootstrap_servers, topic, len(lines))
    assert [r.value for r in records] == lines and {r.key for r in records} == {None}


@pytest.mark.integration
def test_the_same_seed_writes_the_same_records(broker, topics):
    def run(topic):
        args = ["--bootstrap-servers", broker.bootstrap_servers, "--topic", topic, "--stream", "drift", "--count", "400",
                "--drift-every", "100", "--unlabeled", "0.1", "--seed", "5"]
        assert produce(load(ProduceSettings, args)) == 400
        return [(r.key, r.value) for r in consume(broker.bootstrap_servers, topic, 400)], list(messages(load(ProduceSettings, args)))

    (first, expected), (second, _) = run(topics["input_topic"]), run(topics["output_topic"])
    assert first == second == expected
