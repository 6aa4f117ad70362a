"""The application's retry policy and state checks, as pure code: what is retried and what stops the service."""

from __future__ import annotations

import pytest
from perceptron_stream.app import Application, StartupError
from perceptron_stream.config import ConfigError, ServeSettings, load
from perceptron_stream.kafka import DeliveryError, KafkaFatal, KafkaUnavailable, Record
from perceptron_stream.kafka.errors import service_error
from perceptron_stream.runtime.retry import Retry


@pytest.fixture
def app():
    return Application(load(ServeSettings, ["--metrics-port", "0"]))


@pytest.mark.parametrize("error", ["TopicAuthorizationFailedError", "SaslAuthenticationFailedError"])
def test_errors_no_retry_can_cure_stop_the_service_naming_them(app, error):
    import kafka.errors

    calls = []

    def denied():
        calls.append(1)
        raise service_error(getattr(kafka.errors, error)("denied"))  # as the clients translate it

    with pytest.raises(StartupError, match=f"could not check the topics: {error}.*retrying cannot help"):
        app.retry.until_it_works(denied, "check the topics")
    assert len(calls) == 1


def test_the_clients_errors_are_classified_once():
    import kafka.errors

    assert isinstance(service_error(kafka.errors.TopicAuthorizationFailedError("no")), KafkaFatal)
    assert isinstance(service_error(kafka.errors.KafkaConnectionError("away")), KafkaUnavailable)
    timeout = service_error(kafka.errors.KafkaTimeoutError("slow"))
    assert isinstance(timeout, KafkaUnavailable) and timeout.timed_out
    assert not service_error(kafka.errors.RebalanceInProgressError("busy")).timed_out


def test_a_broker_away_is_retried_until_it_answers(app):
    answers = iter([KafkaUnavailable("away"), KafkaUnavailable("away"), "ok"])

    def flaky():
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    app.health.broker_ok = True  # reachable before: the outage must show on /readyz
    assert app.retry.until_it_works(flaky, "reach the brokers") == "ok"
    assert app.health.broker_ok is False  # the outage showed on /readyz meanwhile


def test_once_marks_an_outage_only_when_the_call_timed_out_or_probed(app):
    retry = Retry(app.health, lambda: False)

    def busy():
        raise KafkaUnavailable("RebalanceInProgressError: busy")

    app.health.broker_ok = True
    assert retry.once(busy, "commit") == (False, None) and app.health.broker_ok
    assert retry.once(busy, "probe", probe=True) == (False, None) and not app.health.broker_ok


class DeniedStream:
    """The stream of a client whose permissions were taken away after start-up."""

    def __init__(self, where: str):
        self.where, self.calls = where, 0

    def _maybe_deny(self, name: str):
        if name == self.where:
            self.calls += 1
            raise KafkaFatal("TopicAuthorizationFailedError: denied")

    def poll(self, timeout_ms, max_records):
        self._maybe_deny("poll")
        return []

    def commit(self, positions, timeout_s):
        self._maybe_deny("commit")

    def lag(self, timeout_s, ask_broker):
        self._maybe_deny("lag")
        return {}

    def assignment(self):
        return [("points", 0)]


@pytest.mark.parametrize(
    "where,what",
    [
        ("poll", "could not read points in group perceptron-stream"),
        ("commit", "could not commit offsets of group perceptron-stream"),
        ("lag", "could not read the end offsets for the lag"),
    ],
)
def test_errors_no_retry_can_cure_stop_the_running_loop_too(app, where, what):
    stream = DeniedStream(where)
    loop = app.attach(stream)
    app.tasks.group.positions[("points", 0)] = 5  # a batch acknowledged (no store before start-up): to be committed
    app.checkpointer.acknowledged(app.tasks.all())
    assert app.checkpointer.pending_commit()
    app.assignments.guard.passed = True
    with pytest.raises(StartupError, match=f"{what}: TopicAuthorizationFailedError.*retrying cannot help"):
        loop.run()  # the loop alone, on a stream with no broker behind it: run() would start up first
    assert stream.calls == 1  # at once, not retried every half second


# -- the model's bounds in its checkpoints (issue 12) ----------------------------


def _app_on(store_dir, *args):
    """An application wired to a local store, with no broker: its positions are taken to lie in the logs."""
    from perceptron_stream.runtime.startup import Opened
    from perceptron_stream.state.checkpoint import Owner
    from perceptron_stream.state.local import LocalStore

    app = Application(load(ServeSettings, ["--metrics-port", "0", "--state-dir", str(store_dir), *args]))
    s = app.settings
    app.wire(Opened(Owner(s.group_id, s.input_topic), store=LocalStore(store_dir, s.group_id)))
    app.restorer._positions_in_logs = lambda task, cp: True  # type: ignore[method-assign]  # noqa: SLF001 — no broker to read the logs' ranges from; nothing public stands in
    app.restorer._refuse_stale = lambda task, cp: True  # type: ignore[method-assign]  # noqa: SLF001 — nor the group's committed offsets
    return app


def _restore(app) -> bool:
    """The group's model restored from the store, as start-up restores it."""
    return app.restorer.restore(app.tasks.group)


def _save(app, seq=1):
    from perceptron_stream.state.checkpoint import Checkpoint

    app.store.save(
        Checkpoint(
            seq=seq,
            positions={("points", 0): 5},
            model=app.learner.to_state(),
            meta=app.tasks.group.meta,
            created=1.0,
            owner=app.tasks.group.owner,
        )
    )


@pytest.mark.parametrize(
    "then, said",
    [
        (["--max-model-features", "1000"], "max_model_features was 3, now 1000"),
        (["--max-model-features", "3", "--hash-features", "2"], "hash_features was 0, now 2"),
    ],
)
def test_a_checkpoint_of_other_bounds_is_refused(tmp_path, then, said):
    first = _app_on(tmp_path, "--max-model-features", "3")
    first.learner.step({"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0}, 1)
    _save(first)
    with pytest.raises(ConfigError, match=f"other model settings \\({said}\\)"):  # one policy per group: exit 2
        _restore(_app_on(tmp_path, *then))


def test_a_restored_checkpoint_keeps_its_dropped_count_and_cap(tmp_path):
    first = _app_on(tmp_path, "--max-model-features", "3", "--standardize")
    first.learner.step({"a": 1.0, "b": 1.0, "c": 1.0, "d": 1.0, "e": 1.0}, 1)
    _save(first)
    second = _app_on(tmp_path, "--max-model-features", "3", "--standardize")
    assert _restore(second)
    assert (second.learner.dropped_features, second.learner.max_features) == (2, 3)
    assert second.learner.to_state() == first.learner.to_state()


def test_a_checkpoint_from_before_the_bounds_gets_todays_cap(tmp_path):
    old = _app_on(tmp_path, "--max-model-features", "0")
    old.learner.step({"a": 1.0, "b": 1.0, "c": 1.0}, 1)
    state = old.learner.to_state()
    del state["max_features"], state["counters"]["dropped_features"]  # as written before the cap existed
    old.tasks.group.learner = type(old.learner).from_state(state)
    meta = dict(old.tasks.group.meta)
    del meta["max_model_features"], meta["hash_features"]
    old.tasks.group.meta = meta
    _save(old)
    app = _app_on(tmp_path, "--max-model-features", "2")
    assert _restore(app)
    assert (app.learner.max_features, sorted(app.learner.weights)) == (2, ["a", "b", "c"])
    app.learner.step({"a": 1.0, "z": 1.0}, -1)  # over its cap: it keeps its features and adds none
    assert (sorted(app.learner.weights), app.learner.dropped_features) == (["a", "b", "c"], 1)
    with pytest.raises(ConfigError, match="hash_features was 0, now 2"):  # a bad setting: exit 2
        _restore(_app_on(tmp_path, "--max-model-features", "2", "--hash-features", "2"))


def test_one_key_policy_per_group_is_a_setting_and_start_over_signs_a_new_model(tmp_path, monkeypatch):
    """A signed group's checkpoint read without a key, and a store none of whose checkpoints passes this instance's
    key: a bad setting naming checkpoint_key (exit 2), nothing restored; with --start-over, a new model whose
    checkpoints supersede the unsigned ones."""
    key = "0123456789abcdef0123456789abcdef"
    signed = _app_on(tmp_path / "signed")
    signed.store.key = key.encode()
    _save(signed, seq=4)
    with pytest.raises(ConfigError, match=r"invalid setting checkpoint_key .*checkpoint 4 of model is signed"):
        _restore(_app_on(tmp_path / "signed"))  # no key

    _save(_app_on(tmp_path / "unsigned"), seq=7)
    monkeypatch.setenv("PERCEPTRON_STREAM_CHECKPOINT_KEY", key)
    keyed = _app_on(tmp_path / "unsigned")
    keyed.store.key = key.encode()
    with pytest.raises(ConfigError, match=r"invalid setting checkpoint_key .*runs without --checkpoint-key"):
        _restore(keyed)
    over = _app_on(tmp_path / "unsigned", "--start-over")
    over.store.key = key.encode()
    assert not _restore(over)  # a new model...
    assert over.tasks.group.seq == 7 and over.tasks.group.started_over  # ...whose next checkpoint is number 8


class AwayStream(DeniedStream):
    """A stream that hands over one batch, then whose brokers never acknowledge its outputs, until a stop."""

    def __init__(self, app):
        super().__init__("")
        self.app, self.handed = app, False

    def poll(self, timeout_ms, max_records):
        if self.handed:
            return []
        self.handed = True
        return [[Record("points", 0, 0, None, b'{"x": [1.0, 2.0], "y": 1}', 0)]]

    def send(self, topic, key, value):
        pass

    def flush(self, timeout_s):
        self.app.stop()  # SIGTERM while the brokers are away
        raise DeliveryError("1 message not acknowledged")

    def pause(self, partitions):
        pass

    def resume(self, partitions):
        pass


def test_a_stop_while_the_brokers_never_acknowledged_the_batch_exits_with_an_error(app):
    """Work left undone (a batch learned and published, its outputs unacknowledged, no checkpoint): exit 0 would
    tell the orchestrator all was well."""
    loop = app.attach(AwayStream(app))
    app.assignments.guard.passed = True
    with pytest.raises(StartupError, match="stopped while the brokers had not acknowledged the batch's outputs"):
        loop.run()  # the loop alone, on a stream with no broker behind it
